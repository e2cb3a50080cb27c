//! `engine_state._native._RequestTotals`: the sums of one capture, as a
//! snapshot being accumulated. The captures add requests to it with the
//! snapshot's aggregation (`Snapshot::add_running`, `Snapshot::add_waiting`);
//! `publish` completes it with the scheduler-wide fields and publishes it.
//!
//! Python sees the fields the sums write (`Snapshot::REQUEST_FIELDS`, named
//! once by shm-format's `request_fields!`) read-only and by name, and, for
//! tests and tools that compare a capture with a tuple, as a tuple of them in
//! that order.

use engine_state_shm_format::Snapshot;
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::PyTuple;

use crate::publisher::Publisher;

/// The sums of one capture: a snapshot whose request fields are summed and
/// whose other fields are 0 until `publish`.
#[pyclass(module = "engine_state._native", name = "_RequestTotals", frozen)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Totals {
    sums: Snapshot,
}

/// How many values the tuple view has.
const LEN: usize = Snapshot::REQUEST_FIELDS.len();

impl From<Snapshot> for Totals {
    /// The totals of these sums (only their request fields are read).
    fn from(sums: Snapshot) -> Totals {
        Totals { sums }
    }
}

impl Totals {
    /// The snapshot the captures add requests to.
    pub(crate) fn sums_mut(&mut self) -> &mut Snapshot {
        &mut self.sums
    }

    /// The values in the order of `Snapshot::REQUEST_FIELDS`.
    fn values(&self) -> [u64; LEN] {
        Snapshot::REQUEST_FIELDS.map(|name| self.sums.field(name).unwrap_or_default())
    }

    /// The snapshot these sums are part of.
    fn snapshot(
        &self,
        step: u64,
        gpu_blocks_total: u64,
        gpu_blocks_free: u64,
        flags: u64,
    ) -> Snapshot {
        Snapshot {
            step,
            gpu_blocks_total,
            gpu_blocks_free,
            flags,
            ..self.sums
        }
    }

    /// Publishes the snapshot of these sums and the scheduler-wide fields
    /// through `publisher` (as `Publisher.publish` does: `captured_*` stamped
    /// there, the idle flag from `num_running` and `num_waiting`).
    fn publish_through(
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

    /// Equal to another `_RequestTotals` with the same sums, or to the tuple
    /// of its values in the order of `Snapshot::REQUEST_FIELDS`.
    fn equals(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(other) = other.downcast::<Totals>() {
            return *other.get() == *self;
        }
        other.downcast::<PyTuple>().is_ok_and(|tuple| {
            tuple
                .extract::<[u64; LEN]>()
                .is_ok_and(|v| v == self.values())
        })
    }

    /// The value at `index` in the order of `Snapshot::REQUEST_FIELDS`
    /// (negative indices count from the end), as in a tuple.
    fn item(&self, index: isize) -> PyResult<u64> {
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

    fn repr(&self) -> String {
        let fields: Vec<String> = Snapshot::REQUEST_FIELDS
            .iter()
            .zip(self.values())
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        format!("_RequestTotals({})", fields.join(", "))
    }
}

/// The Python methods, with one read-only attribute per request field.
/// (pyo3 takes one `#[pymethods]` block per class, so the whole block is
/// emitted here; each method only calls the Rust one above.)
macro_rules! totals_methods {
    ($($field:ident,)*) => {
        #[pymethods]
        impl Totals {
            $(
                #[getter]
                fn $field(&self) -> u64 {
                    self.sums.$field
                }
            )*

            /// Publishes the snapshot of these sums and the scheduler-wide
            /// fields through `publisher` (as `Publisher.publish` does:
            /// `captured_*` stamped there, the idle flag from `num_running`
            /// and `num_waiting`).
            #[pyo3(signature = (publisher, *, step, gpu_blocks_total, gpu_blocks_free, flags))]
            fn publish(
                &self,
                publisher: &Bound<'_, Publisher>,
                step: u64,
                gpu_blocks_total: u64,
                gpu_blocks_free: u64,
                flags: u64,
            ) -> PyResult<()> {
                self.publish_through(publisher, step, gpu_blocks_total, gpu_blocks_free, flags)
            }

            /// True when the engine has requests (running or waiting).
            #[getter]
            fn busy(&self) -> bool {
                self.sums.has_requests()
            }

            /// Equal to another `_RequestTotals` with the same sums, or to
            /// the tuple of its values (tests and tools); not ordered.
            /// (`__richcmp__`, not `__eq__`: pyo3's `__eq__` wrapper does not
            /// compile when expanded inside a `macro_rules!`.)
            fn __richcmp__(
                &self,
                other: &Bound<'_, PyAny>,
                op: CompareOp,
            ) -> PyResult<Py<PyAny>> {
                let py = other.py();
                match op {
                    CompareOp::Eq => Ok(self.equals(other).into_pyobject(py)?.to_owned().into_any().unbind()),
                    CompareOp::Ne => Ok((!self.equals(other)).into_pyobject(py)?.to_owned().into_any().unbind()),
                    _ => Ok(py.NotImplemented()),
                }
            }

            fn __len__(&self) -> usize {
                LEN
            }

            /// The value at `index`, as in a tuple.
            fn __getitem__(&self, index: isize) -> PyResult<u64> {
                self.item(index)
            }

            fn __repr__(&self) -> String {
                self.repr()
            }
        }
    };
}

engine_state_shm_format::request_fields!(totals_methods);
