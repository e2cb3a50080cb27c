//! The one error type of this crate. Every message says what to do next.

use std::io;
use std::path::PathBuf;

/// Errors from creating, opening and validating engine-state files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine id is not a valid file name / key suffix.
    #[error(
        "invalid engine id {id:?}: {reason}; use 1 to 63 characters of [A-Za-z0-9._-], not starting \
         with '.' (set AGENTIC_WORKER_ID or pass engine_id)"
    )]
    InvalidEngineId {
        /// The refused id, escaped for display.
        id: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A system call on a path failed.
    #[error("could not {action} {}: {io}{hint}", path.display())]
    Io {
        /// What was being done ("open", "create", "map", ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        io: io::Error,
        /// A hint on what to do, possibly empty.
        hint: &'static str,
    },
    /// The file does not start with the engine-state magic.
    #[error(
        "{} is not an engine-state file (bad magic); remove it from the engine-state directory",
        path.display()
    )]
    NotEngineState {
        /// The foreign file.
        path: PathBuf,
    },
    /// A directory entry that readers refuse to open: a symbolic link (never
    /// followed), a FIFO, socket, device or directory (opening those can block
    /// or has side effects), or a name that is not UTF-8 (so no engine id).
    #[error(
        "{what}: {}; engine-state opens only regular files named after an engine id, and \
         never follows links: remove it from the engine-state directory",
        path.display()
    )]
    RefusedEntry {
        /// The entry.
        path: PathBuf,
        /// What it is: "symbolic link, not followed", "not a regular file (a FIFO)", ...
        what: String,
    },
    /// The file has a layout version this build does not know.
    #[error(
        "{} has layout version {found}, but this build reads version {supported}; upgrade \
         engine-state on this side (or downgrade the writer) so both use the same layout",
        path.display()
    )]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build supports.
        supported: u32,
    },
    /// The file is shorter or longer than a layout-version-1 file.
    #[error(
        "{} is {size} bytes, but an engine-state file is {expected} bytes (truncated, or not an \
         engine-state file); remove it (a restarted publisher creates a new one)",
        path.display()
    )]
    WrongSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The size of a valid file.
        expected: u64,
    },
    /// The header is inconsistent with layout version 1.
    #[error(
        "{} has a corrupt header ({what}); remove it (a restarted publisher creates a new one)",
        path.display()
    )]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Another live process already publishes this engine id.
    #[error(
        "engine id {engine_id:?} is already published by a live process (pid {pid} in its \
         namespace) at {}; give this engine another id (AGENTIC_WORKER_ID) or stop the other \
         publisher",
        path.display()
    )]
    AlreadyPublished {
        /// The contested id.
        engine_id: String,
        /// The live file.
        path: PathBuf,
        /// The other writer's pid, as recorded in its header.
        pid: u32,
    },
    /// Another live process publishes this engine id, but its file was
    /// truncated or grown under it (so its header cannot be read). That
    /// writer's heartbeat thread replaces the file within a few periods.
    #[error(
        "engine id {engine_id:?} is published by a live process, but its file {} is {size} bytes \
         instead of {expected} (another process truncated it); that publisher replaces the file \
         within a few heartbeat periods; give this engine another id (AGENTIC_WORKER_ID) or stop \
         the other publisher",
        path.display()
    )]
    LiveFileWrongSize {
        /// The contested id.
        engine_id: String,
        /// The live writer's file.
        path: PathBuf,
        /// Its size now.
        size: u64,
        /// The size of a valid file.
        expected: u64,
    },
    /// A cache digest file that cannot be used (docs/FORMAT.md, "Cache
    /// residency"); [`DigestError::kind`] classifies it.
    #[error("cache digest {}: {error}", path.display())]
    Digest {
        /// The digest file.
        path: PathBuf,
        /// What is wrong with it.
        error: DigestError,
    },
    /// A router replica's reservations file that cannot be used
    /// (docs/FORMAT.md, "Shared reservations"); [`RouterError::kind`]
    /// classifies it.
    #[error("router reservations {}: {error}", path.display())]
    Router {
        /// The replica's file.
        path: PathBuf,
        /// What is wrong with it.
        error: RouterError,
    },
    /// Another live process already writes this router replica's file.
    #[error(
        "router replica id {replica_id:?} is already used by a live process (pid {pid} in its \
         namespace) at {}; give this router another replica id or stop the other router",
        path.display()
    )]
    ReplicaInUse {
        /// The contested replica id.
        replica_id: String,
        /// The live file.
        path: PathBuf,
        /// The other writer's pid, as recorded in its header (0: unreadable).
        pid: u32,
    },
    /// A router replica's writer was asked to hold reservations on more
    /// engines than its file's capacity.
    #[error(
        "router replica {replica_id:?} cannot hold reservations on engine {engine_id:?}: its file \
         already holds {capacity} engines, the most it can (MAX_ROUTER_ENGINES); remove \
         engines the router no longer uses, or split the engines among more routers"
    )]
    RouterCapacity {
        /// The replica.
        replica_id: String,
        /// The engine that did not fit.
        engine_id: String,
        /// The file's capacity.
        capacity: usize,
    },
    /// A digest writer was asked for more entries than its capacity or the
    /// format's limit.
    #[error(
        "a cache digest of {count} entries does not fit its capacity of {capacity} (at most          {max}); cut it with cut_prefix_closed, or create the digest with a larger capacity",
        max = crate::digest_layout::MAX_DIGEST_ENTRIES
    )]
    DigestCapacity {
        /// Entries asked for.
        count: usize,
        /// The capacity (or the capacity asked for, when that is over the limit).
        capacity: usize,
    },
}

