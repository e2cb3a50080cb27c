//! `engine_state.Reader` and `engine_state.EngineState`.

use std::sync::Mutex;
use std::time::Duration;

use engine_state_reader::{
    millis, open, printable, Freshness, ReaderOptions, Reading, Source, StateUri,
};
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
}

#[pymethods]
impl Reader {
    #[new]
    #[pyo3(signature = (uri=None, stale_after_ms=None, max_capture_age_ms=None))]
    fn new(
        py: Python<'_>,
        uri: Option<&str>,
        stale_after_ms: Option<u64>,
        max_capture_age_ms: Option<u64>,
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
        };
        // Connecting to Redis may wait (at most the URI's timeout).
        let source = py.detach(|| open(&uri, options)).map_err(reader_error)?;
        Ok(Reader {
            uri: source.uri(),
            inner: Mutex::new((source, Reading::default())),
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

/// One engine's state: the fields of `esdump --json`.
#[pyclass(module = "engine_state._native", name = "EngineState", frozen)]
pub(crate) struct EngineState {
    #[pyo3(get)]
    engine_id: String,
    #[pyo3(get)]
    status: &'static str,
    #[pyo3(get)]
    captured_mono_ns: u64,
    #[pyo3(get)]
    captured_unix_ns: u64,
    #[pyo3(get)]
    step: u64,
    #[pyo3(get)]
    num_running: u64,
    #[pyo3(get)]
    num_waiting: u64,
    #[pyo3(get)]
    gpu_blocks_total: u64,
    #[pyo3(get)]
    gpu_blocks_free: u64,
    #[pyo3(get)]
    pending_prefill_tokens: u64,
    #[pyo3(get)]
    ongoing_decode_tokens: u64,
    #[pyo3(get)]
    num_prefilling: u64,
    #[pyo3(get)]
    max_prefill_remaining: u64,
    #[pyo3(get)]
    num_preempted: u64,
    #[pyo3(get)]
    flags: u64,
    #[pyo3(get)]
    heartbeat_age_ms: f64,
    #[pyo3(get)]
    capture_age_ms: f64,
    #[pyo3(get)]
    gpu_kv_used_frac: Option<f64>,
    #[pyo3(get)]
    generation: u64,
    /// What the reader returned, for the router (`RealState::from` owns the
    /// status → freshness rule; nothing is rebuilt from the Python fields).
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
}

impl From<&engine_state_reader::EngineState> for EngineState {
    fn from(state: &engine_state_reader::EngineState) -> EngineState {
        let s = &state.snapshot;
        EngineState {
            engine_id: state.engine_id.to_string(),
            status: state.status.as_str(),
            captured_mono_ns: s.captured_mono_ns,
            captured_unix_ns: s.captured_unix_ns,
            step: s.step,
            num_running: s.num_running,
            num_waiting: s.num_waiting,
            gpu_blocks_total: s.gpu_blocks_total,
            gpu_blocks_free: s.gpu_blocks_free,
            pending_prefill_tokens: s.pending_prefill_tokens,
            ongoing_decode_tokens: s.ongoing_decode_tokens,
            num_prefilling: s.num_prefilling,
            max_prefill_remaining: s.max_prefill_remaining,
            num_preempted: s.num_preempted,
            flags: s.flags,
            heartbeat_age_ms: millis(state.heartbeat_age),
            capture_age_ms: millis(state.capture_age),
            gpu_kv_used_frac: state.gpu_kv_used_frac(),
            generation: state.generation,
            state: state.clone(),
        }
    }
}

#[pymethods]
impl EngineState {
    /// True when the state may be used (status "fresh").
    #[getter]
    fn fresh(&self) -> bool {
        self.status == "fresh"
    }

    /// The same keys as one object of `esdump --json`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("engine_id", &self.engine_id)?;
        d.set_item("captured_mono_ns", self.captured_mono_ns)?;
        d.set_item("captured_unix_ns", self.captured_unix_ns)?;
        d.set_item("step", self.step)?;
        d.set_item("num_running", self.num_running)?;
        d.set_item("num_waiting", self.num_waiting)?;
        d.set_item("gpu_blocks_total", self.gpu_blocks_total)?;
        d.set_item("gpu_blocks_free", self.gpu_blocks_free)?;
        d.set_item("pending_prefill_tokens", self.pending_prefill_tokens)?;
        d.set_item("ongoing_decode_tokens", self.ongoing_decode_tokens)?;
        d.set_item("num_prefilling", self.num_prefilling)?;
        d.set_item("max_prefill_remaining", self.max_prefill_remaining)?;
        d.set_item("num_preempted", self.num_preempted)?;
        d.set_item("flags", self.flags)?;
        d.set_item("status", self.status)?;
        d.set_item("heartbeat_age_ms", self.heartbeat_age_ms)?;
        d.set_item("capture_age_ms", self.capture_age_ms)?;
        d.set_item("gpu_kv_used_frac", self.gpu_kv_used_frac)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "EngineState(engine_id={:?}, status={:?}, num_running={}, num_waiting={}, \
             pending_prefill_tokens={}, heartbeat_age_ms={:.1})",
            self.engine_id,
            self.status,
            self.num_running,
            self.num_waiting,
            self.pending_prefill_tokens,
            self.heartbeat_age_ms
        )
    }
}
