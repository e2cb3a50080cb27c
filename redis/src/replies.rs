//! Reading a sink's pipeline replies: which failed the pipeline, and who
//! holds a key the owner check refused.

use redis::Value;

use crate::error::Error;
use crate::schema::RecordHeader;
use crate::stats::SinkStats;
use crate::target::RedisTarget;

/// The first server error among a pipeline's replies, as an error.
///
/// `WRONGTYPE` is not one: of the commands a sink sends only `SADD`/`SREM`
/// of the registry can get it (`SET` replaces any type, the scripts read
/// with `pcall`), and a registry of the wrong type is not a connection
/// problem that reconnecting would fix. It is counted and logged once
/// ([`SinkStats::registry_errors`]); the records are written all the same.
pub(crate) fn check_replies(
    target: &RedisTarget,
    replies: &[Value],
    stats: &SinkStats,
) -> Result<(), Error> {
    for reply in replies {
        if let Value::ServerError(e) = reply {
            if e.code() == "WRONGTYPE" {
                stats.registry_refused(target, &format!("{e:?}"));
                continue;
            }
            let error: redis::RedisError = e.clone().into();
            return Err(target.error("cannot write engines", &error));
        }
    }
    Ok(())
}

/// The `writer_pid` in a record header (0 if too short to hold one).
pub fn holder_pid(header: &[u8]) -> u32 {
    let at = core::mem::offset_of!(RecordHeader, writer_pid);
    header
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}
