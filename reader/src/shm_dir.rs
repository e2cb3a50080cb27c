//! The shared-memory source: one file per engine in a directory (DESIGN §4).

use std::collections::HashMap;
use std::os::unix::fs::{DirEntryExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_shm_format::{heartbeat, monotonic_ns, Header, ShmFile, Snapshot};

use nix::errno::Errno;

use crate::error::{EngineError, Error, FormatError};
use crate::freshness::{max_ahead, Ages, ClockAhead, Observation};
use crate::liveness::writer_alive;
use crate::source::{ReaderOptions, Source};
use crate::state::{EngineState, Reading};

/// Least time between two pid checks of one writer, in ns.
const PID_CHECK_INTERVAL_NS: u64 = 10_000_000;

/// Least time between two `/proc` lookups (is it a zombie?) of one writer
/// whose heartbeat is late, in ns: three system calls and procfs
/// formatting, so not at every pid check; a zombie is still dead within
/// two periods plus 100 ms, long before `stale_after`.
const ZOMBIE_CHECK_INTERVAL_NS: u64 = 100_000_000;

/// How long a retired mapping waits before the reader looks for its replacement again.
const REOPEN_BACKOFF: Duration = Duration::from_millis(20);

/// Every engine file in one directory, mapped read-only.
///
/// Discovery (a directory listing, `d_ino` compared per name, no `stat`) runs
/// at most every [`ReaderOptions::rescan_interval`]; between listings a read
/// touches only the mappings: a seqlock read and two loads per engine. A file
/// that its writer retired (replaced by a restarted engine) is reopened at once.
/// A file truncated under its mapping reads [`crate::Status::Torn`] until the next
/// listing, which opens it again and reports it in [`Reading::errors`].
/// A listing that fails for want of file descriptors (`EMFILE`, `ENFILE`)
/// keeps the engines already mapped and is reported in [`Reading::errors`]
/// under the source's URI ([`Error::Directory`]); other listing errors fail
/// the read. A torn file whose writer is dead or silent is spun once and
/// then reported torn until it changes ([`ShmDir::torn_spins`]).
/// [`ShmDir::read_changed_at`] is cheaper still: two loads from one cache line
/// per engine (sequence and heartbeat words), and a full read only of the
/// engines that published (or heartbeat) since, or whose file was replaced.
#[derive(Debug)]
pub struct ShmDir {
    dir: PathBuf,
    options: ReaderOptions,
    engines: Vec<Entry>,
    bad: Vec<Bad>,
    /// The last listing failed for want of file descriptors (the process's
    /// or the system's): the mapped engines are still read, and this is
    /// reported with them until a listing succeeds.
    listing_error: Option<EngineError>,
    /// Monotonic ns of the last listing (0: never).
    last_scan_ns: u64,
}

/// One engine's file as [`ShmDir`]'s last read of it saw it ([`ShmDir::raw`]).
#[derive(Clone, Copy, Debug)]
pub struct RawEngine<'a> {
    /// The file's header as it was at open (writer pid, period, generation).
    pub header: &'a Header,
    /// The writer's heartbeat stamp (its `CLOCK_MONOTONIC`) as last read:
    /// the stamp behind the reported `heartbeat_age`.
    pub heartbeat_mono_ns: u64,
    /// The file's generation.
    pub generation: u64,
    /// The last read found a stamp too far ahead of the reader's clock
    /// ([`ClockAhead`]): its ages are unknown, and a relay must not keep
    /// the engine alive elsewhere.
    pub clock_ahead: bool,
}

#[derive(Debug)]
struct Entry {
    id: Arc<str>,
    file: ShmFile,
    writer_alive: Option<bool>,
    /// A heartbeat older than this (ns) makes the reader check the writer's pid.
    late_after_ns: u64,
    /// A stamp further ahead of the reader's clock than this (ns) is not
    /// believed ([`max_ahead`] of the file's period).
    max_ahead_ns: u64,
    /// What the last read found too far ahead, if anything.
    clock_ahead: Option<ClockAhead>,
    /// Monotonic ns before which the pid is not checked again.
    next_pid_check_ns: u64,
    /// Monotonic ns before which a late writer is not looked up in `/proc`.
    next_zombie_check_ns: u64,
    next_reopen: Instant,
    /// The sequence of the last snapshot read from this file ([`NOT_SEEN`]:
    /// none yet).
    seen_seq: u64,
    /// The heartbeat stamp the last read reported.
    seen_heartbeat_ns: u64,
    /// The (sequence, heartbeat) words of a torn file whose writer is dead
    /// or silent (heartbeat late), as the read that found it torn saw
    /// them: while both are unchanged, reads report it torn without
    /// spinning the seqlock's retry bound again (tens of µs a file, every
    /// read, for good). A new inode in a listing is a new entry.
    torn_words: Option<(u64, u64)>,
    /// Reads that spun the whole retry bound and found the file torn.
    torn_spins: u64,
}

