//! What a sink writes: one op per engine.

use std::sync::Arc;
use std::time::Duration;

use crate::schema::RedisRecord;

/// One pending write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkOp {
    /// `SET <prefix>engine:<id> <record> PX <ttl>` (and register the id).
    Set(RedisRecord),
    /// `DEL` the key and remove the id from the registry (a clean close).
    Delete,
}

/// One write of [`crate::InlineSink`], which keeps the order its caller
/// gives for each engine (so a relay writes a digest before the record that
/// names its version, and after the delete of its own record of the
/// engine's previous run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayWrite {
    /// A record or a delete (a delete also deletes the engine's cache
    /// digest key, once a digest of it went through the sink).
    Op(SinkOp),
    /// `SET <prefix>cache:<id> <value> PX <ttl>`, owner-checked against the
    /// engine's record: a cache digest value (`encode_digest_value`,
    /// docs/FORMAT.md, "On Redis"). From then on every record of the engine
    /// refreshes its expiry.
    Digest(Arc<[u8]>),
}

impl From<SinkOp> for RelayWrite {
    fn from(op: SinkOp) -> RelayWrite {
        RelayWrite::Op(op)
    }
}

/// Called after each acknowledged `SET` with the time from the record's
/// heartbeat stamp to the acknowledgement (same host clock).
pub type AckLagObserver = Box<dyn Fn(Duration) + Send + Sync>;
