//! Keeping a shared-memory engine visible when its file is removed under it
//! (`rm -rf` of the directory, a cleanup script, a tmpfs remount), replaced,
//! truncated (`truncate -s 0`, a buggy tool), or written into (a stray
//! store into its sequence word, which would keep it torn for readers).
//!
//! A removed file stays mapped, so publishing into it "succeeds" while no
//! reader can see it; a truncated one is refused by readers (wrong size),
//! and the writer's next store into it faults: the `SIGBUS` handler of
//! `engine-state-shm-format` (its `sigbus` module) maps zero pages over the
//! writer's mapping, so `publish` and the heartbeat keep running into
//! private memory instead of killing the engine. The heartbeat thread
//! notices either — every [`CHECK_EVERY`] periods [`Heartbeat::in_place`]
//! compares the path's (device, inode, size, type; one `lstat`) with its
//! file's and the mapping's header and engine id with what was written at
//! creation (a file cut to a few bytes and grown back keeps its magic but
//! not those) and the sequence word with the values it stored — and, as
//! soon as the directory
//! exists, creates a new file in a new generation carrying the latest
//! snapshot, put in place atomically (`link` where nothing is left,
//! `rename` over its own damaged file). It hands the
//! new writer to the publishing thread through [`Handoff`] (a directory
//! swapped for a symbolic link is refused, the reason logged once, and
//! retried every period until the directory is back): `publish` pays
//! one atomic load per call for this (no lock, no system call) and swaps
//! writers the first time it sees one ready. A gap is reported once on
//! stderr when noticed and once when over, and counted in
//! [`PublisherStats`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_state_shm_format::{
    fork_generation, heartbeat, unix_ns, Clock, EngineId, Heartbeat, ShmWriter, Snapshot,
    WriterOptions,
};

/// The heartbeat thread checks that the file is in place every this many
/// periods (and every period while it is missing).
pub(crate) const CHECK_EVERY: u32 = 4;

/// Counters of a publisher's life, from [`crate::Publisher::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherStats {
    /// Times the engine's file was found removed, replaced or truncated (each gap
    /// counts once, however long it lasts).
    pub files_lost: u64,
    /// Times a new file (a new generation) was created after such a gap.
    pub files_recreated: u64,
}

/// Between the heartbeat thread (which creates replacement writers) and the
/// publishing thread (which adopts them).
#[derive(Debug, Default)]
pub(crate) struct Handoff {
    /// True while `replacement` holds a writer (set and reset under its
    /// lock). The Release store in `Keeper::recreate` pairs with the Acquire
    /// load in [`Handoff::is_ready`]; the lock itself orders the hand-off.
    ready: AtomicBool,
    replacement: Mutex<Option<ShmWriter>>,
    /// Writers replaced by `publish`, for the heartbeat thread to retire
    /// (system calls the publishing thread must not make).
    spent: Mutex<Vec<ShmWriter>>,
    // Relaxed: counters, read on their own.
    files_lost: AtomicU64,
    files_recreated: AtomicU64,
}

impl Handoff {
    /// Whether a replacement writer waits (one Acquire load: pairs with the
    /// Release store in `Keeper::recreate`).
    #[inline]
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Swaps `writer` for the waiting replacement, if the lock is free (never
    /// waits: the heartbeat thread holds it only to move a writer in or out);
    /// the old writer goes to the heartbeat thread for retiring.
    #[cold]
    pub(crate) fn adopt(&self, writer: &mut ShmWriter) {
        let Ok(mut slot) = self.replacement.try_lock() else {
            return; // the next publish tries again
        };
        // Relaxed, under the lock that also guards the slot (see `Keeper::recreate`).
        self.ready.store(false, Ordering::Relaxed);
        let Some(new) = slot.take() else {
            return;
        };
        drop(slot);
        let old = std::mem::replace(writer, new);
        match self.spent.try_lock() {
            Ok(mut spent) => spent.push(old),
            // Retiring here costs a few system calls, once per gap.
            Err(_) => drop(old),
        }
    }

    /// The counters.
    pub(crate) fn stats(&self) -> PublisherStats {
        PublisherStats {
            files_lost: self.files_lost.load(Ordering::Relaxed),
            files_recreated: self.files_recreated.load(Ordering::Relaxed),
        }
    }

    /// Retires the writers not adopted yet (a replacement nobody published
    /// into is still the engine's visible file) and the spent ones.
    pub(crate) fn clear(&self) {
        self.ready.store(false, Ordering::Relaxed);
        drop(lock(&self.replacement).take());
        lock(&self.spent).clear();
    }
}

/// The heartbeat thread's side: stamps the heartbeat, checks the file,
/// recreates it.
#[derive(Debug)]
pub(crate) struct Keeper {
    dir: PathBuf,
    engine_id: EngineId,
    options: WriterOptions,
    /// The heartbeat of the newest file (the replacement once there is one).
    beat: Heartbeat,
    handoff: Arc<Handoff>,
    ticks: u32,
    /// When the file was found missing (the clock's ns), and the last reason
    /// it could not be recreated (reported once).
    lost: Option<(u64, Option<String>)>,
    /// Stamps a recreated file's snapshot and times the gap.
    clock: Clock,
    /// The latest snapshot seen in the file, every period: a truncated file
    /// has lost its own, and it is carried over from here.
    last_snapshot: Option<Snapshot>,
    fork_generation: u64,
}

impl Keeper {
    pub(crate) fn new(
        dir: PathBuf,
        writer: &ShmWriter,
        options: WriterOptions,
        handoff: Arc<Handoff>,
        clock: Clock,
    ) -> Keeper {
        Keeper {
            dir,
            engine_id: writer.engine_id().clone(),
            options,
            beat: writer.heartbeat(),
            handoff,
            ticks: 0,
            lost: None,
            last_snapshot: None,
            clock,
            fork_generation: fork_generation(),
        }
    }

