//! A Redis writer driven by its caller's thread, for callers that wake up
//! periodically anyway (the node agent's relay loop).
//!
//! [`RedisSink`](crate::RedisSink) hands every batch to a thread of its own,
//! which then waits for the replies: two extra context switches per batch.
//! The agent writes a batch every millisecond, and on a VM each switch costs
//! tens of microseconds of CPU, so here the caller writes the pipeline itself
//! and does not wait for its replies: they are collected at the next call
//! (by then they have arrived; if not, that call waits for them, at most the
//! network timeout). Nothing but a reconnection ever runs on another thread,
//! and only while Redis is unreachable.
//!
//! While Redis is unreachable the newest op per engine is kept (bounded by
//! the number of engines) and written as one pipeline once a connection is
//! back; ops of a pipeline whose replies failed are kept the same way unless
//! a newer op for the engine replaced them. A delete followed by a record
//! (the relay's delete of its own old record before a new run of the engine
//! takes the key over) is kept as both, in that order: the record alone
//! would meet the relay's old record in the owner check.
//!
//! [`InlineSink::owner_checked`] makes it respect other writers of an
//! engine id (a direct publisher of the same id): it claims each key with
//! the owner check and leaves another live writer's key alone
//! (`crate::encoder`).
//!
//! Besides ops it writes engines' cache digest values
//! ([`RelayWrite::Digest`]), in the order given per engine: a relay queues
//! a digest before the record that names its version, so both go in one
//! pipeline, the digest first (docs/FORMAT.md, "On Redis"). What is kept
//! per engine during an outage keeps that order: a delete, the newest
//! digest, the newest record.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::encoder::{hold_for, Ownership, PipelineEncoder};
use crate::error::Error;
use crate::ops::{AckLagObserver, RelayWrite, SinkOp};
use crate::replies::check_replies;
use crate::schema::RedisRecord;
use crate::stats::{acknowledged, SinkStats};
use crate::target::RedisTarget;

type Connecting = JoinHandle<Result<redis::Connection, Error>>;

/// Writes pipelines from the caller's thread and collects their replies on
/// the next call (see the module docs).
pub struct InlineSink {
    target: RedisTarget,
    encoder: PipelineEncoder,
    con: Option<redis::Connection>,
    /// A connection attempt running on a helper thread.
    connecting: Option<Connecting>,
    /// No attempt before this.
    next_attempt: Instant,
    backoff: Backoff,
    /// Ops not yet written (no connection), per engine.
    pending: HashMap<Arc<str>, Pending>,
    /// The pipeline sent and not yet acknowledged: its ops and its command
    /// count (the encoder keeps the rest until the next pipeline begins,
    /// which is after these replies are collected).
    in_flight: Vec<(Arc<str>, RelayWrite)>,
    in_flight_commands: usize,
    /// The replies of the pipeline in flight (kept for their allocation).
    replies: Vec<redis::Value>,
    stats: SinkStats,
    on_ack_lag: Option<AckLagObserver>,
}

