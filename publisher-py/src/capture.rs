//! `engine_state._native._RequestCapture`: the per-request half of the vLLM
//! hook's capture (DESIGN §3), in Rust because it runs on vLLM's scheduler
//! thread and touches every live request. It reads every request at every
//! capture; `_IncrementalCapture` (`incremental.rs`) reads only the requests
//! that may have changed, and uses this one's reader and sums.
//!
//! A capture returns its sums as one typed `_RequestTotals` object, which
//! publishes itself (`_RequestTotals.publish`): the request-dependent fields
//! go from the capture into the `Snapshot` by name, in Rust, never by
//! position through Python. Both classes are internal to the hook.
//!
//! It knows no vLLM attribute name of its own: the hook's adapter module
//! (`engine_state/vllm/_adapter.py`) passes them in, so every name the hook
//! reads still lives in that one module. The names are interned once; a
//! capture is then a few `getattr`s per request with no Python frame (the
//! adapter points `tokens_attr` at the token list itself, so `num_tokens` is
//! `len()` of it instead of a property call).

use engine_state_shm_format::Snapshot;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::publisher::Publisher;

/// Aggregates the snapshot fields that depend on individual requests.
#[pyclass(module = "engine_state._native", name = "_RequestCapture", frozen)]
pub(crate) struct RequestCapture {
    reader: RequestReader,
}

/// The interned attribute names a request is read through.
pub(crate) struct RequestReader {
    prompt_attr: Py<PyString>,
    computed_attr: Py<PyString>,
    tokens_attr: Py<PyString>,
    tokens_is_sequence: bool,
    status_attr: Py<PyString>,
    preempted_status: Py<PyAny>,
}

/// The sums of one capture, accumulated request by request: the fields of a
/// `Snapshot` that depend on individual requests. Python sees them as
/// `_RequestTotals`, read-only and by name.
#[pyclass(
    module = "engine_state._native",
    name = "_RequestTotals",
    frozen,
    get_all
)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) num_running: u64,
    pub(crate) num_waiting: u64,
    pub(crate) pending_prefill_tokens: u64,
    pub(crate) ongoing_decode_tokens: u64,
    pub(crate) num_prefilling: u64,
    pub(crate) max_prefill_remaining: u64,
    pub(crate) num_preempted: u64,
}

/// `Totals`' fields in the order of its tuple view (`Totals::values`), for
/// tests and tools that compare a capture with a tuple.
const TOTALS_FIELDS: [&str; 7] = [
    "num_running",
    "num_waiting",
    "pending_prefill_tokens",
    "ongoing_decode_tokens",
    "num_prefilling",
    "max_prefill_remaining",
    "num_preempted",
];

/// What one waiting request adds to a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitingContribution {
    pub(crate) remaining_prefill: u64,
    pub(crate) preempted: bool,
}

#[pymethods]
impl RequestCapture {
    /// `prompt_attr`, `computed_attr`: the request's prompt length and computed
    /// tokens. `tokens_attr`: its token count, or (when `tokens_is_sequence`)
    /// the list of all its tokens, whose length is the count. `status_attr`
    /// and `preempted_status`: the status attribute and the value (compared by
    /// identity, then equality) that marks a preempted request.
    #[new]
    #[pyo3(signature = (*, prompt_attr, computed_attr, tokens_attr, tokens_is_sequence, status_attr, preempted_status))]
    fn new(
        py: Python<'_>,
        prompt_attr: &str,
        computed_attr: &str,
        tokens_attr: &str,
        tokens_is_sequence: bool,
        status_attr: &str,
        preempted_status: Py<PyAny>,
    ) -> RequestCapture {
        RequestCapture {
            reader: RequestReader::new(
                py,
                prompt_attr,
                computed_attr,
                tokens_attr,
                tokens_is_sequence,
                status_attr,
                preempted_status,
            ),
        }
    }

    /// The sums over the `running` requests and the requests of every queue
    /// in `waiting_queues` (each request in exactly one of them).
    fn capture(
        &self,
        running: &Bound<'_, PyAny>,
        waiting_queues: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Totals> {
        let mut totals = Totals::default();
        self.reader.add_running(running, &mut totals)?;
        for queue in &waiting_queues {
            for_each(queue, |request| {
                totals.add_waiting(self.reader.waiting_contribution(request)?);
                Ok(())
            })?;
        }
        Ok(totals)
    }

    /// The remaining prefill of one request (DESIGN §3), for tests and tools.
    fn remaining_prefill(&self, request: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.reader.fields(request)?.remaining_prefill())
    }
}

