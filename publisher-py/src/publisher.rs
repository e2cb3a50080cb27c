//! `engine_state.Publisher`.

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
    inner: engine_state_publisher::Publisher,
}

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
        Ok(Publisher { inner })
    }

    /// Publishes one snapshot. Fields not given are 0; `captured_*` are stamped
    /// here and the idle flag follows from `num_running` and `num_waiting`.
    /// ValueError (nothing published) when `gpu_blocks_free` exceeds
    /// `gpu_blocks_total` or `flags` has bits other than FLAG_IDLE and
    /// FLAG_SHUTTING_DOWN.
    #[pyo3(signature = (
        *,
        step = 0,
        num_running = 0,
        num_waiting = 0,
        gpu_blocks_total = 0,
        gpu_blocks_free = 0,
        pending_prefill_tokens = 0,
        ongoing_decode_tokens = 0,
        num_prefilling = 0,
        max_prefill_remaining = 0,
        num_preempted = 0,
        flags = 0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &mut self,
        step: u64,
        num_running: u64,
        num_waiting: u64,
        gpu_blocks_total: u64,
        gpu_blocks_free: u64,
        pending_prefill_tokens: u64,
        ongoing_decode_tokens: u64,
        num_prefilling: u64,
        max_prefill_remaining: u64,
        num_preempted: u64,
        flags: u64,
    ) -> PyResult<()> {
        let snapshot = Snapshot {
            step,
            num_running,
            num_waiting,
            gpu_blocks_total,
            gpu_blocks_free,
            pending_prefill_tokens,
            ongoing_decode_tokens,
            num_prefilling,
            max_prefill_remaining,
            num_preempted,
            flags,
            ..Snapshot::default()
        };
        self.inner.publish(snapshot).map_err(publisher_error)
    }

    /// Counters: `files_lost` (times the file was found removed, replaced or truncated
    /// under the publisher) and `files_recreated` (times it was recreated, in
    /// a new generation, once its directory existed again).
    fn stats(&self) -> std::collections::HashMap<&'static str, u64> {
        let stats = self.inner.stats();
        [
            ("files_lost", stats.files_lost),
            ("files_recreated", stats.files_recreated),
        ]
        .into()
    }

    /// Stops the heartbeat, retires the file and removes it. Idempotent.
    fn close(&mut self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }

    /// The engine id.
    #[getter]
    fn engine_id(&self) -> &str {
        self.inner.engine_id()
    }

    /// The URI published to (password hidden).
    #[getter]
    fn uri(&self) -> String {
        self.inner.config().uri.to_string()
    }

    /// The file being published, or None once closed (and for Redis).
    #[getter]
    fn path(&self) -> Option<String> {
        self.inner.path().map(|p| p.display().to_string())
    }

    /// The heartbeat period in milliseconds.
    #[getter]
    fn period_ms(&self) -> u64 {
        self.inner.config().period.as_millis() as u64
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        !self.inner.is_open()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (_exc_type=None, _exc_value=None, _traceback=None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyType>>,
        _exc_value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        py.detach(|| self.inner.close());
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Publisher(engine_id={:?}, uri={:?}, closed={})",
            self.inner.engine_id(),
            self.inner.config().uri.to_string(),
            !self.inner.is_open()
        )
    }
}