/// What is wrong with a cache digest (docs/FORMAT.md, "Cache residency"),
/// read from its file or decoded from its Redis value. [`DigestError::kind`]
/// is its error class (the golden vectors', `format/vectors/cache`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DigestError {
    /// The first 8 bytes are not `ESDIGEST` (or there are fewer than 8).
    #[error("not a cache digest (bad magic); remove it from the cache directory")]
    NotDigest,
    /// A digest layout version this build does not know.
    #[error(
        "digest layout version {found}, but this build reads version {supported}; upgrade          engine-state on this side (or downgrade the writer) so both use the same layout",
        supported = crate::digest_layout::DIGEST_LAYOUT_VERSION
    )]
    UnknownVersion {
        /// The version found.
        found: u32,
    },
    /// A file or value whose size does not match its header's capacity or
    /// count (or too short to hold a header).
    #[error(
        "{size} bytes, but its header says {expected} (truncated, or not a cache digest);          remove it (a restarted publisher creates a new one)"
    )]
    WrongSize {
        /// Its size.
        size: u64,
        /// The size its header implies.
        expected: u64,
    },
    /// A digest whose header or contents break the format's rules (sizes,
    /// state, capacity, `count > capacity`, entries not strictly ascending,
    /// more than `MAX_DIGEST_ENTRIES`).
    #[error("corrupt cache digest ({what}); remove it (a restarted publisher creates a new one)")]
    Corrupt {
        /// What is wrong.
        what: String,
    },
    /// No consistent copy within the seqlock's retry bound (a write was in
    /// progress at every attempt, or the writer died in one): try again later.
    #[error("cache digest torn (a write was in progress, sequence {}); read it again later", .0.last_seq)]
    Torn(crate::seqlock::Torn),
}

impl DigestError {
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn corrupt(what: String) -> DigestError {
        DigestError::Corrupt { what }
    }

    /// The error class: `not_digest`, `unknown_version`, `wrong_size`,
    /// `corrupt_cache` or `torn`.
    pub fn kind(&self) -> &'static str {
        match self {
            DigestError::NotDigest => "not_digest",
            DigestError::UnknownVersion { .. } => "unknown_version",
            DigestError::WrongSize { .. } => "wrong_size",
            DigestError::Corrupt { .. } => "corrupt_cache",
            DigestError::Torn(_) => "torn",
        }
    }
}