/// The three numbers a request's remaining prefill is computed from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestFields {
    pub(crate) prompt: i64,
    pub(crate) computed: i64,
    pub(crate) tokens: i64,
}

impl RequestFields {
    /// DESIGN §3. Output tokens exist exactly when `num_tokens >
    /// num_prompt_tokens`, and the newest sampled token is decode work, not
    /// prefill. Floored at 0: with async scheduling `computed` can run one
    /// token ahead of `num_tokens`.
    pub(crate) fn remaining_prefill(self) -> u64 {
        let remaining = if self.tokens > self.prompt {
            self.tokens - 1 - self.computed
        } else {
            self.prompt - self.computed
        };
        remaining.max(0) as u64
    }
}

impl RequestReader {
    pub(crate) fn new(
        py: Python<'_>,
        prompt_attr: &str,
        computed_attr: &str,
        tokens_attr: &str,
        tokens_is_sequence: bool,
        status_attr: &str,
        preempted_status: Py<PyAny>,
    ) -> RequestReader {
        RequestReader {
            prompt_attr: PyString::intern(py, prompt_attr).unbind(),
            computed_attr: PyString::intern(py, computed_attr).unbind(),
            tokens_attr: PyString::intern(py, tokens_attr).unbind(),
            tokens_is_sequence,
            status_attr: PyString::intern(py, status_attr).unbind(),
            preempted_status,
        }
    }

    pub(crate) fn fields(&self, request: &Bound<'_, PyAny>) -> PyResult<RequestFields> {
        let prompt = self.prompt(request)?;
        self.fields_with_prompt(request, prompt)
    }

    /// The request's prompt length.
    pub(crate) fn prompt(&self, request: &Bound<'_, PyAny>) -> PyResult<i64> {
        request
            .getattr(self.prompt_attr.bind(request.py()))?
            .extract()
    }

    /// The request's fields, its prompt length already known.
    pub(crate) fn fields_with_prompt(
        &self,
        request: &Bound<'_, PyAny>,
        prompt: i64,
    ) -> PyResult<RequestFields> {
        let computed = self.computed(request)?;
        let tokens = self.tokens(&self.tokens_value(request)?)?;
        Ok(RequestFields {
            prompt,
            computed,
            tokens,
        })
    }

    /// The request's computed tokens.
    pub(crate) fn computed(&self, request: &Bound<'_, PyAny>) -> PyResult<i64> {
        request
            .getattr(self.computed_attr.bind(request.py()))?
            .extract()
    }

    /// The value of the request's `tokens_attr`.
    pub(crate) fn tokens_value<'py>(
        &self,
        request: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        request.getattr(self.tokens_attr.bind(request.py()))
    }

    /// The token count, from the value of `tokens_attr`.
    pub(crate) fn tokens(&self, value: &Bound<'_, PyAny>) -> PyResult<i64> {
        if self.tokens_is_sequence {
            Ok(value.len()? as i64)
        } else {
            value.extract()
        }
    }

    /// True when `tokens_attr` is the token list itself (its length is the count).
    pub(crate) fn tokens_is_sequence(&self) -> bool {
        self.tokens_is_sequence
    }

    fn is_preempted(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        let status = request.getattr(self.status_attr.bind(request.py()))?;
        let preempted = self.preempted_status.bind(request.py());
        Ok(status.is(preempted) || status.eq(preempted)?)
    }

    /// Reads a waiting request: its remaining prefill and whether it is
    /// preempted.
    pub(crate) fn waiting_contribution(
        &self,
        request: &Bound<'_, PyAny>,
    ) -> PyResult<WaitingContribution> {
        Ok(WaitingContribution {
            remaining_prefill: self.fields(request)?.remaining_prefill(),
            preempted: self.is_preempted(request)?,
        })
    }

    /// Reads every running request into `totals`.
    pub(crate) fn add_running(
        &self,
        running: &Bound<'_, PyAny>,
        totals: &mut Totals,
    ) -> PyResult<()> {
        for_each(running, |request| {
            totals.add_running(self.fields(request)?);
            Ok(())
        })
    }
}

