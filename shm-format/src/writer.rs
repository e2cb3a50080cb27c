//! The single writer of one engine's file (FORMAT.md, "Creating, replacing
//! and retiring (writers)"; ARCHITECTURE.md, "Creation, replacement,
//! retirement"): its state, its options, and the publish path (the seqlock
//! write and the heartbeat stamps). One concept a file:
//!
//! - this file: [`ShmWriter`], [`WriterOptions`], [`ShmWriter::publish`],
//!   the [`Heartbeat`] handle's stamps;
//! - `create`: atomic creation, and taking over a dead writer's file;
//! - `damage`: whether the file is still what readers see
//!   ([`Heartbeat::in_place`]) and what this writer wrote;
//! - `retire`: marking the file retired and removing it.

pub(crate) mod create;
mod damage;
pub(crate) mod retire;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::Flock;

use crate::clock::monotonic_ns;
use crate::engine_id::EngineId;
use crate::fork::fork_generation;
use crate::heartbeat::DEFAULT_PUBLISH_PERIOD;
use crate::layout::*;
use crate::mapping::Mapping;
use crate::seqlock;
use crate::snapshot::{Snapshot, SNAPSHOT_WORDS};

use self::damage::{SeqRecord, Written};

/// Default permission bits of an engine's file: only the engine's user may
/// read it (FORMAT.md, "Naming and permissions"). The settings crate
/// re-exports it as its `DEFAULT_FILE_MODE`.
pub const DEFAULT_FILE_MODE: u32 = 0o600;

/// How a [`ShmWriter`] creates its file.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Permission bits of the file (default [`DEFAULT_FILE_MODE`], `0o600`:
    /// only the engine's user may read it; use `0o644` when routers run as
    /// another user).
    pub mode: u32,
    /// The publish period recorded in the header (default
    /// [`DEFAULT_PUBLISH_PERIOD`], 50 ms).
    pub publish_period: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            mode: DEFAULT_FILE_MODE,
            publish_period: DEFAULT_PUBLISH_PERIOD,
        }
    }
}

/// The one writer of `<dir>/<engine id>`.
///
/// Created atomically (temporary dot-file, `posix_fallocate`, header and first
/// snapshot, then `link`/`rename` into place) and locked with `flock` for its
/// whole life, so a second live writer of the same id is refused. A dead
/// writer's file is marked retired and replaced, never truncated or reused.
/// Dropping the writer retires and removes the file.
#[derive(Debug)]
pub struct ShmWriter {
    pub(crate) map: Arc<Mapping>,
    path: PathBuf,
    engine_id: EngineId,
    generation: u64,
    pub(crate) inode: u64,
    dev: u64,
    fork_generation: u64,
    /// What was written at creation into the bytes that never change after it.
    written: Written,
    /// The sequence this writer stored last (even): the next publish starts
    /// from it, not from what the word holds (see [`seqlock::write_after`]).
    seq: u64,
    /// What the heartbeat's check needs to know of `seq`.
    seq_record: Arc<SeqRecord>,
    /// See [`Heartbeat::dir_was_link`].
    dir_was_link: bool,
    // Held for the writer's life; released (closing the file) on drop.
    _lock: Flock<File>,
    pub(crate) retired: bool,
}

/// Stamps the heartbeat word of a writer's file from another thread, and
/// checks that the file is still in place.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub(crate) map: Arc<Mapping>,
    fork_generation: u64,
    /// Where the file was put, and its (device, inode).
    path: Arc<Path>,
    file_id: (u64, u64),
    engine_id: EngineId,
    generation: u64,
    written: Written,
    seq_record: Arc<SeqRecord>,
    /// The directory was a symbolic link when the writer was created (then
    /// it was configured as one, and following it is what was asked for).
    dir_was_link: bool,
}

impl Heartbeat {
    /// Stores the current `CLOCK_MONOTONIC` as `heartbeat_mono_ns`. Returns
    /// false (and writes nothing) once the file is retired or in a forked
    /// child. A file truncated under the mapping (which then reads zeros, see
    /// `sigbus`) is not retired: nothing is stored, true is returned, and
    /// [`Heartbeat::in_place`] says false, so the caller can replace it.
    pub fn beat(&self) -> bool {
        self.beat_unless_younger(std::time::Duration::ZERO, monotonic_ns())
    }

