//! Router replicas' reservations on shared memory: one file per replica in
//! `<dir>.routers` (docs/FORMAT.md, "Shared reservations"), listed at most
//! every [`ReaderOptions::rescan_interval`] like the engines' directory
//! (`shm_dir/discovery.rs`): new files are mapped, removed ones dropped,
//! replaced ones (another inode under the name) opened again, and what
//! cannot be read is kept as a per-replica error until its inode changes.

use std::collections::HashMap;
use std::os::unix::fs::DirEntryExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::{
    monotonic_ns, routers_dir, Reservations, RouterError, RouterFile, RouterRecord,
};

/// No consistent read yet (odd, so never a published sequence).
const NOT_SEEN: u64 = u64::MAX;

use super::{replica_status, ReplicaEvidence, ReplicaReading, ReplicaSource, ReplicaState};
use crate::error::{EngineError, Error, FormatError};
use crate::freshness::{max_ahead, Ages};
use crate::liveness::WriterCheck;
use crate::source::ReaderOptions;

/// One mapped replica file and what the reader remembers of it.
#[derive(Debug)]
struct Entry {
    id: Arc<str>,
    file: RouterFile,
    writer_check: WriterCheck,
    max_ahead_ns: u64,
    /// The last consistent read (its engine ids reused by the next:
    /// `RouterFile::read_into`), and the engines as handed out, with the
    /// sequence they were read under: a file whose sequence has not moved
    /// since is not read again (one load), its engines handed out anew.
    record: Option<RouterRecord>,
    engines: Vec<(Arc<str>, Reservations)>,
    seen_seq: u64,
}

impl Entry {
    fn new(file: RouterFile) -> Entry {
        let header = *file.header();
        let period = Duration::from_micros(u64::from(header.heartbeat_period_us));
        Entry {
            id: Arc::from(file.replica_id().as_str()),
            writer_check: WriterCheck::new(&header, file.heartbeat_mono_ns(), monotonic_ns()),
            max_ahead_ns: max_ahead(period).as_nanos() as u64,
            file,
            record: None,
            engines: Vec::new(),
            seen_seq: NOT_SEEN,
        }
    }

    /// Reads the file at `now` and judges it; a malformed record is also a
    /// per-replica error (the state is then torn, with no engines).
    fn read(&mut self, now: u64, options: &ReaderOptions) -> (ReplicaState, Option<FormatError>) {
        let retired = self.file.is_retired();
        let mut torn = false;
        let mut error = None;
        // An even sequence equal to the last consistent read's: nothing
        // changed (a writer's next change moves it before it stores).
        if self.file.seq() != self.seen_seq {
            let record = self.record.get_or_insert_with(|| RouterRecord {
                replica_id: self.file.replica_id().clone(),
                generation: 0,
                seq: NOT_SEEN,
                changed_mono_ns: 0,
                heartbeat_mono_ns: 0,
                engines: Vec::new(),
            });
            match self.file.read_into(record) {
                Ok(()) => {
                    self.seen_seq = record.seq;
                    let old = std::mem::take(&mut self.engines);
                    self.engines = record
                        .engines
                        .iter()
                        .enumerate()
                        .map(|(i, (engine_id, counters))| {
                            let id = match old.get(i) {
                                Some((id, _)) if &**id == engine_id.as_str() => id.clone(),
                                _ => Arc::from(engine_id.as_str()),
                            };
                            (id, *counters)
                        })
                        .collect();
                }
                Err(failed) => {
                    self.seen_seq = NOT_SEEN;
                    self.engines.clear();
                    torn = true;
                    if !matches!(failed, RouterError::Torn(_)) {
                        error = Some(FormatError::Router {
                            path: self.file.path().to_owned(),
                            error: failed,
                        });
                    }
                }
            }
        }
        let heartbeat_mono_ns = self.file.heartbeat_mono_ns();
        let changed_mono_ns = self.record.as_ref().map_or(0, |r| r.changed_mono_ns);
        let ages = Ages::at(now, heartbeat_mono_ns, changed_mono_ns, self.max_ahead_ns);
        let late = self
            .writer_check
            .is_late(ages.heartbeat_age.as_nanos() as u64);
        self.writer_check.on_read(self.file.header(), late, now);
        let status = replica_status(
            options,
            ReplicaEvidence {
                torn,
                retired,
                writer_alive: self.writer_check.alive(),
                heartbeat_age: ages.heartbeat_age,
                clock_ahead: ages.clock_ahead,
            },
        );
        let state = ReplicaState {
            replica_id: self.id.clone(),
            status,
            heartbeat_age: ages.heartbeat_age,
            changed_age: (changed_mono_ns != 0 && !torn).then_some(ages.capture_age),
            generation: self.file.generation(),
            read_mono_ns: now,
            writer_pid: self.file.header().writer_pid,
            engines: match torn {
                true => Vec::new(),
                false => self.engines.clone(),
            },
        };
        (state, error)
    }
}

