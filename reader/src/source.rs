//! One API over every backend.

use std::time::Duration;

use crate::error::{EngineError, Error};
use crate::freshness::Freshness;
#[cfg(feature = "redis")]
use crate::redis_source::RedisSource;
use crate::shm_dir::ShmDir;
use crate::state::{EngineState, Reading};
use crate::uri::StateUri;

/// A place engines publish into, read through one API whatever the backend.
pub trait Source: Send {
    /// Reads every engine into `out` (cleared first). An error here concerns
    /// the whole source; a single engine's trouble goes into `out.errors`.
    fn read_into(&mut self, out: &mut Reading) -> Result<(), Error>;

    /// Reads every engine.
    fn read(&mut self) -> Result<Reading, Error> {
        let mut out = Reading::default();
        self.read_into(&mut out)?;
        Ok(out)
    }

    /// The source's URI, passwords hidden.
    fn uri(&self) -> String;

    /// Why `state`, which this source's last read returned, has no cache
    /// digest although its snapshot names one, at every call:
    /// [`Error::CorruptCache`] (damaged) or [`Error::MissingCache`] (not
    /// there for it). [`Reading::errors`] says a missing digest once per
    /// version; this is for a caller that asks about one engine at a time
    /// (the C ABI's `es_read_cache`). None when nothing is known to be
    /// wrong (a torn read: read again); sources without digests say None.
    fn cache_fault(&self, state: &EngineState) -> Option<EngineError> {
        let _ = state;
        None
    }
}

/// Settings shared by every source.
#[derive(Clone, Copy, Debug)]
pub struct ReaderOptions {
    /// The staleness thresholds.
    pub freshness: Freshness,
    /// How often a source looks for new, removed and replaced engines
    /// (shared memory: a directory listing; Redis: `SMEMBERS` of the
    /// registry; default 250 ms).
    pub rescan_interval: Duration,
    /// Read each engine's cache digest into [`crate::EngineState::cache`]
    /// (docs/FORMAT.md, "Cache residency"; default off: a reader that does
    /// not route by cache pays nothing for it). A digest is read only when
    /// the snapshot's `cache_version` moved past the one held, else the
    /// same `Arc` is handed out again; routers and `esdump --cache` turn it on.
    pub cache_digests: bool,
}

impl ReaderOptions {
    /// These options with [`ReaderOptions::cache_digests`] set to `on`.
    pub fn with_cache_digests(self, on: bool) -> ReaderOptions {
        ReaderOptions {
            cache_digests: on,
            ..self
        }
    }
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            freshness: Freshness::default(),
            rescan_interval: Duration::from_millis(250),
            cache_digests: false,
        }
    }
}

/// Opens the source a URI names.
pub fn open(uri: &StateUri, options: ReaderOptions) -> Result<Box<dyn Source>, Error> {
    match uri {
        StateUri::Shm { dir } => Ok(Box::new(ShmDir::open(dir, options)?)),
        #[cfg(feature = "redis")]
        StateUri::Redis { target } => Ok(Box::new(RedisSource::open(target.clone(), options)?)),
        #[cfg(not(feature = "redis"))]
        StateUri::Redis { target } => match *target {},
    }
}