/// No snapshot read yet (odd, so never equal to a published sequence).
const NOT_SEEN: u64 = u64::MAX;

#[derive(Debug)]
struct Bad {
    inode: u64,
    error: EngineError,
}

impl ShmDir {
    /// Opens `dir` and maps every engine file in it.
    pub fn open(dir: impl AsRef<Path>, options: ReaderOptions) -> Result<ShmDir, Error> {
        let mut source = ShmDir {
            dir: dir.as_ref().to_owned(),
            options,
            engines: Vec::new(),
            bad: Vec::new(),
            listing_error: None,
            last_scan_ns: 0,
        };
        source.rescan()?;
        Ok(source)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lists the directory now: maps new files, drops removed ones, remaps
    /// replaced ones, and rechecks whether writers are alive.
    pub fn rescan(&mut self) -> Result<(), Error> {
        let listing = std::fs::read_dir(&self.dir).map_err(|io| Error::Directory {
            dir: self.dir.clone(),
            io,
        })?;
        let mut engines = Vec::with_capacity(self.engines.len());
        let mut bad = Vec::new();
        // By name, so a listing of n engines costs O(n), not O(n²).
        let mut old_engines: HashMap<Arc<str>, Entry> = std::mem::take(&mut self.engines)
            .into_iter()
            .map(|e| (e.id.clone(), e))
            .collect();
        let mut old_bad: HashMap<String, Bad> = std::mem::take(&mut self.bad)
            .into_iter()
            .map(|b| (b.error.name.clone(), b))
            .collect();
        for entry in listing.flatten() {
            let inode = entry.ino();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                // Never an engine id (those are ASCII), never a writer's
                // temporary file: reported, never opened.
                let path = entry.path();
                bad.push(Bad {
                    inode,
                    error: EngineError::new(
                        entry.file_name().to_string_lossy(),
                        FormatError::RefusedEntry {
                            path,
                            what: "name is not UTF-8, so no engine id".to_owned(),
                        },
                    ),
                });
                continue;
            };
            // Regular dot-files are writers' temporary files (and never engine
            // ids). `file_type` is the listing's d_type: no system call on
            // tmpfs. Dot-named links, FIFOs and the like are reported below.
            if name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Some(mut kept) = old_engines.remove(name.as_str()) {
                // A mapping whose file was truncated under it is dropped and
                // the file opened again (which reports its size).
                if kept.file.inode() == inode && !kept.file.is_truncated() {
                    kept.check_writer(monotonic_ns());
                    engines.push(kept);
                    continue;
                }
            }
            if let Some(kept) = old_bad.remove(&name) {
                if kept.inode == inode {
                    bad.push(kept);
                    continue;
                }
            }
            match ShmFile::open(entry.path()) {
                Ok(file) => engines.push(Entry::new(file)),
                Err(engine_state_shm_format::Error::Io { io, .. })
                    if io.kind() == std::io::ErrorKind::NotFound => {} // removed meanwhile
                Err(error) => bad.push(Bad {
                    inode,
                    error: EngineError::new(name, error),
                }),
            }
        }
        engines.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        bad.sort_unstable_by(|a, b| a.error.name.cmp(&b.error.name));
        self.engines = engines;
        self.bad = bad;
        self.listing_error = None;
        self.last_scan_ns = monotonic_ns().max(1);
        Ok(())
    }

