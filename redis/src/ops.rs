//! What a sink writes: one op per engine.

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

/// Called after each acknowledged `SET` with the time from the record's
/// heartbeat stamp to the acknowledgement (same host clock).
pub type AckLagObserver = Box<dyn Fn(Duration) + Send + Sync>;