/// An entry of the directory that could not be read as a replica, by inode.
#[derive(Debug)]
struct Bad {
    inode: u64,
    error: EngineError,
}

/// Every replica file in `<dir>.routers` but the reader's own, mapped
/// read-only. A missing directory is no replica yet (not an error): the
/// first router that shares its reservations creates it.
#[derive(Debug)]
pub struct ShmReplicas {
    dir: PathBuf,
    own: Option<String>,
    options: ReaderOptions,
    entries: Vec<Entry>,
    bad: Vec<Bad>,
    /// Monotonic ns of the last listing (0: never).
    last_scan_ns: u64,
}

impl ShmReplicas {
    /// Opens the replicas of the engines' directory `state_dir` (their
    /// files are in `<state_dir>.routers`), leaving out `own`.
    pub fn open(
        state_dir: impl AsRef<Path>,
        own: Option<&str>,
        options: ReaderOptions,
    ) -> Result<ShmReplicas, Error> {
        let mut source = ShmReplicas {
            dir: routers_dir(state_dir.as_ref()),
            own: own.map(str::to_owned),
            options,
            entries: Vec::new(),
            bad: Vec::new(),
            last_scan_ns: 0,
        };
        source.rescan()?;
        Ok(source)
    }

    /// The replicas' directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lists the directory now.
    pub fn rescan(&mut self) -> Result<(), Error> {
        let listing = match std::fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(io) if io.kind() == std::io::ErrorKind::NotFound => {
                self.entries.clear();
                self.bad.clear();
                self.last_scan_ns = monotonic_ns().max(1);
                return Ok(());
            }
            Err(io) => {
                return Err(Error::Directory {
                    dir: self.dir.clone(),
                    io,
                })
            }
        };
        let mut old: HashMap<Arc<str>, Entry> = std::mem::take(&mut self.entries)
            .into_iter()
            .map(|e| (e.id.clone(), e))
            .collect();
        let mut old_bad: HashMap<String, Bad> = std::mem::take(&mut self.bad)
            .into_iter()
            .map(|b| (b.error.name.clone(), b))
            .collect();
        let (mut entries, mut bad) = (Vec::new(), Vec::new());
        let now = monotonic_ns();
        for entry in listing.flatten() {
            let inode = entry.ino();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                bad.push(Bad {
                    inode,
                    error: EngineError::new(
                        entry.file_name().to_string_lossy(),
                        FormatError::RefusedEntry {
                            path: entry.path(),
                            what: "name is not UTF-8, so no replica id".to_owned(),
                        },
                    ),
                });
                continue;
            };
            // Writers' temporary files, and the reader's own record.
            if (name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_file()))
                || self.own.as_deref() == Some(name.as_str())
            {
                continue;
            }
            if let Some(mut kept) = old.remove(name.as_str()) {
                if kept.file.inode() == inode && !kept.file.is_truncated() {
                    kept.writer_check.at_listing(
                        kept.file.header(),
                        kept.file.heartbeat_mono_ns(),
                        now,
                    );
                    entries.push(kept);
                    continue;
                }
            }
            if let Some(kept) = old_bad.remove(&name) {
                if kept.inode == inode {
                    bad.push(kept);
                    continue;
                }
            }
            match RouterFile::open(entry.path()) {
                Ok(file) => entries.push(Entry::new(file)),
                Err(FormatError::Io { io, .. }) if io.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => bad.push(Bad {
                    inode,
                    error: EngineError::new(name, error),
                }),
            }
        }
        entries.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        bad.sort_unstable_by(|a, b| a.error.name.cmp(&b.error.name));
        self.entries = entries;
        self.bad = bad;
        self.last_scan_ns = monotonic_ns().max(1);
        Ok(())
    }

    /// [`ReplicaSource::read_into`] with ages measured from `now_mono_ns`.
    pub fn read_at(&mut self, out: &mut ReplicaReading, now_mono_ns: u64) -> Result<(), Error> {
        out.clear();
        let real_now = monotonic_ns();
        let interval = self.options.rescan_interval.as_nanos() as u64;
        // A retired file (a closed or replaced replica) reads dead until
        // the next listing drops it or maps its replacement.
        if self.last_scan_ns == 0 || real_now.saturating_sub(self.last_scan_ns) >= interval {
            self.rescan()?;
        }
        for entry in &mut self.entries {
            let (state, error) = entry.read(now_mono_ns, &self.options);
            if let Some(error) = error {
                out.errors.push(EngineError::new(&*entry.id, error));
            }
            out.replicas.push(state);
        }
        out.errors.extend(self.bad.iter().map(|b| b.error.clone()));
        Ok(())
    }
}

impl ReplicaSource for ShmReplicas {
    fn read_into(&mut self, out: &mut ReplicaReading) -> Result<(), Error> {
        self.read_at(out, monotonic_ns())
    }

    fn uri(&self) -> String {
        format!("file://{}", self.dir.display())
    }
}