    /// Like [`Heartbeat::beat`], but stores nothing while the stamp is
    /// younger than `max_age` (a publish stamped it): a heartbeat thread that
    /// ticks every period then leaves a busy engine's stamp to its publishes,
    /// and relays see one change per publish instead of two, while the stamp
    /// never gets much older than `max_age` plus one tick. A stamp in the
    /// future (stored by another process) is overwritten whatever `max_age`.
    ///
    /// `now_ns` is the stamp, on the clock of `CLOCK_MONOTONIC` (the
    /// publisher passes its `Clock`'s reading, so tests drive it).
    pub fn beat_unless_younger(&self, max_age: std::time::Duration, now_ns: u64) -> bool {
        if fork_generation() != self.fork_generation {
            return false;
        }
        // This load may be the first touch of a truncated file: the `sigbus`
        // handler then maps zero pages over the mapping and it reads 0.
        match self.map.word(STATE_WORD * 8).load(Ordering::Relaxed) {
            STATE_ACTIVE => {}
            STATE_RETIRED => return false,
            _ => return true, // zeroed or truncated: `in_place` says false
        }
        let word = self.map.word(HEARTBEAT_OFFSET);
        let now = now_ns;
        // Readers load it Relaxed; it carries no other data, and only this
        // process stores it (publish and the heartbeat thread): Relaxed.
        let last = word.load(Ordering::Relaxed);
        // A stamp ahead of our clock was not ours (a stray store): readers
        // call it clock_ahead, never fresh, so it is overwritten at once.
        if last > now || now - last >= max_age.as_nanos() as u64 {
            word.store(now, Ordering::Relaxed);
        }
        true
    }

    /// The generation of this file.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl ShmWriter {
    /// Publishes one snapshot (the seqlock write of FORMAT.md, "The seqlock
    /// protocol").
    ///
    /// In a process forked from the one that created the writer this writes
    /// nothing and returns [`WrongProcess`]: the child must create its own writer.
    #[inline]
    pub fn publish(&mut self, snapshot: &Snapshot) -> Result<(), WrongProcess> {
        if fork_generation() != self.fork_generation || self.retired {
            return Err(WrongProcess);
        }
        let words: [u64; SNAPSHOT_WORDS] = snapshot.to_words();
        let seq = self.map.word(SEQ_OFFSET);
        // Relaxed: only this thread stores the word, unless another process
        // wrote into the file, which is what this load looks for.
        if seq.load(Ordering::Relaxed) != self.seq {
            // Relaxed: read on its own by the heartbeat's check.
            self.seq_record.foreign.store(true, Ordering::Relaxed);
        }
        let target = self.seq.wrapping_add(2);
        // Release: pairs with the Acquire load of `target` in
        // `Heartbeat::seq_is_ours` (our store of `self.seq` came before).
        self.seq_record.target.store(target, Ordering::Release);
        // Pairs with the `fence(Acquire)` in `Heartbeat::seq_is_ours`: a
        // check that sees either store of this write into the word sees
        // `target` too. (No instruction on x86.)
        fence(Ordering::Release);
        seqlock::write_after(seq, self.map.words(PAYLOAD_OFFSET), &words, self.seq);
        // Release: pairs with the Acquire load of `done` in
        // `Heartbeat::seq_is_ours` (the final store into the word came
        // before): from now on an odd `target - 1` in the word is not ours.
        self.seq_record.done.store(target, Ordering::Release);
        self.seq = target;
        Ok(())
    }

    /// The first half of `publish`, as a publishing thread preempted
    /// between its odd and its final store leaves the file.
    #[cfg(test)]
    pub(crate) fn begin_publish_for_test(&mut self) {
        let target = self.seq.wrapping_add(2);
        self.seq_record.target.store(target, Ordering::Release);
        fence(Ordering::Release);
        self.map
            .word(SEQ_OFFSET)
            .store(self.seq.wrapping_add(1), Ordering::Relaxed);
    }

    /// Stores `mono_ns` as the heartbeat (a publish is a sign of life too).
    #[inline]
    pub fn stamp_heartbeat(&self, mono_ns: u64) {
        if !self.retired && fork_generation() == self.fork_generation {
            self.map
                .word(HEARTBEAT_OFFSET)
                .store(mono_ns, Ordering::Relaxed);
        }
    }

    /// A handle for a heartbeat thread.
    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            map: self.map.clone(),
            fork_generation: self.fork_generation,
            path: Arc::from(self.path.as_path()),
            file_id: (self.dev, self.inode),
            engine_id: self.engine_id.clone(),
            generation: self.generation,
            written: self.written,
            seq_record: self.seq_record.clone(),
            dir_was_link: self.dir_was_link,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The engine id.
    pub fn engine_id(&self) -> &EngineId {
        &self.engine_id
    }

    /// This file's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// A writer was used in a process forked from the one that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this writer belongs to the process that created it (before fork); create a new one in this process")]
pub struct WrongProcess;
