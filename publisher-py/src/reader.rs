//! `engine_state.Reader` and `engine_state.EngineState`.

use std::sync::Mutex;
use std::time::Duration;

use engine_state_reader::{
    millis, open, printable, Freshness, ReaderOptions, Reading, Source, StateUri,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::reader_error;

/// Reads every engine of a source: a shared-memory directory (lock-free) or a
/// Redis server (`redis://…`, one round trip per read).
///
/// Every call that can wait on the network (creating a Reader, `read()`,
/// `errors` while another thread reads) releases the GIL while it waits, so
/// a stalled Redis server stalls only the thread that reads, for at most the
/// URI's `?timeout_ms=` (500 ms by default).
#[pyclass(module = "engine_state._native", name = "Reader")]
pub(crate) struct Reader {
    // pyo3 needs Sync; one Python thread at a time reads through the lock.
    inner: Mutex<(Box<dyn Source>, Reading)>,
    /// The source's URI, password hidden (read without the lock).
    uri: String,
    /// Whether each read fills the engines' cache digests (`read_cache`).
    cache_digests: bool,
}

#[pymethods]
impl Reader {
    #[new]
    #[pyo3(signature = (uri=None, stale_after_ms=None, max_capture_age_ms=None, *, cache_digests=false))]
    fn new(
        py: Python<'_>,
        uri: Option<&str>,
        stale_after_ms: Option<u64>,
        max_capture_age_ms: Option<u64>,
        cache_digests: bool,
    ) -> PyResult<Reader> {
        let uri = StateUri::from_flag_or_env(uri).map_err(|e| reader_error(e.into()))?;
        let mut freshness = Freshness::default();
        if let Some(ms) = stale_after_ms {
            freshness.stale_after = Duration::from_millis(ms);
        }
        if let Some(ms) = max_capture_age_ms {
            freshness.max_capture_age = Duration::from_millis(ms);
        }
        let options = ReaderOptions {
            freshness,
            ..ReaderOptions::default()
        }
        .with_cache_digests(cache_digests);
        // Connecting to Redis may wait (at most the URI's timeout).
        let source = py.detach(|| open(&uri, options)).map_err(reader_error)?;
        Ok(Reader {
            uri: source.uri(),
            inner: Mutex::new((source, Reading::default())),
            cache_digests,
        })
    }

    /// One `EngineState` per readable engine, sorted by engine id. Files that
    /// cannot be read are listed in `errors` instead.
    ///
    /// The GIL is released for the whole read (a Redis round trip may wait
    /// up to the URI's timeout); other Python threads keep running.
    fn read(&self, py: Python<'_>) -> PyResult<Vec<EngineState>> {
        py.detach(|| {
            let mut guard = self.lock();
            let (source, reading) = &mut *guard;
            source.read_into(reading)?;
            Ok(reading.engines.iter().map(EngineState::from).collect())
        })
        .map_err(reader_error)
    }

    /// The cache digest of `engine_id` as of the last `read()`
    /// (docs/FORMAT.md, "Cache residency"): the router block hashes
    /// (`block_hashes`) of the 512-token prompt prefixes the engine holds,
    /// ascending. None when that read did not return the engine, when its
    /// status is not "fresh" (a digest is used only with a fresh state), or
    /// when the engine publishes no digest (`cache_version` 0) or its digest
    /// could not be read (then `errors` says why: class `corrupt_cache` for
    /// a damaged digest, `missing_cache` for one that is not there).
    /// A digest is read again only when the engine's `cache_version` moved.
    /// ValueError unless the Reader was created with `cache_digests=True`.
    fn read_cache(&self, py: Python<'_>, engine_id: &str) -> PyResult<Option<Vec<u64>>> {
        if !self.cache_digests {
            return Err(PyValueError::new_err(format!(
                "Reader({:?}) reads no cache digests: create it with cache_digests=True",
                self.uri
            )));
        }
        // Another thread may be inside read(): wait for it without the GIL.
        Ok(py.detach(|| {
            let guard = self.lock();
            let state = guard.1.get(engine_id)?;
            if !state.is_fresh() {
                return None;
            }
            state.cache.as_ref().map(|digest| digest.blocks().to_vec())
        }))
    }

    /// The per-engine errors of the last `read()` (bad or foreign files,
    /// FIFOs and other non-regular files, symbolic links, non-UTF-8 names;
    /// an unreachable or timed-out Redis server; an engine whose stamp is
    /// too far ahead of this host's clock, which `read()` also returns,
    /// status "stale"). Control characters and bidirectional overrides in
    /// them (a hostile file name is quoted) are escaped as esdump shows them
    /// (`\u{1b}`, `\n`), so printing or logging them cannot drive a terminal
    /// or forge log lines.
    #[getter]
    fn errors(&self, py: Python<'_>) -> Vec<String> {
        // Another thread may be inside read(): wait for it without the GIL.
        py.detach(|| {
            self.lock()
                .1
                .errors
                .iter()
                .map(|e| printable(&e.to_string()).into_owned())
                .collect()
        })
    }

    /// The source's URI (password hidden).
    #[getter]
    fn uri(&self) -> String {
        self.uri.clone()
    }

    fn __repr__(&self) -> String {
        format!("Reader(uri={:?})", self.uri)
    }
}

impl Reader {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Box<dyn Source>, Reading)> {
        // A panic while holding the lock leaves plain data behind: keep going.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One engine's state: the fields of `esdump --json`, read from the reader's
/// value it wraps.
#[pyclass(module = "engine_state._native", name = "EngineState", frozen)]
pub(crate) struct EngineState {
    /// What the reader returned: every attribute is read from it, and the
    /// router takes it as it is (`RealState::from` owns the status →
    /// freshness rule; nothing is rebuilt from the Python attributes).
    state: engine_state_reader::EngineState,
}

impl EngineState {
    /// The snapshot and freshness, as the router takes them.
    pub(crate) fn real_state(&self) -> engine_state_router::RealState {
        engine_state_router::RealState::from(&self.state)
    }

    pub(crate) fn id(&self) -> &str {
        &self.state.engine_id
    }

    /// The keys and values of `esdump --json`, made by the same `Serialize`
    /// (`reader/src/state.rs`), in the same order.
    fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        crate::to_python::to_dict(py, &self.state)
    }

    fn repr(&self) -> String {
        let s = &self.state;
        format!(
            "EngineState(engine_id={:?}, status={:?}, num_running={}, num_waiting={}, \
             pending_prefill_tokens={}, heartbeat_age_ms={:.1})",
            s.engine_id.as_ref(),
            s.status.as_str(),
            s.snapshot.num_running,
            s.snapshot.num_waiting,
            s.snapshot.pending_prefill_tokens,
            millis(s.heartbeat_age)
        )
    }
}

impl From<&engine_state_reader::EngineState> for EngineState {
    fn from(state: &engine_state_reader::EngineState) -> EngineState {
        EngineState {
            state: state.clone(),
        }
    }
}

/// The Python methods, with one read-only attribute per snapshot field
/// (`snapshot_fields!`, documented as the field is). pyo3 takes one
/// `#[pymethods]` block per class, so the whole block is emitted here.
macro_rules! engine_state_methods {
    ($($(#[$doc:meta])* $field:ident = $word:literal,)*) => {
        #[pymethods]
        impl EngineState {
            /// The engine id (file name / key suffix).
            #[getter]
            fn engine_id(&self) -> &str {
                &self.state.engine_id
            }

            /// "fresh", "stale", "dead" or "torn".
            #[getter]
            fn status(&self) -> &'static str {
                self.state.status.as_str()
            }

            $(
                $(#[$doc])*
                #[getter]
                fn $field(&self) -> u64 {
                    self.state.snapshot.$field
                }
            )*

            /// Time since the writer's last heartbeat, in ms.
            #[getter]
            fn heartbeat_age_ms(&self) -> f64 {
                millis(self.state.heartbeat_age)
            }

            /// Time since the snapshot was captured, in ms.
            #[getter]
            fn capture_age_ms(&self) -> f64 {
                millis(self.state.capture_age)
            }

            /// `1 - free / total` of the KV blocks; None without blocks.
            #[getter]
            fn gpu_kv_used_frac(&self) -> Option<f64> {
                self.state.gpu_kv_used_frac()
            }

            /// The generation of the writer's file or key (a restart makes a new one).
            #[getter]
            fn generation(&self) -> u64 {
                self.state.generation
            }

            /// True when the state may be used (status "fresh").
            #[getter]
            fn fresh(&self) -> bool {
                self.state.is_fresh()
            }

            /// The same keys as one object of `esdump --json`.
            fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                self.dict(py)
            }

            fn __repr__(&self) -> String {
                self.repr()
            }
        }
    };
}

engine_state_shm_format::snapshot_fields!(engine_state_methods);
