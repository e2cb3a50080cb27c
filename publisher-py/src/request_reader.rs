//! How the vLLM hook's capture reads a request: the interned attribute names
//! it is read through, the reads themselves, and the walk over a queue.
//!
//! It knows no vLLM attribute name of its own: the hook's adapter module
//! (`engine_state/vllm/_adapter.py`) passes them in, so every name the hook
//! reads still lives in that one module. The names are interned once; a
//! read is then a few `getattr`s per request with no Python frame (the
//! adapter points `tokens_attr` at the token list itself, so `num_tokens` is
//! `len()` of it instead of a property call).

use engine_state_shm_format::{RequestTokens, Snapshot, WaitingRequest};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

/// The interned attribute names a request is read through.
pub(crate) struct RequestReader {
    prompt_attr: Py<PyString>,
    computed_attr: Py<PyString>,
    tokens_attr: Py<PyString>,
    tokens_is_sequence: bool,
    status_attr: Py<PyString>,
    preempted_status: Py<PyAny>,
}

impl RequestReader {
    /// `prompt_attr`, `computed_attr`: the request's prompt length and computed
    /// tokens. `tokens_attr`: its token count, or (when `tokens_is_sequence`)
    /// the list of all its tokens, whose length is the count. `status_attr`
    /// and `preempted_status`: the status attribute and the value (compared by
    /// identity, then equality) that marks a preempted request.
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

    /// The request's token counts.
    pub(crate) fn tokens_of(&self, request: &Bound<'_, PyAny>) -> PyResult<RequestTokens> {
        let prompt = self.prompt(request)?;
        self.tokens_with_prompt(request, prompt)
    }

    /// The request's prompt length.
    pub(crate) fn prompt(&self, request: &Bound<'_, PyAny>) -> PyResult<i64> {
        request
            .getattr(self.prompt_attr.bind(request.py()))?
            .extract()
    }

    /// The request's token counts, its prompt length already known.
    pub(crate) fn tokens_with_prompt(
        &self,
        request: &Bound<'_, PyAny>,
        prompt: i64,
    ) -> PyResult<RequestTokens> {
        let computed = self.computed(request)?;
        let tokens = self.tokens(&self.tokens_value(request)?)?;
        Ok(RequestTokens {
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
    pub(crate) fn waiting(&self, request: &Bound<'_, PyAny>) -> PyResult<WaitingRequest> {
        Ok(WaitingRequest {
            remaining_prefill: self.tokens_of(request)?.remaining_prefill(),
            preempted: self.is_preempted(request)?,
        })
    }

    /// Reads every running request into `sums`.
    pub(crate) fn add_running(
        &self,
        running: &Bound<'_, PyAny>,
        sums: &mut Snapshot,
    ) -> PyResult<()> {
        for_each(running, |request| {
            sums.add_running(self.tokens_of(request)?);
            Ok(())
        })
    }

    /// Reads every request of a waiting queue into `sums`.
    pub(crate) fn add_waiting(
        &self,
        queue: &Bound<'_, PyAny>,
        sums: &mut Snapshot,
    ) -> PyResult<()> {
        for_each(queue, |request| {
            sums.add_waiting(self.waiting(request)?);
            Ok(())
        })
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
