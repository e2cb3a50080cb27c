//! `engine_state.Publisher`.

use std::sync::atomic::Ordering;

use engine_state_publisher::PublisherConfig;
use engine_state_shm_format::Snapshot;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::errors::publisher_error;

/// Publishes one engine's snapshots into shared memory, or to Redis with a
/// `redis://` URI (a sink thread writes; `publish` never waits on the network).
///
/// Settings default to `AGENTIC_ENGINE_STATE_URI`, `AGENTIC_WORKER_ID` and
/// `AGENTIC_ENGINE_STATE_PERIOD_MS`. Creating one (which may connect to
/// Redis and claim the engine's key) and `close()` (which may wait up to 1 s
/// for the sink to delete the key) release the GIL while they wait. A native
/// heartbeat thread (no GIL) keeps the engine alive for readers between
/// publishes; it also recreates the file (new generation) when it was removed
/// under the publisher, once its directory exists again (see `stats()`).
/// Fork-safe: a child process
/// cannot write its parent's file (it must create its own Publisher).
#[pyclass(module = "engine_state._native", name = "Publisher")]
pub(crate) struct Publisher {
    /// None once closed: `close()` takes it out under a short borrow and
    /// closes it with the GIL released, so that another thread's call in the
    /// meantime gets the "closed" error, not pyo3's "Already borrowed".
    inner: Option<engine_state_publisher::Publisher>,
    engine_id: String,
    /// The URI, password hidden.
    uri: String,
    period_ms: u64,
    /// The counters when `close()` began.
    closed_stats: Stats,
}