    /// Lists the directory when the last listing is older than the rescan
    /// interval, by the real clock: `last_scan_ns` is stamped from it, and a
    /// caller's `now_mono_ns` (a replay's past, a test's fixed time) must not
    /// starve or force listings.
    /// `real_now_ns` is `monotonic_ns()`, read by the caller: a read that
    /// measures ages from the real clock reads it once for both.
    #[inline]
    fn rescan_if_due(&mut self, real_now_ns: u64) -> Result<(), Error> {
        let interval = self.options.rescan_interval.as_nanos() as u64;
        if self.last_scan_ns == 0 || real_now_ns.saturating_sub(self.last_scan_ns) >= interval {
            match self.rescan() {
                // Out of descriptors: the engines already mapped need none
                // and are still right, so they are read and the error is
                // reported beside them (named by the source's URI); the
                // next read lists again.
                Err(Error::Directory { dir, io })
                    if io.raw_os_error().is_some_and(is_out_of_fds) =>
                {
                    let uri = self.uri();
                    self.listing_error = Some(EngineError::new(uri, Error::Directory { dir, io }));
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Reads one engine by id (no directory listing unless one is due):
    /// `None` when there is no readable engine of that id, or when a due
    /// listing failed ([`ShmDir::try_read_engine`] says why).
    pub fn read_engine(&mut self, engine_id: &str) -> Option<EngineState> {
        self.try_read_engine(engine_id).ok().flatten()
    }

    /// [`ShmDir::read_engine`] that reports a failed listing
    /// ([`Error::Directory`]: the directory vanished or became unreadable).
    pub fn try_read_engine(&mut self, engine_id: &str) -> Result<Option<EngineState>, Error> {
        let now = monotonic_ns();
        self.rescan_if_due(now)?;
        let Ok(i) = self.engines.binary_search_by(|e| (*e.id).cmp(engine_id)) else {
            return Ok(None);
        };
        Ok(Some(self.engines[i].read(&self.dir, now, &self.options)))
    }
}

impl ShmDir {
    /// [`Source::read_into`] with ages measured from `now_mono_ns`
    /// (`CLOCK_MONOTONIC`), so a caller can recover each writer's own stamps:
    /// `heartbeat_mono_ns = now_mono_ns - heartbeat_age` (the node agent
    /// relays them to Redis).
    pub fn read_at(&mut self, out: &mut Reading, now_mono_ns: u64) -> Result<(), Error> {
        out.clear();
        let Reading { engines, errors } = out;
        self.read_each_at(now_mono_ns, errors, |state| engines.push(state))
    }

    /// [`ShmDir::read_at`] without the list of engines: each engine, in id
    /// order, goes to `each` as it is read, and the per-engine errors are
    /// appended to `errors`. For a caller that copies every engine into
    /// its own layout anyway (the C ABI fills a C array): no `Vec` of
    /// states is written and then read back.
    pub fn read_each_at(
        &mut self,
        now_mono_ns: u64,
        errors: &mut Vec<EngineError>,
        each: impl FnMut(EngineState),
    ) -> Result<(), Error> {
        self.read_each_with(now_mono_ns, monotonic_ns(), errors, each)
    }

    /// [`ShmDir::read_each_at`] now (one clock read for the ages and the
    /// rescan decision).
    pub fn read_each(
        &mut self,
        errors: &mut Vec<EngineError>,
        each: impl FnMut(EngineState),
    ) -> Result<(), Error> {
        let now = monotonic_ns();
        self.read_each_with(now, now, errors, each)
    }

    #[inline]
    fn read_each_with(
        &mut self,
        now_mono_ns: u64,
        real_now_ns: u64,
        errors: &mut Vec<EngineError>,
        mut each: impl FnMut(EngineState),
    ) -> Result<(), Error> {
        self.rescan_if_due(real_now_ns)?;
        for entry in &mut self.engines {
            each(entry.read(&self.dir, now_mono_ns, &self.options));
            if let Some(ahead) = entry.clock_ahead {
                errors.push(entry.clock_ahead_error(&self.dir, ahead));
            }
        }
        errors.extend(self.bad.iter().map(|b| b.error.clone()));
        errors.extend(self.listing_error.clone());
        Ok(())
    }

    /// Like [`ShmDir::read_at`], but reads only the engines that published a
    /// snapshot this reader has not read yet (by any read) or, with
    /// `heartbeat_step`, whose heartbeat stamp is at least that much newer
    /// than the one last read. The test costs two Relaxed loads from one
    /// cache line per engine (sequence and heartbeat words) — no clock read,
    /// no system call — so it can run every millisecond over a thousand
    /// engines. With a step, an engine whose heartbeat is late (four steps)
    /// is also checked for retirement: when a restarted engine replaced its
    /// file, the new file is opened and reported (its first snapshot). Dead
    /// writers (their heartbeat stops), files retired by a clean close and
    /// unreadable files are not reported here (`out.errors` stays empty): a
    /// periodic [`ShmDir::read_at`] sees those.
    pub fn read_changed_at(
        &mut self,
        out: &mut Reading,
        now_mono_ns: u64,
        heartbeat_step: Option<Duration>,
    ) -> Result<(), Error> {
        out.clear();
        self.rescan_if_due(monotonic_ns())?;
        let step_ns = heartbeat_step.map_or(u64::MAX, |d| d.as_nanos() as u64);
        // Late (the heartbeat policy's `replaced_after`, a few periods at a
        // caller's step) without a heartbeat. From the step, not from each
        // entry's own period: one load fewer per engine and poll.
        let late_ns = heartbeat_step.map_or(u64::MAX, |d| {
            u64::try_from(heartbeat::replaced_after(d).as_nanos()).unwrap_or(u64::MAX)
        });
        for entry in &mut self.engines {
            let seq = entry.file.seq();
            // Odd: a write is in progress; the next call sees it finished.
            let published = seq != entry.seen_seq && seq % 2 == 0;
            let heartbeat = entry.file.heartbeat_mono_ns();
            let beat = heartbeat.saturating_sub(entry.seen_heartbeat_ns) >= step_ns;
            // A writer that stopped may have retired its file for a restarted
            // engine's new one (the old file never changes again).
            let replaced = !published
                && !beat
                && now_mono_ns.saturating_sub(heartbeat) > late_ns
                && entry.replaced(&self.dir);
            if published || beat || replaced {
                out.engines
                    .push(entry.read(&self.dir, now_mono_ns, &self.options));
            }
        }
        Ok(())
    }

    /// Reads (of any engine mapped now) that spun the seqlock's whole retry
    /// bound ([`engine_state_shm_format::seqlock::READ_SPINS`] +
    /// `READ_YIELDS` attempts) and found the file torn. A torn file whose
    /// writer is dead or silent costs one such read, not one per read:
    /// until its sequence or heartbeat word changes (or a listing finds
    /// another inode under its name), reads report it torn from the cache.
    pub fn torn_spins(&self) -> u64 {
        self.engines.iter().map(|e| e.torn_spins).sum()
    }

    /// The header of an engine's file as it was at open (writer pid, period).
    pub fn header(&self, engine_id: &str) -> Option<&Header> {
        self.raw(engine_id).map(|raw| raw.header)
    }

    /// What the last read of an engine's file saw, raw: its header, the
    /// writer's heartbeat stamp and the file's generation (for a relay that
    /// forwards the writer's own stamps rather than ages).
    pub fn raw(&self, engine_id: &str) -> Option<RawEngine<'_>> {
        let i = self
            .engines
            .binary_search_by(|e| (*e.id).cmp(engine_id))
            .ok()?;
        let entry = &self.engines[i];
        Some(RawEngine {
            header: entry.file.header(),
            heartbeat_mono_ns: entry.seen_heartbeat_ns,
            generation: entry.file.generation(),
            clock_ahead: entry.clock_ahead.is_some(),
        })
    }
}

impl Source for ShmDir {
    fn read_into(&mut self, out: &mut Reading) -> Result<(), Error> {
        out.clear();
        let Reading { engines, errors } = out;
        self.read_each(errors, |state| engines.push(state))
    }

    fn uri(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}

impl Entry {
    fn new(file: ShmFile) -> Entry {
        // Missed heartbeats (the heartbeat policy's `late_after`, at least
        // the pid check interval) before suspecting the writer.
        let period = Duration::from_micros(u64::from(file.header().publish_period_us));
        let late_after = heartbeat::late_after(period, Duration::from_nanos(PID_CHECK_INTERVAL_NS));
        let mut entry = Entry {
            id: Arc::from(file.engine_id().as_str()),
            writer_alive: None,
            late_after_ns: late_after.as_nanos() as u64,
            max_ahead_ns: max_ahead(period).as_nanos() as u64,
            clock_ahead: None,
            next_pid_check_ns: 0,
            next_zombie_check_ns: 0,
            file,
            next_reopen: Instant::now(),
            seen_seq: NOT_SEEN,
            seen_heartbeat_ns: 0,
            torn_words: None,
            torn_spins: 0,
        };
        entry.check_writer(monotonic_ns());
        entry
    }

    /// Whether the writer lives, asked now (at open and at listings): a
    /// writer whose heartbeat is late is also checked for being a zombie.
    ///
    /// A writer found gone stays gone: its file is replaced by a rename (a
    /// new inode, a new entry), never reused, and a zombie that is reaped
    /// answers `ESRCH`. The `/proc` lookup keeps its 100 ms interval here
    /// too, so a listing with many late writers does not read `/proc` for
    /// each of them every time.
    fn check_writer(&mut self, now: u64) {
        if self.writer_alive == Some(false) {
            return;
        }
        let late = now.saturating_sub(self.file.heartbeat_mono_ns()) > self.late_after_ns;
        let zombie_check = late && now >= self.next_zombie_check_ns;
        self.writer_alive = writer_alive(self.file.header(), zombie_check);
        if zombie_check {
            self.next_zombie_check_ns = now + ZOMBIE_CHECK_INTERVAL_NS;
        }
    }

    #[inline]
    fn read(&mut self, dir: &Path, now: u64, options: &ReaderOptions) -> EngineState {
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
        let torn = torn_seq.is_some();
        self.seen_heartbeat_ns = self.file.heartbeat_mono_ns();
        let ages = Ages::at(
            now,
            self.seen_heartbeat_ns,
            snapshot.captured_mono_ns,
            self.max_ahead_ns,
        );
        self.clock_ahead = if ages.clock_ahead {
            ClockAhead::of(
                now,
                self.seen_heartbeat_ns,
                snapshot.captured_mono_ns,
                self.max_ahead_ns,
            )
        } else {
            None
        };
        let heartbeat_ns = now.saturating_sub(self.seen_heartbeat_ns);
        // A live writer stamps every period, so the pid (a system call) is only
        // checked when the heartbeat is late, and then at most every 10 ms.
        if heartbeat_ns > self.late_after_ns
            && self.writer_alive == Some(true)
            && now >= self.next_pid_check_ns
        {
            let zombie_check = now >= self.next_zombie_check_ns;
            self.writer_alive = writer_alive(self.file.header(), zombie_check);
            self.next_pid_check_ns = now + PID_CHECK_INTERVAL_NS;
            if zombie_check {
                self.next_zombie_check_ns = now + ZOMBIE_CHECK_INTERVAL_NS;
            }
        }
        if let Some(seq) = torn_seq {
            // Nothing will change while the writer is dead or silent (a
            // heartbeat ahead of the clock is silent too: its age floors at
            // 0); a writer that comes back stores a heartbeat or a sequence.
            // Only an odd (or zero) sequence is cached: with an even one the
            // last attempt saw two different sequences, and the next read may
            // well succeed on an unchanged file.
            let stopped = self.writer_alive == Some(false)
                || heartbeat_ns > self.late_after_ns
                || ages.clock_ahead;
            let stuck = seq % 2 == 1 || seq == 0;
            self.torn_words = (stopped && stuck).then_some((seq, self.seen_heartbeat_ns));
        }
        let Ages {
            heartbeat_age,
            capture_age,
            ..
        } = ages;
        let observation = Observation {
            torn,
            retired,
            writer_alive: self.writer_alive,
            heartbeat_age,
            capture_age,
            idle: snapshot.is_idle(),
            clock_ahead: ages.clock_ahead,
        };
        EngineState {
            engine_id: self.id.clone(),
            status: options.freshness.classify(&observation),
            snapshot,
            heartbeat_age,
            capture_age,
            generation: self.file.generation(),
            read_mono_ns: now,
        }
    }

    /// The per-engine error of a read that found `ahead`.
    #[cold]
    fn clock_ahead_error(&self, dir: &Path, ahead: ClockAhead) -> EngineError {
        EngineError::new(
            &*self.id,
            Error::ClockAhead {
                name: dir.join(&*self.id),
                ahead,
            },
        )
    }

    /// Whether the file is retired and a replacement was opened now (see
    /// [`Entry::reopen_if_replaced`]).
    fn replaced(&mut self, dir: &Path) -> bool {
        if !self.file.is_retired() {
            return false;
        }
        let inode = self.file.inode();
        self.reopen_if_replaced(dir);
        self.file.inode() != inode
    }

    /// A retired file may have been replaced by a restarted writer: switch to
    /// the new file as soon as it is there (never mixing the two: each read
    /// comes from exactly one mapping).
    fn reopen_if_replaced(&mut self, dir: &Path) {
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

/// `EMFILE` (this process) or `ENFILE` (the system) — no descriptor to list with.
fn is_out_of_fds(errno: i32) -> bool {
    errno == Errno::EMFILE as i32 || errno == Errno::ENFILE as i32
}
