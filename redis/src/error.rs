//! The one error type of the Redis crate.

/// What went wrong with a Redis URI, server or record.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The `redis://` URI cannot be parsed.
    #[error("bad engine-state URI {uri:?}: {reason}")]
    BadUri {
        /// The URI, password hidden.
        uri: String,
        /// What is wrong and which forms work.
        reason: String,
    },
    /// Talking to Redis failed (unreachable, refused, wrong password, ...).
    #[error("Redis at {uri}: {error}; {hint}")]
    Redis {
        /// The URI, password hidden.
        uri: String,
        /// What Redis or the network said (never contains the password).
        error: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// A key in the engine-state namespace of Redis holds something that is
    /// not an engine-state record (one engine's error).
    #[error(
        "Redis key {key:?} does not hold an engine-state record ({what}); delete it, or give \
         this fleet its own key prefix (?prefix=... in the URI)"
    )]
    ForeignValue {
        /// The key.
        key: String,
        /// What is wrong with the value.
        what: String,
    },
    /// A Redis record whose key's expiry does not match it, so its age cannot
    /// be told (one engine's error): never read as "written just now".
    #[error(
        "Redis key {key:?} holds an engine-state record whose age cannot be told: {what}; it is \
         not used. Delete the key (engine-state writers always SET it with PX ttl_ms, and a live \
         writer writes it again within a period)"
    )]
    NoExpiry {
        /// The key.
        key: String,
        /// What is wrong with its expiry.
        what: String,
    },
    /// A Redis record has a layout version this build does not know (one
    /// engine's error).
    #[error(
        "Redis key {key:?} has layout version {found}, but this build reads version {supported}; \
         upgrade engine-state on this side (or downgrade the writer) so both use the same layout"
    )]
    UnknownVersion {
        /// The key.
        key: String,
        /// The version in the record.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
    /// A router replica's value whose contents break the format's rules (a
    /// bad state, too many slots, an invalid or duplicate engine id, nonzero
    /// padding): that replica's error.
    #[error(
        "Redis key {key:?} holds corrupt router reservations ({what}); this replica is ignored \
         until its router writes a good value (delete the key if no router runs under that id)"
    )]
    CorruptRouter {
        /// The key.
        key: String,
        /// What is wrong with the value.
        what: String,
    },
    /// Another live writer holds this router replica's key.
    #[error(
        "router replica id {replica_id:?} is already used by a live process (pid {holder_pid} on \
         its host) at Redis key {key:?}; give this router another replica id or stop the other \
         router (a killed router's key expires ttl_ms after its last write)"
    )]
    ReplicaInUse {
        /// The contested replica id.
        replica_id: String,
        /// The replica's key.
        key: String,
        /// The holder's pid on its host, from its value.
        holder_pid: u32,
    },
}

impl Error {
    /// True when the credentials or permissions are wrong (retrying will not help).
    pub fn is_auth_error(&self) -> bool {
        matches!(self, Error::Redis { hint, .. } if hint.starts_with("check the user")
            || hint.starts_with("give this Redis user"))
    }
}
