//! The read path of one mapped engine file: the seqlock read (or the torn
//! cache), the switch to a restarted writer's file after a retirement, and
//! what was seen handed to the judge (`judge.rs`). The hottest code of the
//! project: a read of a live file is one clock read (the caller's), a
//! seqlock read, two loads and the judge's comparisons.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::{monotonic_ns, ShmFile, Snapshot};

use super::cache::CacheSlot;
use crate::error::{EngineError, Error};
use crate::freshness::{max_ahead, ClockAhead};
use crate::judge::{judge, Clocks, Observation};
use crate::liveness::WriterCheck;
use crate::source::ReaderOptions;
use crate::state::{EngineState, Writer};

/// How long a retired mapping waits before the reader looks for its replacement again.
const REOPEN_BACKOFF: Duration = Duration::from_millis(20);

/// No snapshot read yet (odd, so never equal to a published sequence).
const NOT_SEEN: u64 = u64::MAX;

/// One engine's file, mapped, and what the reader remembers of it.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) id: Arc<str>,
    pub(super) file: ShmFile,
    /// Whether the writer lives, and when to ask again.
    writer_check: WriterCheck,
    /// The header's facts every state of this file carries (its heartbeat
    /// stamp is set per read).
    writer: Writer,
    /// A stamp further ahead of the reader's clock than this (ns) is not
    /// believed ([`max_ahead`] of the file's period).
    max_ahead_ns: u64,
    next_reopen: Instant,
    /// The sequence of the last snapshot read from this file ([`NOT_SEEN`]:
    /// none yet).
    pub(super) seen_seq: u64,
    /// The heartbeat stamp the last read reported.
    pub(super) seen_heartbeat_ns: u64,
    /// The (sequence, heartbeat) words of a torn file whose writer is dead
    /// or silent (heartbeat late), as the read that found it torn saw
    /// them: while both are unchanged, reads report it torn without
    /// spinning the seqlock's retry bound again (tens of µs a file, every
    /// read, for good). A new inode in a listing is a new entry.
    torn_words: Option<(u64, u64)>,
    /// Reads that spun the whole retry bound and found the file torn.
    pub(super) torn_spins: u64,
    /// The engine's cache digest (read only with
    /// [`ReaderOptions::cache_digests`]).
    cache: CacheSlot,
}

impl Entry {
    pub(super) fn new(file: ShmFile) -> Entry {
        let header = *file.header();
        let period = Duration::from_micros(u64::from(header.publish_period_us));
        Entry {
            id: Arc::from(file.engine_id().as_str()),
            writer_check: WriterCheck::new(&header, file.heartbeat_mono_ns(), monotonic_ns()),
            writer: Writer {
                pid: header.writer_pid,
                publish_period_us: header.publish_period_us,
                created_unix_ns: header.created_unix_ns,
                heartbeat_mono_ns: 0,
            },
            max_ahead_ns: max_ahead(period).as_nanos() as u64,
            file,
            next_reopen: Instant::now(),
            seen_seq: NOT_SEEN,
            seen_heartbeat_ns: 0,
            torn_words: None,
            torn_spins: 0,
            cache: CacheSlot::default(),
        }
    }

    /// Whether the writer lives, asked now (at listings).
    pub(super) fn check_writer(&mut self, now: u64) {
        self.writer_check
            .at_listing(self.file.header(), self.file.heartbeat_mono_ns(), now);
    }