impl std::fmt::Debug for InlineSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineSink")
            .field("target", &self.target.to_string())
            .field("connected", &self.con.is_some())
            .field("pending", &self.pending.len())
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl InlineSink {
    /// A sink for `target`. `connection`: an already open connection (None:
    /// the first [`InlineSink::submit`] starts connecting).
    pub fn new(
        target: RedisTarget,
        connection: Option<redis::Connection>,
        on_ack_lag: Option<AckLagObserver>,
    ) -> InlineSink {
        let stats = SinkStats::default();
        stats
            .connected
            .store(connection.is_some(), Ordering::Relaxed);
        InlineSink {
            encoder: PipelineEncoder::new(&target, Ownership::Unchecked),
            target,
            con: connection,
            connecting: None,
            next_attempt: Instant::now(),
            backoff: Backoff::default(),
            pending: HashMap::new(),
            in_flight: Vec::new(),
            in_flight_commands: 0,
            replies: Vec::new(),
            stats,
            on_ack_lag,
        }
    }

    /// Respects other writers of the same engine ids: a key holding another
    /// live writer's record (a direct publisher's) is not overwritten —
    /// those records are counted in [`SinkStats::refused`] and logged on
    /// stderr once per engine — until that key expires, and a delete leaves
    /// it alone. Costs a script run per engine when its key is claimed
    /// (first write, after a gap of half of what `ttl_ms` leaves after
    /// `timeout_ms`, after a reconnect); the writes in between are plain
    /// `SET`s (see `crate::encoder`). With `timeout_ms` ≥ `ttl_ms` every
    /// write runs the script (said once on stderr).
    pub fn owner_checked(mut self) -> InlineSink {
        let (ttl, timeout) = (self.target.ttl(), self.target.timeout());
        if hold_for(ttl, timeout).is_zero() {
            // As the sink's other messages (the target prints without its
            // password).
            crate::log::warn(format_args!(
                "engine-state: {target}: timeout_ms ({timeout} ms) is not below ttl_ms ({ttl} ms), \
                 so a key cannot be held safely between two owner checks: every write runs the \
                 owner-check script (~10x the Redis CPU of a SET). Give a longer ?ttl_ms= or a \
                 shorter ?timeout_ms= (e.g. ttl_ms=2000&timeout_ms=1000)",
                target = self.target,
                timeout = timeout.as_millis(),
                ttl = ttl.as_millis(),
            ));
        }
        self.encoder = PipelineEncoder::new(&self.target, Ownership::Claimed);
        self
    }

    /// Collects the replies of the previous pipeline, then writes `ops`
    /// (emptied; [`SinkOp`]s or [`RelayWrite`]s, written in their order) and
    /// anything still pending as one pipeline, without waiting for its
    /// replies. Call it regularly, with or without ops: it also drives
    /// reconnection.
    pub fn submit<W: Into<RelayWrite>>(&mut self, ops: &mut Vec<(Arc<str>, W)>) {
        self.collect();
        if self.con.is_none() {
            self.keep(ops.drain(..).map(|(id, op)| (id, op.into())));
            self.drive_connection();
            if self.con.is_none() {
                return;
            }
        }
        if ops.is_empty() && self.pending.is_empty() {
            return;
        }
        self.encoder.begin();
        // Kept writes first, so that a newer write of the same engine in
        // `ops` is written after them.
        for (id, pending) in std::mem::take(&mut self.pending) {
            for write in pending.writes() {
                self.push_write(id.clone(), write);
            }
        }
        for (id, op) in ops.drain(..) {
            self.push_write(id, op.into());
        }
        let con = self.con.as_mut().expect("connected above");
        match con.send_packed_command(&self.encoder.request) {
            Ok(()) => self.in_flight_commands = self.encoder.commands,
            Err(e) => {
                let error = self.target.error("cannot write engines", &e);
                self.failed(error);
            }
        }
    }

    /// Appends one write to the pipeline being built.
    fn push_write(&mut self, id: Arc<str>, write: RelayWrite) {
        match &write {
            RelayWrite::Op(op) => self.encoder.push(&id, op),
            RelayWrite::Digest(value) => self.encoder.push_cache(&id, value),
        }
        self.in_flight.push((id, write));
    }

    /// Waits until everything submitted so far is acknowledged, connecting
    /// if needed, at most `timeout` (plus one network timeout); true when
    /// nothing is left.
    pub fn flush(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.next_attempt = Instant::now();
        loop {
            self.submit(&mut Vec::<(Arc<str>, RelayWrite)>::new());
            self.collect();
            if self.pending.is_empty() && self.in_flight.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The sink's counters.
    pub fn stats(&self) -> &SinkStats {
        &self.stats
    }

    /// Reads the replies of the pipeline in flight (waiting for them if they
    /// have not arrived yet, at most the network timeout).
    fn collect(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let Some(con) = self.con.as_mut() else {
            return;
        };
        // Every reply is read (the connection stays in step); the first
        // server error among them fails the pipeline.
        self.replies.clear();
        let mut result = Ok(());
        for _ in 0..self.in_flight_commands {
            match con.recv_response() {
                Ok(reply) => self.replies.push(reply),
                Err(e) => {
                    result = Err(self.target.error("cannot write engines", &e));
                    break;
                }
            }
        }
        let result = result.and_then(|()| check_replies(&self.target, &self.replies, &self.stats));
        match result {
            Ok(()) => {
                self.in_flight.clear();
                // No pipeline was begun since this one: the encoder still
                // holds its claims and the stamps of its records.
                self.encoder
                    .settle_claims(&self.replies, &self.target, &self.stats);
                acknowledged(&self.stats, self.on_ack_lag.as_ref(), &self.encoder.sent);
                self.encoder.sent.clear();
                self.backoff.succeeded();
                self.stats.succeeded();
            }
            Err(error) => self.failed(error),
        }
    }

    /// After a failed write or reply: drop the connection (its replies can
    /// no longer be matched to commands), keep the ops, back off.
    fn failed(&mut self, error: Error) {
        self.con = None;
        self.encoder.connection_lost();
        let in_flight = std::mem::take(&mut self.in_flight);
        self.keep_older(in_flight);
        self.encoder.sent.clear();
        self.stats.failed(&error);
        self.back_off();
    }

    /// No connection attempt before the backoff has passed; the next one
    /// waits twice as long (up to the cap).
    fn back_off(&mut self) {
        self.next_attempt = Instant::now() + self.backoff.failed();
    }

    /// Keeps `ops` for later, each after what is pending for its engine
    /// (see [`Pending::then`]).
    fn keep(&mut self, ops: impl IntoIterator<Item = (Arc<str>, RelayWrite)>) {
        for (id, op) in ops {
            if self.pending.entry(id).or_default().then(op) {
                self.stats.replaced.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Keeps `ops` (oldest first; an engine may appear more than once) for
    /// later, before what is pending for their engine (see
    /// [`Pending::before`]).
    fn keep_older(&mut self, ops: Vec<(Arc<str>, RelayWrite)>) {
        for (id, op) in ops.into_iter().rev() {
            self.pending.entry(id).or_default().before(op);
        }
    }

    /// Starts a connection attempt on a helper thread when one is due, and
    /// takes its connection when it has finished.
    fn drive_connection(&mut self) {
        if let Some(attempt) = self.connecting.take_if(|a| a.is_finished()) {
            let result = attempt.join().unwrap_or_else(|_| {
                Err(Error::Redis {
                    uri: self.target.to_string(),
                    error: "the connection attempt panicked".to_owned(),
                    hint: "report this as a bug",
                })
            });
            match result {
                Ok(con) => {
                    self.con = Some(con);
                    self.stats.succeeded();
                }
                Err(error) => {
                    self.stats.failed(&error);
                    self.back_off();
                }
            }
            return;
        }
        if self.connecting.is_none() && Instant::now() >= self.next_attempt {
            let target = self.target.clone();
            let attempt = std::thread::Builder::new()
                .name("es-redis-connect".to_owned())
                .spawn(move || target.connect());
            match attempt {
                Ok(handle) => self.connecting = Some(handle),
                Err(e) => {
                    self.stats
                        .failed(&format!("cannot start a connection attempt: {e}"));
                    self.back_off();
                }
            }
        }
    }
}

/// What is kept for one engine: a delete, then a cache digest, then a
/// record (any of them, in that order). A record after a delete does not
/// replace it: the relay deletes its own record of an engine's previous run
/// before writing the new run's, and the owner check would take that old
/// record for another live writer's. A digest stays before the record: the
/// record may name its version.
#[derive(Debug, Default, PartialEq)]
struct Pending {
    delete: bool,
    digest: Option<Arc<[u8]>>,
    set: Option<RedisRecord>,
}

impl Pending {
    /// `write` after what is pending; true when it replaced something. A
    /// delete replaces a pending digest and record; a record replaces a
    /// pending record and stays after a pending delete (and digest); a
    /// digest replaces a pending digest.
    fn then(&mut self, write: RelayWrite) -> bool {
        match write {
            RelayWrite::Op(op) => {
                let had = self.delete || self.set.is_some();
                match op {
                    SinkOp::Delete => {
                        self.delete = true;
                        self.digest = None;
                        self.set = None;
                    }
                    SinkOp::Set(record) => self.set = Some(record),
                }
                had
            }
            RelayWrite::Digest(value) => self.digest.replace(value).is_some(),
        }
    }

    /// `write` before what is pending (a write of a failed pipeline, older
    /// than those kept since): a delete goes first; a digest or a record
    /// only when nothing newer of its kind (nor a delete) is pending. An
    /// older digest stays before a newer record, which may name it.
    fn before(&mut self, write: RelayWrite) {
        match write {
            RelayWrite::Op(SinkOp::Delete) => self.delete = true,
            RelayWrite::Op(SinkOp::Set(record)) if !self.delete && self.set.is_none() => {
                self.set = Some(record)
            }
            RelayWrite::Digest(value) if !self.delete && self.digest.is_none() => {
                self.digest = Some(value)
            }
            RelayWrite::Op(SinkOp::Set(_)) | RelayWrite::Digest(_) => {}
        }
    }

    /// The writes to make, in order.
    fn writes(self) -> impl Iterator<Item = RelayWrite> {
        let delete = self.delete.then_some(RelayWrite::Op(SinkOp::Delete));
        delete
            .into_iter()
            .chain(self.digest.map(RelayWrite::Digest))
            .chain(self.set.map(|record| RelayWrite::Op(SinkOp::Set(record))))
    }
}

impl Drop for InlineSink {
    fn drop(&mut self) {
        // A connection attempt in progress ends within the network timeout;
        // nobody waits for it.
        drop(self.connecting.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(heartbeat_seq: u64) -> RedisRecord {
        RedisRecord {
            heartbeat_seq,
            ..RedisRecord::default()
        }
    }

    fn ops(pending: Pending) -> Vec<RelayWrite> {
        pending.writes().collect()
    }

    fn set(heartbeat_seq: u64) -> RelayWrite {
        RelayWrite::Op(SinkOp::Set(record(heartbeat_seq)))
    }

    const DELETE: RelayWrite = RelayWrite::Op(SinkOp::Delete);

    fn digest(byte: u8) -> RelayWrite {
        RelayWrite::Digest(Arc::from(&[byte][..]))
    }

    /// The relay's delete of its own old record, then the new run's record,
    /// submitted while Redis is down: both are written, in that order (the
    /// record alone replaced the delete, and the owner check then met the
    /// relay's old record).
    #[test]
    fn a_delete_then_a_record_kept_during_an_outage_are_both_written() {
        let mut pending = Pending::default();
        assert!(!pending.then(set(1)));
        assert!(pending.then(DELETE));
        assert!(pending.then(set(2)));
        assert!(pending.then(set(3)));
        assert_eq!(ops(pending), [DELETE, set(3)]);

        // A later delete drops the record, not the delete.
        let mut pending = Pending::default();
        pending.then(DELETE);
        pending.then(set(1));
        pending.then(DELETE);
        assert_eq!(ops(pending), [DELETE]);
    }

    /// A failed pipeline's delete and record go back before what was kept
    /// since: the delete first, the record only if nothing newer is kept.
    #[test]
    fn a_failed_pipelines_delete_and_record_are_kept_in_order() {
        let mut pending = Pending::default();
        // `keep_older` walks the failed pipeline newest first.
        pending.before(set(2));
        pending.before(DELETE);
        assert_eq!(ops(pending), [DELETE, set(2)]);

        let mut pending = Pending::default();
        pending.then(set(3));
        pending.before(set(2));
        pending.before(DELETE);
        assert_eq!(ops(pending), [DELETE, set(3)]);
    }

    /// A digest kept during an outage is written before the record kept
    /// after it (which names its version), and after the delete of the
    /// engine's previous run; the newest digest wins; a delete (the engine
    /// left) drops it.
    #[test]
    fn a_kept_digest_stays_between_the_delete_and_the_record() {
        let mut pending = Pending::default();
        pending.then(DELETE);
        assert!(!pending.then(digest(1)));
        pending.then(set(1));
        assert!(pending.then(digest(2)));
        pending.then(set(2));
        assert_eq!(ops(pending), [DELETE, digest(2), set(2)]);

        let mut pending = Pending::default();
        pending.then(digest(1));
        pending.then(set(1));
        pending.then(DELETE);
        assert_eq!(ops(pending), [DELETE]);
    }

    /// A failed pipeline's digest goes back before a newer record kept
    /// since (it may name that digest), unless a newer digest or a delete
    /// is kept.
    #[test]
    fn a_failed_pipelines_digest_is_kept_unless_something_newer_replaces_it() {
        // Kept since: a heartbeat record naming the failed digest's version.
        let mut pending = Pending::default();
        pending.then(set(3));
        pending.before(set(2));
        pending.before(digest(1));
        assert_eq!(ops(pending), [digest(1), set(3)]);

        // Kept since: a newer digest.
        let mut pending = Pending::default();
        pending.then(digest(2));
        pending.then(set(3));
        pending.before(set(2));
        pending.before(digest(1));
        assert_eq!(ops(pending), [digest(2), set(3)]);

        // A failed delete, digest and record of a new run, nothing since.
        let mut pending = Pending::default();
        pending.before(set(2));
        pending.before(digest(1));
        pending.before(DELETE);
        assert_eq!(ops(pending), [DELETE, digest(1), set(2)]);

        // Kept since: the engine left.
        let mut pending = Pending::default();
        pending.then(DELETE);
        pending.before(set(2));
        pending.before(digest(1));
        assert_eq!(ops(pending), [DELETE]);
    }
}
