//! Discovery: listing the directory (docs/ARCHITECTURE.md, "Discovery and
//! staleness"). New files are mapped, removed ones dropped, replaced ones
//! (another inode under the name) and truncated ones opened again, and what
//! cannot be read is kept as a per-engine error until its inode changes.

use std::collections::HashMap;
use std::os::unix::fs::DirEntryExt;
use std::sync::Arc;

use engine_state_shm_format::{monotonic_ns, ShmFile};
use nix::errno::Errno;

use super::entry::Entry;
use super::ShmDir;
use crate::error::{EngineError, Error, FormatError};
use crate::source::Source;

/// A directory entry that could not be read as an engine, by inode: it is
/// not opened again until another inode has its name.
#[derive(Debug)]
pub(super) struct Bad {
    inode: u64,
    pub(super) error: EngineError,
}

impl ShmDir {
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
    pub(super) fn rescan_if_due(&mut self, real_now_ns: u64) -> Result<(), Error> {
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
}

/// `EMFILE` (this process) or `ENFILE` (the system) — no descriptor to list with.
fn is_out_of_fds(errno: i32) -> bool {
    errno == Errno::EMFILE as i32 || errno == Errno::ENFILE as i32
}