    /// Reads the file at the reader's `now` and judges what it saw.
    #[inline]
    pub(super) fn read(&mut self, dir: &Path, now: u64, options: &ReaderOptions) -> EngineState {
        let mut retired = self.file.is_retired();
        if retired {
            self.reopen_if_replaced(dir);
            retired = self.file.is_retired();
        }
        // A live file's read pays one predictable branch for the cache.
        let (snapshot, torn_seq) = match self.torn_words {
            Some((seq, heartbeat))
                if self.file.seq() == seq && self.file.heartbeat_mono_ns() == heartbeat =>
            {
                (Snapshot::default(), Some(seq))
            }
            _ => match self.file.read() {
                Ok((snapshot, seq)) => {
                    self.seen_seq = seq;
                    self.torn_words = None;
                    (snapshot, None)
                }
                Err(torn) => {
                    self.torn_spins += 1;
                    (Snapshot::default(), Some(torn.last_seq))
                }
            },
        };
        self.seen_heartbeat_ns = self.file.heartbeat_mono_ns();
        // A live writer stamps every period, so the pid (a system call) is
        // only checked when the heartbeat is late.
        let late = self
            .writer_check
            .is_late(now.saturating_sub(self.seen_heartbeat_ns));
        self.writer_check.on_read(self.file.header(), late, now);
        let mut state = judge(
            Observation {
                engine_id: self.id.clone(),
                snapshot: &snapshot,
                writer: Writer {
                    heartbeat_mono_ns: self.seen_heartbeat_ns,
                    ..self.writer
                },
                generation: self.file.generation(),
                torn: torn_seq.is_some(),
                retired,
                writer_alive: self.writer_check.alive(),
                clocks: Clocks::Shared {
                    max_ahead_ns: self.max_ahead_ns,
                },
            },
            now,
            &options.freshness,
        );
        if options.cache_digests {
            state.cache =
                self.cache
                    .digest(dir, &self.id, state.generation, snapshot.cache_version);
        }
        if let Some(seq) = torn_seq {
            // Nothing will change while the writer is dead or silent (a
            // heartbeat ahead of the clock is silent too: its age floors at
            // 0); a writer that comes back stores a heartbeat or a sequence.
            // Only an odd (or zero) sequence is cached: with an even one the
            // last attempt saw two different sequences, and the next read may
            // well succeed on an unchanged file.
            let stopped = self.writer_check.alive() == Some(false) || late || state.clock_ahead;
            let stuck = seq % 2 == 1 || seq == 0;
            self.torn_words = (stopped && stuck).then_some((seq, self.seen_heartbeat_ns));
        }
        state
    }

    /// The per-engine error of a read of this file that found a stamp too
    /// far ahead ([`EngineState::clock_ahead`]): which one, and by how much
    /// (by the bound the judge used, so always `Some` for such a state).
    #[cold]
    pub(super) fn clock_ahead_error(&self, dir: &Path, state: &EngineState) -> Option<EngineError> {
        let ahead = ClockAhead::of(
            state.read_mono_ns,
            state.writer.heartbeat_mono_ns,
            state.snapshot.captured_mono_ns,
            self.max_ahead_ns,
        )?;
        Some(EngineError::new(
            &*self.id,
            Error::ClockAhead {
                name: dir.join(&*self.id),
                ahead,
            },
        ))
    }

    /// The error about this engine's cache digest to report with the read
    /// that returned `state` (see [`CacheSlot::error`]).
    #[inline]
    pub(super) fn cache_error(&mut self, state: &EngineState) -> Option<EngineError> {
        self.cache.error(state.snapshot.cache_version)
    }

    /// Why the read that returned `state` has no digest, if the reader
    /// knows (see `CacheSlot::fault`).
    pub(super) fn cache_fault(&self, state: &EngineState) -> Option<&EngineError> {
        self.cache.fault(state.snapshot.cache_version)
    }

    /// A retired file may have been replaced by a restarted writer: switch to
    /// the new file as soon as it is there (never mixing the two: each read
    /// comes from exactly one mapping).
    pub(super) fn reopen_if_replaced(&mut self, dir: &Path) {
        let now = Instant::now();
        if now < self.next_reopen {
            return;
        }
        self.next_reopen = now + REOPEN_BACKOFF;
        let path = dir.join(&*self.id);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.ino() != self.file.inode() => {
                if let Ok(file) = ShmFile::open(&path) {
                    if file.engine_id().as_str() == &*self.id {
                        *self = Entry::new(file);
                    }
                }
            }
            _ => {}
        }
    }
}
