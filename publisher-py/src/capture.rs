//! `engine_state._native._RequestCapture`: the per-request half of the vLLM
//! hook's capture, in Rust because it runs on vLLM's scheduler thread and
//! touches every live request. It reads every request at every capture
//! (`request_reader.rs`) and adds each to the sums with the snapshot's own
//! aggregation (`shm-format/src/aggregate.rs`, shared with the simulator);
//! `_IncrementalCapture` (`incremental.rs`) reads only the requests that
//! may have changed.
//!
//! A capture returns its sums as one `_RequestTotals` (`totals.rs`), which
//! publishes itself: the request-dependent fields go from the capture into
//! the `Snapshot` by name, in Rust, never by position through Python. Both
//! classes are internal to the hook.

use pyo3::prelude::*;

use crate::request_reader::RequestReader;
use crate::totals::Totals;

/// Aggregates the snapshot fields that depend on individual requests.
#[pyclass(module = "engine_state._native", name = "_RequestCapture", frozen)]
pub(crate) struct RequestCapture {
    reader: RequestReader,
}

#[pymethods]
impl RequestCapture {
    /// The attribute names a request is read through (`RequestReader::new`).
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
        self.reader.add_running(running, totals.sums_mut())?;
        for queue in &waiting_queues {
            self.reader.add_waiting(queue, totals.sums_mut())?;
        }
        Ok(totals)
    }

    /// The remaining prefill of one request (`RequestTokens::remaining_prefill`),
    /// for tests and tools.
    fn remaining_prefill(&self, request: &Bound<'_, PyAny>) -> PyResult<u64> {
        Ok(self.reader.tokens_of(request)?.remaining_prefill())
    }
}
