//! One engine's cache digest on shared memory (docs/FORMAT.md, "Cache
//! residency"): the file `<dir>.cache/<id>` mapped lazily, read again only
//! when the snapshot's `cache_version` moves past the digest held (else the
//! same `Arc`), and what could not be read reported as that engine's error
//! without costing every read a system call or a spin.

use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

use engine_state_shm_format::{cache_dir, CacheDigest, DigestError, DigestFile};

use crate::error::{EngineError, Error, FormatError};

/// What a reader holds of one engine's digest.
#[derive(Debug, Default)]
pub(super) struct CacheSlot {
    /// The digest file, mapped at the first version that needed it.
    file: Option<DigestFile>,
    /// The last digest read, and the engine generation it belongs to.
    held: Option<(u64, Arc<CacheDigest>)>,
    /// The sequence word of a torn read: the file is not read again until
    /// it changes (a writer that died mid-write leaves it torn for good).
    torn_seq: Option<u64>,
    /// A version whose digest could not be had: not tried again until the
    /// snapshot names another one.
    failed: Option<Failed>,
}

#[derive(Debug)]
struct Failed {
    /// The snapshot's `cache_version` then.
    version: u64,
    error: EngineError,
    /// A damaged digest ([`Error::CorruptCache`]) is reported at every
    /// read (as a damaged engine file is); a missing one
    /// ([`Error::MissingCache`]) only once per version.
    every_read: bool,
    reported: bool,
}

impl CacheSlot {
    /// The digest of engine `id` (in the state directory `dir`) for a
    /// snapshot naming `version` (its `cache_version`; 0: none) of
    /// `generation`.
    ///
    /// The held digest is handed out again while it is at least that
    /// version and of that generation (the writer writes a digest before a
    /// snapshot names it, so the file may be ahead of the snapshot, never
    /// behind). Otherwise the file is read: mapped first (or again, once its
    /// writer retired it for a new one, it was truncated, or it is of
    /// another generation).
    #[inline]
    pub(super) fn digest(
        &mut self,
        dir: &Path,
        id: &str,
        generation: u64,
        version: u64,
    ) -> Option<Arc<CacheDigest>> {
        if version == 0 {
            return None;
        }
        match &self.held {
            // A retired file's digest is not used (docs/FORMAT.md, "Cache
            // residency"): its writer closed it, so what it held may be gone.
            Some((held_generation, digest))
                if *held_generation == generation
                    && digest.version() >= version
                    && !self.file.as_ref().is_some_and(DigestFile::is_retired) =>
            {
                return Some(digest.clone());
            }
            _ => {}
        }
        self.read(dir, id, generation, version)
    }

    #[cold]
    fn read(
        &mut self,
        dir: &Path,
        id: &str,
        generation: u64,
        version: u64,
    ) -> Option<Arc<CacheDigest>> {
        if self.failed.as_ref().is_some_and(|f| f.version == version) {
            return None;
        }
        let stale = |file: &DigestFile| {
            file.is_retired() || file.is_truncated() || file.generation() != generation
        };
        if self.file.as_ref().is_none_or(stale) {
            self.torn_seq = None;
            let path = cache_dir(dir).join(id);
            match DigestFile::open(&path) {
                Ok(file) => self.file = Some(file),
                Err(FormatError::Io { io, .. }) if io.kind() == ErrorKind::NotFound => {
                    self.file = None;
                    return self.fail(
                        id,
                        &path,
                        version,
                        format!(
                            "the snapshot names digest version {version}, but there is no \
                             digest file"
                        ),
                        false,
                    );
                }
                Err(error) => {
                    self.file = None;
                    return self.fail(id, &path, version, error.to_string(), true);
                }
            }
        }
        let file = self.file.as_ref().expect("opened above");
        if file.is_retired() {
            // Its writer closed it (and has not put a new one in place):
            // no digest, and nothing wrong to report.
            self.held = None;
            return None;
        }
        if file.generation() != generation {
            // A digest of another run of the engine (its writer has not
            // written one for this run yet): not used.
            let what = format!(
                "it belongs to generation {} of the engine, not to generation {generation} that \
                 names digest version {version}",
                file.generation()
            );
            let path = file.path().to_owned();
            return self.fail(id, &path, version, what, false);
        }
        if self.torn_seq.is_some_and(|seq| seq == file.seq()) {
            return None;
        }
        // The held digest's allocation is refilled when no caller holds it
        // any more (the usual case: a reading is cleared before the next):
        // a moved digest then costs the copy alone, no allocation. A caller
        // that still holds it keeps it unchanged: the read goes to a new one.
        let mut digest: Arc<CacheDigest> = self
            .held
            .take()
            .and_then(|(_, mut held)| Arc::get_mut(&mut held).is_some().then_some(held))
            .unwrap_or_default();
        let into = Arc::get_mut(&mut digest).expect("unique: checked or new");
        match file.read_into(into) {
            Ok(()) if into.version() < version => {
                let what = format!(
                    "it holds version {}, older than the version {version} the snapshot names",
                    into.version()
                );
                let path = file.path().to_owned();
                self.fail(id, &path, version, what, false)
            }
            Ok(()) => {
                self.held = Some((generation, digest.clone()));
                self.torn_seq = None;
                self.failed = None;
                Some(digest)
            }
            Err(DigestError::Torn(torn)) => {
                // Read again once the writer stores something (the next
                // read, for a live writer mid-write).
                self.torn_seq = Some(torn.last_seq);
                None
            }
            Err(error) => {
                let path = file.path().to_owned();
                self.fail(id, &path, version, error.to_string(), true)
            }
        }
    }

    /// Remembers that `version`'s digest could not be had, and why.
    #[cold]
    fn fail(
        &mut self,
        id: &str,
        path: &Path,
        version: u64,
        what: String,
        every_read: bool,
    ) -> Option<Arc<CacheDigest>> {
        let (engine_id, location) = (id.to_owned(), path.display().to_string());
        // A damaged digest is reported at every read; one that is not there
        // (yet) is not damage, and is said once.
        let error = Error::cache_fault(every_read, engine_id, location, what);
        self.failed = Some(Failed {
            version,
            error: EngineError::new(id, error),
            every_read,
            reported: false,
        });
        None
    }

    /// Why a read whose snapshot named `version` got no digest, when the
    /// reader knows ([`Error::CorruptCache`], [`Error::MissingCache`]), at
    /// every call: unlike [`CacheSlot::error`], which says a missing digest
    /// once. None when nothing is wrong or a read was torn (read again).
    pub(super) fn fault(&self, version: u64) -> Option<&EngineError> {
        self.failed
            .as_ref()
            .filter(|failed| version != 0 && failed.version == version)
            .map(|failed| &failed.error)
    }

    /// The error to report with a read whose snapshot named `version`, if
    /// any: a damaged digest at every read while the snapshot names its
    /// version, a missing one once.
    #[inline]
    pub(super) fn error(&mut self, version: u64) -> Option<EngineError> {
        let failed = self.failed.as_mut()?;
        if failed.version != version || (failed.reported && !failed.every_read) {
            return None;
        }
        failed.reported = true;
        Some(failed.error.clone())
    }
}