/// `stats()`: every key for both backends (0 where it does not apply).
type Stats = [(&'static str, u64); 7];

fn stats_of(inner: &engine_state_publisher::Publisher) -> Stats {
    let files = inner.stats();
    let counter =
        |read: fn(&engine_state_publisher::SinkStats) -> u64| inner.redis_stats().map_or(0, read);
    [
        ("files_lost", files.files_lost),
        ("files_recreated", files.files_recreated),
        ("written", counter(|s| s.written.load(Ordering::Relaxed))),
        ("replaced", counter(|s| s.replaced.load(Ordering::Relaxed))),
        ("errors", counter(|s| s.errors.load(Ordering::Relaxed))),
        ("refused", counter(|s| s.refused.load(Ordering::Relaxed))),
        (
            "registry_errors",
            counter(|s| s.registry_errors.load(Ordering::Relaxed)),
        ),
    ]
}

impl Publisher {
    /// The open publisher, or the "closed" error.
    fn open(&mut self) -> PyResult<&mut engine_state_publisher::Publisher> {
        match self.inner.as_mut() {
            Some(inner) => Ok(inner),
            None => Err(publisher_error(engine_state_publisher::Error::Closed {
                engine_id: self.engine_id.clone(),
            })),
        }
    }

    /// Publishes `snapshot` (`publish()`, and the vLLM hook's captures
    /// through `_RequestTotals.publish`).
    pub(crate) fn publish_snapshot(&mut self, snapshot: Snapshot) -> PyResult<()> {
        self.open()?.publish(snapshot).map_err(publisher_error)
    }

    /// Publishes a cache digest (`publish_cache`; the residency tracker
    /// hands its blocks here directly, without a Python list).
    pub(crate) fn publish_cache_blocks(
        &mut self,
        blocks: &[u64],
        held: u64,
        capacity: usize,
        kv_block_size: Option<u32>,
    ) -> PyResult<bool> {
        let inner = self.open()?;
        if let Some(tokens) = kv_block_size {
            inner.set_cache_kv_block_size(tokens);
        }
        inner
            .publish_cache(blocks, held, capacity)
            .map_err(publisher_error)
    }

    /// Closes with the GIL released, holding no borrow of `slf` meanwhile.
    fn close_released(mut slf: PyRefMut<'_, Self>) {
        let Some(mut inner) = slf.inner.take() else {
            return;
        };
        slf.closed_stats = stats_of(&inner);
        let py = slf.py();
        drop(slf);
        py.detach(move || inner.close());
    }
}

/// The Python methods. `publish` takes one keyword-only argument per
/// snapshot field but the stamps (`Snapshot::CAPTURE_STAMPS`,
/// `Snapshot::CACHE_STAMPS`), from shm-format's `snapshot_fields!` (the
/// `@settable` rules drop the stamps): pyo3 parses
/// them as declared arguments (the fast path, and its own errors for an
/// unknown keyword, a positional argument or a value out of range). pyo3
/// takes one `#[pymethods]` block per class, so the whole block is emitted
/// here.
macro_rules! publisher_methods {
    (@settable [$($field:ident)*] $(#[$doc:meta])* captured_mono_ns = $word:literal, $($rest:tt)*) => {
        publisher_methods!(@settable [$($field)*] $($rest)*);
    };
    (@settable [$($field:ident)*] $(#[$doc:meta])* captured_unix_ns = $word:literal, $($rest:tt)*) => {
        publisher_methods!(@settable [$($field)*] $($rest)*);
    };
    (@settable [$($field:ident)*] $(#[$doc:meta])* cache_blocks = $word:literal, $($rest:tt)*) => {
        publisher_methods!(@settable [$($field)*] $($rest)*);
    };
    (@settable [$($field:ident)*] $(#[$doc:meta])* cache_version = $word:literal, $($rest:tt)*) => {
        publisher_methods!(@settable [$($field)*] $($rest)*);
    };
    (@settable [$($field:ident)*] $(#[$doc:meta])* $next:ident = $word:literal, $($rest:tt)*) => {
        publisher_methods!(@settable [$($field)* $next] $($rest)*);
    };
    (@settable [$($field:ident)*]) => {
        #[pymethods]
        impl Publisher {
            #[new]
            #[pyo3(signature = (uri=None, engine_id=None, period_ms=None, file_mode=None))]
            fn new(
                py: Python<'_>,
                uri: Option<&str>,
                engine_id: Option<&str>,
                period_ms: Option<u64>,
                file_mode: Option<u32>,
            ) -> PyResult<Publisher> {
                let config = PublisherConfig::resolve(uri, engine_id, period_ms, file_mode)
                    .map_err(publisher_error)?;
                let inner = py
                    .detach(|| engine_state_publisher::Publisher::start(config))
                    .map_err(publisher_error)?;
                Ok(Publisher {
                    engine_id: inner.engine_id().to_owned(),
                    uri: inner.config().uri.to_string(),
                    period_ms: inner.config().period.as_millis() as u64,
                    closed_stats: Stats::default(),
                    inner: Some(inner),
                })
            }

            /// Publishes one snapshot: one keyword per field of `FIELD_NAMES`
            /// (`captured_*` and `cache_*` excepted: they are stamped here, the
            /// cache words from the last digest); fields not given are
            /// 0, and the idle flag follows from `num_running` and `num_waiting`.
            /// ValueError (nothing published) when `gpu_blocks_free` exceeds
            /// `gpu_blocks_total` or `flags` has bits other than FLAG_IDLE and
            /// FLAG_SHUTTING_DOWN.
            #[pyo3(signature = (*, $($field = 0),*))]
            #[allow(clippy::too_many_arguments)]
            fn publish(&mut self, $($field: u64),*) -> PyResult<()> {
                self.publish_snapshot(Snapshot {
                    $($field,)*
                    ..Snapshot::default()
                })
            }

            /// Publishes the engine's cache digest (docs/FORMAT.md, "Cache
            /// residency"): `blocks` are the router block hashes
            /// (`block_hashes`) the engine holds in full, in any order, at most
            /// `capacity` of them; `held` how many it held before a cut to the
            /// capacity (at least `len(blocks)`). Writes a new digest version
            /// and returns True when the set differs from the last one, else
            /// does nothing and returns False; every later `publish()` stamps
            /// `cache_blocks` and `cache_version` from it. ValueError (nothing
            /// published) for more blocks than `capacity`, a capacity above
            /// the format's bound, or `held` below `len(blocks)`.
            /// `kv_block_size`: the engine's KV block size in tokens, for the
            /// digest's header from now on (a change rewrites the digest;
            /// None, the default, keeps the one given last, 0 at first).
            #[pyo3(signature = (blocks, held, capacity, kv_block_size=None))]
            fn publish_cache(
                &mut self,
                blocks: Vec<u64>,
                held: u64,
                capacity: usize,
                kv_block_size: Option<u32>,
            ) -> PyResult<bool> {
                self.publish_cache_blocks(&blocks, held, capacity, kv_block_size)
            }

            /// Counters, every key for both backends (0 where it does not apply;
            /// once closed, the counts when `close()` began).
            ///
            /// Shared memory: `files_lost` (times the file was found removed,
            /// replaced or truncated under the publisher) and `files_recreated` (times it was
            /// recreated, in a new generation, once its directory existed again).
            /// Redis: `written` (records Redis acknowledged), `replaced` (records a
            /// newer one replaced before they were sent), `errors` (failed
            /// connections and writes), `refused` (records not written because
            /// another live process writes this engine id; logged on stderr) and
            /// `registry_errors` (registrations refused because the registry key
            /// is not a set; logged on stderr).
            fn stats(&self) -> std::collections::HashMap<&'static str, u64> {
                match &self.inner {
                    Some(inner) => stats_of(inner).into(),
                    None => self.closed_stats.into(),
                }
            }

            /// Stops the heartbeat, retires the file and removes it (Redis: deletes
            /// the key), with the GIL released. Idempotent; a `publish()` from
            /// another thread meanwhile raises the "closed" error.
            fn close(slf: PyRefMut<'_, Self>) {
                Publisher::close_released(slf);
            }

            /// The engine id.
            #[getter]
            fn engine_id(&self) -> &str {
                &self.engine_id
            }

            /// The URI published to (password hidden).
            #[getter]
            fn uri(&self) -> &str {
                &self.uri
            }

            /// The file being published, or None once closed (and for Redis).
            #[getter]
            fn path(&self) -> Option<String> {
                let inner = self.inner.as_ref()?;
                inner.path().map(|p| p.display().to_string())
            }

            /// The heartbeat period in milliseconds.
            #[getter]
            fn period_ms(&self) -> u64 {
                self.period_ms
            }

            /// True once closed.
            #[getter]
            fn closed(&self) -> bool {
                !self.inner.as_ref().is_some_and(|inner| inner.is_open())
            }

            fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
                slf
            }

            #[pyo3(signature = (_exc_type=None, _exc_value=None, _traceback=None))]
            fn __exit__(
                slf: PyRefMut<'_, Self>,
                _exc_type: Option<&Bound<'_, PyType>>,
                _exc_value: Option<&Bound<'_, PyAny>>,
                _traceback: Option<&Bound<'_, PyAny>>,
            ) -> bool {
                Publisher::close_released(slf);
                false
            }

            fn __repr__(&self) -> String {
                format!(
                    "Publisher(engine_id={:?}, uri={:?}, closed={})",
                    self.engine_id,
                    self.uri,
                    self.closed()
                )
            }
        }
    };
    ($($fields:tt)*) => {
        publisher_methods!(@settable [] $($fields)*);
    };
}

engine_state_shm_format::snapshot_fields!(publisher_methods);
