//! The engine-id rule for Python (`engine_state.vllm.engine_id_for` and the
//! hook's fallback on a clash): `engine_state_settings`' rule, so that the
//! hook and every other publisher name engines the same way.

use engine_state_settings::{DataParallel, ENGINE_ID_ENV};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The engine id of a vLLM engine (README.md, "Configuration"):
/// `AGENTIC_WORKER_ID` when set (in `environ`, default the process
/// environment), with `-dp<dp_index>` appended when `dp_size` > 1; otherwise
/// `<host>-dp<dp_index>-<pid>` (`hostname` and `pid` default to this host's and
/// process's).
#[pyfunction]
#[pyo3(name = "_engine_id_for", signature = (dp_index, dp_size, environ=None, hostname=None, pid=None))]
pub(crate) fn engine_id_for(
    dp_index: u32,
    dp_size: u32,
    environ: Option<&Bound<'_, PyAny>>,
    hostname: Option<&str>,
    pid: Option<u32>,
) -> PyResult<String> {
    let worker_id: Option<String> = match environ {
        Some(environ) => {
            let value = environ.call_method1("get", (ENGINE_ID_ENV,))?;
            // os.environ holds bytes that are not UTF-8 as lone surrogates.
            value.extract().map_err(|error| {
                if !value.is_instance_of::<pyo3::types::PyString>() {
                    return error;
                }
                let shown = value.repr().map(|r| r.to_string()).unwrap_or_default();
                PyValueError::new_err(
                    engine_state_settings::NotUnicode {
                        name: ENGINE_ID_ENV.to_owned(),
                        value: shown.trim_matches('\'').to_owned(),
                    }
                    .to_string(),
                )
            })?
        }
        // Not UTF-8: an error (the hook logs it once and turns itself off),
        // never the default id.
        None => engine_state_settings::env(ENGINE_ID_ENV)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    let host = match hostname {
        Some(host) => host.to_owned(),
        None => engine_state_settings::hostname(),
    };
    Ok(engine_state_settings::engine_id(
        worker_id.as_deref(),
        Some(DataParallel {
            index: dp_index,
            size: dp_size,
        }),
        &host,
        pid.unwrap_or_else(std::process::id),
    ))
}

/// The id to publish under when `engine_id` is in use by another live
/// process (`EngineIdInUse`): `<engine_id>-<pid>`, shortened to fit.
#[pyfunction]
#[pyo3(name = "_fallback_engine_id", signature = (engine_id, pid=None))]
pub(crate) fn fallback_engine_id(engine_id: &str, pid: Option<u32>) -> String {
    engine_state_settings::fallback_engine_id(engine_id, pid.unwrap_or_else(std::process::id))
}