/// What is wrong with a router replica's reservations (docs/FORMAT.md,
/// "Shared reservations"), read from its file or decoded from its Redis
/// value: a per-peer error. [`RouterError::kind`] is its error class.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RouterError {
    /// The first 8 bytes are not `ESROUTER` (a shorter file is
    /// [`RouterError::WrongSize`]).
    #[error("not a router reservations file (bad magic); remove it from the routers directory")]
    NotRouter,
    /// A reservations layout version this build does not know.
    #[error(
        "router reservations layout version {found}, but this build reads version {supported}; \
         upgrade engine-state on this side (or downgrade that router) so both use the same layout",
        supported = crate::router_layout::ROUTER_LAYOUT_VERSION
    )]
    UnknownVersion {
        /// The version found.
        found: u32,
    },
    /// A file or value whose size does not match its header (or too short to
    /// hold one).
    #[error(
        "{size} bytes, but its header says {expected} (truncated, or not a router reservations \
         file); remove it (a restarted router creates a new one)"
    )]
    WrongSize {
        /// Its size.
        size: u64,
        /// The size its header implies.
        expected: u64,
    },
    /// A header or contents that break the format's rules (sizes, state,
    /// capacity, replica id, `count > capacity`, an invalid or duplicate
    /// engine id in a live slot, nonzero padding).
    #[error(
        "corrupt router reservations ({what}); ignore this replica until its router restarts \
         (remove the file if no router runs under that id)"
    )]
    Corrupt {
        /// What is wrong.
        what: String,
    },
    /// No consistent copy within the seqlock's retry bound (a write was in
    /// progress at every attempt, or the writer died in one): try again later.
    #[error(
        "router reservations torn (a write was in progress, sequence {}); read them again later",
        .0.last_seq
    )]
    Torn(crate::seqlock::Torn),
}

impl RouterError {
    pub(crate) fn corrupt(what: String) -> RouterError {
        RouterError::Corrupt { what }
    }

    /// The error class: `not_router`, `unknown_version`, `wrong_size`,
    /// `corrupt_router` or `torn`.
    pub fn kind(&self) -> &'static str {
        match self {
            RouterError::NotRouter => "not_router",
            RouterError::UnknownVersion { .. } => "unknown_version",
            RouterError::WrongSize { .. } => "wrong_size",
            RouterError::Corrupt { .. } => "corrupt_router",
            RouterError::Torn(_) => "torn",
        }
    }
}

/// The action of a reader opening an engine file (its permission hint is about
/// read access, not write access).
pub(crate) const OPEN_FOR_READING: &str = "open for reading";

impl Error {
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, io: io::Error) -> Error {
        let hint = match io.kind() {
            io::ErrorKind::NotFound if action == "read directory" => {
                "; create it, or point AGENTIC_ENGINE_STATE_URI / --uri at the directory the \
                 engines publish into"
            }
            io::ErrorKind::NotFound => "; check the path (AGENTIC_ENGINE_STATE_URI / --uri)",
            _ if action == "use as a directory" => {
                "; remove that file, or point AGENTIC_ENGINE_STATE_URI / --uri at a directory"
            }
            io::ErrorKind::PermissionDenied if action == OPEN_FOR_READING => {
                "; a reader needs read access to the engine files: run it as a user that may read \
                 them, or have the publishers create them readable by others \
                 (AGENTIC_ENGINE_STATE_FILE_MODE=644)"
            }
            io::ErrorKind::PermissionDenied => {
                "; run as a user that may write there, or choose another directory \
                 (AGENTIC_ENGINE_STATE_URI / --uri)"
            }
            _ if io.raw_os_error() == Some(nix::libc::ENOSPC) => {
                "; the shared-memory filesystem is full: free space in it or enlarge it"
            }
            _ => "",
        };
        Error::Io {
            action,
            path: path.into(),
            io,
            hint,
        }
    }
}
