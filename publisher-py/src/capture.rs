//! `engine_state._native.RequestCapture`: the per-request half of the vLLM
//! hook's capture (DESIGN §3), in Rust because it runs on vLLM's scheduler
//! thread and touches every live request.
//!
//! It knows no vLLM attribute name of its own: the hook's adapter module
//! (`engine_state/vllm/_adapter.py`) passes them in, so every name the hook
//! reads still lives in that one module. The names are interned once; a
//! capture is then a few `getattr`s per request with no Python frame (the
//! adapter points `tokens_attr` at the token list itself, so `num_tokens` is
//! `len()` of it instead of a property call).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

/// Aggregates the snapshot fields that depend on individual requests.
#[pyclass(module = "engine_state._native", name = "RequestCapture", frozen)]
pub(crate) struct RequestCapture {
    prompt_attr: Py<PyString>,
    computed_attr: Py<PyString>,
    tokens_attr: Py<PyString>,
    tokens_is_sequence: bool,
    status_attr: Py<PyString>,
    preempted_status: Py<PyAny>,
}

/// The sums of one capture, accumulated request by request.
#[derive(Debug, Default)]
struct Totals {
    num_running: u64,
    num_waiting: u64,
    pending_prefill_tokens: u64,
    ongoing_decode_tokens: u64,
    num_prefilling: u64,
    max_prefill_remaining: u64,
    num_preempted: u64,
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
            prompt_attr: PyString::intern(py, prompt_attr).unbind(),
            computed_attr: PyString::intern(py, computed_attr).unbind(),
            tokens_attr: PyString::intern(py, tokens_attr).unbind(),
            tokens_is_sequence,
            status_attr: PyString::intern(py, status_attr).unbind(),
            preempted_status,
        }
    }

    /// Returns `(num_running, num_waiting, pending_prefill_tokens,
    /// ongoing_decode_tokens, num_prefilling, max_prefill_remaining,
    /// num_preempted)` for the `running` requests and the requests of every
    /// queue in `waiting_queues` (each request in exactly one of them).
    fn capture(
        &self,
        running: &Bound<'_, PyAny>,
        waiting_queues: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<(u64, u64, u64, u64, u64, u64, u64)> {
        let mut totals = Totals::default();
        for_each(running, |request| {
            let fields = self.fields(request)?;
            let remaining = fields.remaining_prefill();
            totals.num_running += 1;
            totals.add_prefill(remaining);
            if remaining > 0 {
                totals.num_prefilling += 1;
            } else {
                totals.ongoing_decode_tokens += fields.tokens.max(0) as u64;
            }
            Ok(())
        })?;
        for queue in &waiting_queues {
            for_each(queue, |request| {
                totals.num_waiting += 1;
                totals.add_prefill(self.fields(request)?.remaining_prefill());
                if self.is_preempted(request)? {
                    totals.num_preempted += 1;
                }
                Ok(())
            })?;
        }
        Ok((
            totals.num_running,
            totals.num_waiting,
            totals.pending_prefill_tokens,
            totals.ongoing_decode_tokens,
            totals.num_prefilling,
            totals.max_prefill_remaining,
            totals.num_preempted,
        ))
    }

    /// The remaining prefill of one request (DESIGN §3), for tests and tools.
    fn remaining_prefill(&self, request: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.fields(request)?.remaining_prefill())
    }
}

/// The three numbers a request's remaining prefill is computed from.
#[derive(Debug, Clone, Copy)]
struct RequestFields {
    prompt: i64,
    computed: i64,
    tokens: i64,
}

impl RequestFields {
    /// DESIGN §3. Output tokens exist exactly when `num_tokens >
    /// num_prompt_tokens`, and the newest sampled token is decode work, not
    /// prefill. Floored at 0: with async scheduling `computed` can run one
    /// token ahead of `num_tokens`.
    fn remaining_prefill(self) -> u64 {
        let remaining = if self.tokens > self.prompt {
            self.tokens - 1 - self.computed
        } else {
            self.prompt - self.computed
        };
        remaining.max(0) as u64
    }
}

impl RequestCapture {
    fn fields(&self, request: &Bound<'_, PyAny>) -> PyResult<RequestFields> {
        let py = request.py();
        let get = |name: &Py<PyString>| request.getattr(name.bind(py));
        let prompt: i64 = get(&self.prompt_attr)?.extract()?;
        let computed: i64 = get(&self.computed_attr)?.extract()?;
        let value = get(&self.tokens_attr)?;
        let tokens = if self.tokens_is_sequence {
            value.len()? as i64
        } else {
            value.extract()?
        };
        Ok(RequestFields {
            prompt,
            computed,
            tokens,
        })
    }

    fn is_preempted(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        let status = request.getattr(self.status_attr.bind(request.py()))?;
        let preempted = self.preempted_status.bind(request.py());
        Ok(status.is(preempted) || status.eq(preempted)?)
    }
}

impl Totals {
    fn add_prefill(&mut self, remaining: u64) {
        self.pending_prefill_tokens += remaining;
        self.max_prefill_remaining = self.max_prefill_remaining.max(remaining);
    }
}

/// Calls `f` on every item of `queue`, indexing lists directly (the running
/// list) and iterating anything else (vLLM's waiting queues).
fn for_each<'py>(
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
