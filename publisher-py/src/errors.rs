//! Rust errors as Python exceptions: bad settings (an invalid value the
//! caller passed) are `ValueError`; an engine id another live process
//! publishes is `EngineIdInUse`; the rest — I/O, threads, Redis — are
//! `EngineStateError`.

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::PyErr;

pyo3::create_exception!(
    engine_state,
    EngineStateError,
    PyException,
    "An engine-state operation failed; the message says what to do."
);

pyo3::create_exception!(
    engine_state,
    EngineIdInUse,
    EngineStateError,
    "Another live process already publishes this engine id (same directory or Redis prefix)."
);

pub(crate) fn publisher_error(error: engine_state_publisher::Error) -> PyErr {
    use engine_state_publisher::Error as E;
    match &error {
        E::Config { .. } | E::BadUri(_) | E::InvalidSnapshot { .. } | E::InvalidCache { .. } => {
            PyValueError::new_err(error.to_string())
        }
        E::Shm(engine_state_shm_format::Error::InvalidEngineId { .. }) => {
            PyValueError::new_err(error.to_string())
        }
        E::AlreadyPublished { .. }
        | E::Shm(
            engine_state_shm_format::Error::AlreadyPublished { .. }
            | engine_state_shm_format::Error::LiveFileWrongSize { .. }
            | engine_state_shm_format::Error::ReplicaInUse { .. },
        )
        | E::Redis(engine_state_reader::redis::Error::ReplicaInUse { .. }) => {
            EngineIdInUse::new_err(error.to_string())
        }
        _ => EngineStateError::new_err(error.to_string()),
    }
}

pub(crate) fn reader_error(error: engine_state_reader::Error) -> PyErr {
    match &error {
        engine_state_reader::Error::BadUri { .. } => PyValueError::new_err(error.to_string()),
        _ => EngineStateError::new_err(error.to_string()),
    }
}
