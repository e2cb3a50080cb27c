//! `engine_state._native`: the compiled core of the `engine-state` Python
//! package. The public Python API is re-exported by `engine_state/__init__.py`.

use pyo3::prelude::*;

mod capture;
mod errors;
mod identity;
mod incremental;
mod publisher;
mod reader;
mod request_reader;
mod residency;
mod router;
mod to_python;
mod totals;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<publisher::Publisher>()?;
    m.add_class::<reader::Reader>()?;
    m.add_class::<reader::EngineState>()?;
    m.add_class::<router::Router>()?;
    m.add_class::<router::Decision>()?;
    m.add_class::<router::Reservation>()?;
    m.add_function(wrap_pyfunction!(router::block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(router::default_cache_capacity, m)?)?;
    m.add(
        "BLOCK_TOKENS",
        engine_state_shm_format::blocks::BLOCK_TOKENS,
    )?;
    m.add_class::<capture::RequestCapture>()?;
    m.add_class::<totals::Totals>()?;
    m.add_class::<incremental::IncrementalCapture>()?;
    m.add_class::<residency::ResidencyTracker>()?;
    m.add_function(wrap_pyfunction!(identity::engine_id_for, m)?)?;
    m.add_function(wrap_pyfunction!(identity::fallback_engine_id, m)?)?;
    m.add(
        "EngineStateError",
        m.py().get_type::<errors::EngineStateError>(),
    )?;
    m.add("EngineIdInUse", m.py().get_type::<errors::EngineIdInUse>())?;
    m.add(
        "FIELD_NAMES",
        engine_state_shm_format::Snapshot::FIELD_NAMES.to_vec(),
    )?;
    m.add("JSON_KEYS", engine_state_reader::JSON_KEYS.to_vec())?;
    m.add("FLAG_IDLE", engine_state_shm_format::FLAG_IDLE)?;
    m.add(
        "FLAG_SHUTTING_DOWN",
        engine_state_shm_format::FLAG_SHUTTING_DOWN,
    )?;
    m.add("LAYOUT_VERSION", engine_state_shm_format::LAYOUT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // `__all__` (what `import *` takes) names the public API only: the vLLM
    // hook's internals (underscored) stay out.
    let all: Vec<String> = m.getattr("__all__")?.extract()?;
    let public: Vec<String> = all
        .into_iter()
        .filter(|name| !name.starts_with('_') || name == "__version__")
        .collect();
    m.setattr("__all__", public)?;
    Ok(())
}