    /// One period: the heartbeat (unless a publish stamped it less than a
    /// period ago), and every [`CHECK_EVERY`] periods the file check. False
    /// once the file is retired (closed) or in a forked child.
    pub(crate) fn tick(&mut self) -> bool {
        if fork_generation() != self.fork_generation {
            return false;
        }
        // Retiring costs system calls: here, not on the publishing thread.
        if let Ok(mut spent) = self.handoff.spent.try_lock() {
            spent.clear();
        }
        if self.lost.is_none() {
            // A seqlock read of our own mapping, once a period (before the
            // stamp: a stamp then tells that what was published before it
            // was seen). None (the last one kept) once the file was
            // truncated, zeroed or cut under it.
            self.last_snapshot = self.beat.snapshot().or(self.last_snapshot);
        }
        // The stamp and the gap's start on the publisher's clock.
        let now = self.clock.now_ns();
        if !self
            .beat
            .beat_unless_younger(heartbeat::skip_if_younger(self.options.publish_period), now)
        {
            return false;
        }
        self.ticks = self.ticks.wrapping_add(1);
        if self.lost.is_none() && self.ticks % CHECK_EVERY != 0 {
            return true;
        }
        if self.beat.in_place() {
            return true;
        }
        if self.lost.is_none() {
            self.lost = Some((now, None));
            self.handoff.files_lost.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "engine-state publisher: the file of engine {} ({}) was removed, replaced, \
                 truncated or written into by another process: readers no longer see it (or \
                 see it torn); it is recreated (new generation) once {} exists",
                self.engine_id,
                self.dir.join(self.engine_id.as_str()).display(),
                self.dir.display()
            );
        }
        if self.dir.is_dir() {
            self.recreate();
        }
        true
    }

    fn recreate(&mut self) {
        // The mapping's own copy when it has one (a removed file keeps it; a
        // truncated one has it if something was published since), else the
        // one seen at the last tick.
        let mut first = self
            .beat
            .snapshot()
            .or(self.last_snapshot)
            .unwrap_or_default();
        // The carried-over snapshot is as old as it is; readers age it from
        // its capture stamps, which are kept.
        if first.captured_mono_ns == 0 {
            first.captured_mono_ns = self.clock.now_ns();
            first.captured_unix_ns = self.clock.unix_ns().unwrap_or_else(unix_ns);
        }
        // `self.beat` is the newest writer's (the adopted one, or the
        // replacement waiting in the hand-off): alive, so `create_after` may
        // rename over its file.
        match ShmWriter::create_after(&self.beat, &self.options, &first) {
            Ok(writer) => {
                // Creation stamped `CLOCK_MONOTONIC`; the heartbeat is on
                // the publisher's clock (the same one unless a test passes
                // one in; read after creation, so never earlier).
                writer.stamp_heartbeat(self.clock.now_ns());
                let (since, _) = self.lost.take().expect("only called while lost");
                self.beat = writer.heartbeat();
                let mut slot = lock(&self.handoff.replacement);
                let previous = slot.replace(writer);
                // Under the lock, like `adopt`'s reset: `ready` is true
                // exactly while the slot holds a writer. Release: pairs with
                // `Handoff::is_ready`'s Acquire load.
                self.handoff.ready.store(true, Ordering::Release);
                drop(slot);
                drop(previous); // a replacement never adopted (idle engine, lost twice)
                self.handoff.files_recreated.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "engine-state publisher: recreated the file of engine {} (generation {}) \
                     after {:.1} s",
                    self.engine_id,
                    self.beat.generation(),
                    Duration::from_nanos(self.clock.now_ns().saturating_sub(since)).as_secs_f64()
                );
            }
            Err(e) => {
                let reason = e.to_string();
                if let Some((_, last)) = self.lost.as_mut() {
                    if last.as_deref() != Some(reason.as_str()) {
                        eprintln!(
                            "engine-state publisher: cannot recreate the file of engine {} yet: \
                             {reason}; retrying every period",
                            self.engine_id
                        );
                        *last = Some(reason);
                    }
                }
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
