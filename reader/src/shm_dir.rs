//! The shared-memory source: one file per engine in a directory
//! (docs/FORMAT.md, "Reading a directory"). This file is the source's API;
//! one concept a file below it: `shm_dir/discovery.rs` (listing the
//! directory), `shm_dir/entry.rs` (the read path of one file),
//! `shm_dir/changed.rs` (change detection for the relay), `shm_dir/cache.rs`
//! (an engine's cache digest, with [`ReaderOptions::cache_digests`]). Whether a writer
//! lives is `liveness.rs`; what a read makes of what it saw, `judge.rs`.

mod cache;
mod changed;
mod discovery;
mod entry;

use std::path::{Path, PathBuf};

use engine_state_shm_format::{monotonic_ns, Header};

use crate::error::{EngineError, Error};
use crate::source::{ReaderOptions, Source};
use crate::state::{EngineState, Reading};

use self::discovery::Bad;
use self::entry::Entry;

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
///
/// With [`ReaderOptions::cache_digests`] each read also hands out the
/// engine's cache digest ([`EngineState::cache`]): the file
/// `<dir>.cache/<id>` is mapped at the first snapshot that names a digest,
/// read again only when the snapshot's `cache_version` moves past the one
/// held (a compare per engine and an `Arc` clone otherwise), and opened
/// again when its writer replaced it. What cannot be used there is that
/// engine's [`Error::CorruptCache`] (damaged) or [`Error::MissingCache`]
/// (not there for it: said once per version), and
/// [`ShmDir::cache_fault`] says it again on demand (see `shm_dir/cache.rs`).
///
/// The reads: every engine now ([`Source::read_into`]), every engine with
/// ages measured from a given time ([`ShmDir::read_at`]), every engine handed
/// to a closure as it is read ([`ShmDir::read_each`], for a caller that
/// copies into its own layout), one engine by id ([`ShmDir::read_engine`]),
/// and only the engines that changed ([`ShmDir::read_changed_at`]: two loads
/// from one cache line per engine, and a full read only of the engines that
/// published, or heartbeat, since, or whose file was replaced).
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

    /// Reads one engine by id (no directory listing unless one is due):
    /// `None` when there is no readable engine of that id; an error when a
    /// due listing failed ([`Error::Directory`]: the directory vanished or
    /// became unreadable).
    pub fn read_engine(&mut self, engine_id: &str) -> Result<Option<EngineState>, Error> {
        let now = monotonic_ns();
        self.rescan_if_due(now)?;
        let Ok(i) = self.engines.binary_search_by(|e| (*e.id).cmp(engine_id)) else {
            return Ok(None);
        };
        Ok(Some(self.engines[i].read(&self.dir, now, &self.options)))
    }

    /// [`Source::read_into`] with ages measured from `now_mono_ns`
    /// (`CLOCK_MONOTONIC`): replays, tests, and a relay that passes the time
    /// of its pass. Whether a listing is due is decided by the real clock, so
    /// a time in the past neither starves nor forces listings.
    pub fn read_at(&mut self, out: &mut Reading, now_mono_ns: u64) -> Result<(), Error> {
        out.clear();
        let Reading { engines, errors } = out;
        self.read_each(Some(now_mono_ns), errors, |state| engines.push(state))
    }

    /// A read of every engine without the list of engines: each engine, in
    /// id order, goes to `each` as it is read, and the per-engine errors are
    /// appended to `errors`. Ages are measured from `at` (`CLOCK_MONOTONIC`
    /// ns, as [`ShmDir::read_at`]), or from now when `None` (one clock read
    /// for the ages and the listing decision). For a caller that copies every
    /// engine into its own layout anyway (the C ABI fills a C array): no
    /// `Vec` of states is written and then read back.
    #[inline]
    pub fn read_each(
        &mut self,
        at: Option<u64>,
        errors: &mut Vec<EngineError>,
        mut each: impl FnMut(EngineState),
    ) -> Result<(), Error> {
        let real_now_ns = monotonic_ns();
        let now_mono_ns = at.unwrap_or(real_now_ns);
        self.rescan_if_due(real_now_ns)?;
        for entry in &mut self.engines {
            let state = entry.read(&self.dir, now_mono_ns, &self.options);
            if state.clock_ahead {
                errors.extend(entry.clock_ahead_error(&self.dir, &state));
            }
            if self.options.cache_digests {
                errors.extend(entry.cache_error(&state));
            }
            each(state);
        }
        errors.extend(self.bad.iter().map(|b| b.error.clone()));
        errors.extend(self.listing_error.clone());
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

    /// Why `state` (a read of this source) has no cache digest, at every
    /// call: [`Error::CorruptCache`] (damaged) or [`Error::MissingCache`]
    /// (not there for it), the reason [`Reading::errors`] gave when the read
    /// found it; None when the engine's snapshot names none, its digest was
    /// read, or the read was torn (read again). See [`Source::cache_fault`].
    pub fn cache_fault(&self, state: &EngineState) -> Option<EngineError> {
        if state.cache.is_some() {
            return None;
        }
        let i = self
            .engines
            .binary_search_by(|e| (*e.id).cmp(&*state.engine_id))
            .ok()?;
        self.engines[i].cache_fault(state).cloned()
    }

    /// The header of an engine's file as it was at open (writer pid and pid
    /// namespace, period, creation time, generation): for tools and tests
    /// that look at the file itself. What a relay forwards of it travels on
    /// each [`EngineState`] ([`EngineState::writer`]).
    pub fn header(&self, engine_id: &str) -> Option<&Header> {
        let i = self
            .engines
            .binary_search_by(|e| (*e.id).cmp(engine_id))
            .ok()?;
        Some(self.engines[i].file.header())
    }
}

impl Source for ShmDir {
    fn read_into(&mut self, out: &mut Reading) -> Result<(), Error> {
        out.clear();
        let Reading { engines, errors } = out;
        self.read_each(None, errors, |state| engines.push(state))
    }

    fn uri(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    fn cache_fault(&self, state: &EngineState) -> Option<EngineError> {
        ShmDir::cache_fault(self, state)
    }
}