impl Totals {
    pub(crate) fn add_running(&mut self, fields: RequestFields) {
        let remaining = fields.remaining_prefill();
        self.num_running += 1;
        self.add_prefill(remaining);
        if remaining > 0 {
            self.num_prefilling += 1;
        } else {
            self.ongoing_decode_tokens += fields.tokens.max(0) as u64;
        }
    }

    pub(crate) fn add_prefill(&mut self, remaining: u64) {
        self.pending_prefill_tokens += remaining;
        self.max_prefill_remaining = self.max_prefill_remaining.max(remaining);
    }

    pub(crate) fn add_waiting(&mut self, contribution: WaitingContribution) {
        self.num_waiting += 1;
        self.add_prefill(contribution.remaining_prefill);
        self.num_preempted += u64::from(contribution.preempted);
    }

    /// The values in the order of `TOTALS_FIELDS`.
    fn values(&self) -> [u64; 7] {
        [
            self.num_running,
            self.num_waiting,
            self.pending_prefill_tokens,
            self.ongoing_decode_tokens,
            self.num_prefilling,
            self.max_prefill_remaining,
            self.num_preempted,
        ]
    }

    /// The snapshot these sums are part of, every field by name.
    pub(crate) fn snapshot(
        &self,
        step: u64,
        gpu_blocks_total: u64,
        gpu_blocks_free: u64,
        flags: u64,
    ) -> Snapshot {
        Snapshot {
            step,
            num_running: self.num_running,
            num_waiting: self.num_waiting,
            gpu_blocks_total,
            gpu_blocks_free,
            pending_prefill_tokens: self.pending_prefill_tokens,
            ongoing_decode_tokens: self.ongoing_decode_tokens,
            num_prefilling: self.num_prefilling,
            max_prefill_remaining: self.max_prefill_remaining,
            num_preempted: self.num_preempted,
            flags,
            ..Snapshot::default()
        }
    }
}

#[pymethods]
impl Totals {
    /// Publishes the snapshot of these sums and the scheduler-wide fields
    /// through `publisher` (as `Publisher.publish` does: `captured_*` stamped
    /// there, the idle flag from `num_running` and `num_waiting`).
    #[pyo3(signature = (publisher, *, step, gpu_blocks_total, gpu_blocks_free, flags))]
    fn publish(
        &self,
        publisher: &Bound<'_, Publisher>,
        step: u64,
        gpu_blocks_total: u64,
        gpu_blocks_free: u64,
        flags: u64,
    ) -> PyResult<()> {
        let snapshot = self.snapshot(step, gpu_blocks_total, gpu_blocks_free, flags);
        publisher.borrow_mut().publish_snapshot(snapshot)
    }

    /// True when the engine has requests (running or waiting).
    #[getter]
    fn busy(&self) -> bool {
        self.num_running + self.num_waiting > 0
    }

    /// Equal to another `_RequestTotals` with the same sums, or to the tuple
    /// of its values in the order of `TOTALS_FIELDS` (tests and tools).
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(other) = other.downcast::<Totals>() {
            return *other.get() == *self;
        }
        other
            .extract::<(u64, u64, u64, u64, u64, u64, u64)>()
            .is_ok_and(|t| <[u64; 7]>::from(t) == self.values())
    }

    fn __len__(&self) -> usize {
        TOTALS_FIELDS.len()
    }

    /// The value at `index` in the order of `TOTALS_FIELDS` (negative
    /// indices count from the end), as in a tuple.
    fn __getitem__(&self, index: isize) -> PyResult<u64> {
        let values = self.values();
        let at = if index < 0 {
            index + values.len() as isize
        } else {
            index
        };
        usize::try_from(at)
            .ok()
            .and_then(|at| values.get(at).copied())
            .ok_or_else(|| PyIndexError::new_err("_RequestTotals index out of range"))
    }

    fn __repr__(&self) -> String {
        let fields: Vec<String> = TOTALS_FIELDS
            .iter()
            .zip(self.values())
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        format!("_RequestTotals({})", fields.join(", "))
    }
}

/// Calls `f` on every item of `queue`, indexing lists directly (the running
/// list, a priority queue's heap) and iterating anything else (vLLM's FCFS
/// waiting deque).
pub(crate) fn for_each<'py>(
    queue: &Bound<'py, PyAny>,
    mut f: impl FnMut(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if let Ok(list) = queue.downcast::<PyList>() {
        for request in list.iter() {
            f(&request)?;
        }
        return Ok(());
    }
    for request in queue.try_iter()? {
        f(&request?)?;
    }
    Ok(())
}
