//! `engine_state.Router`, `Decision`, `Reservation` and `block_hashes`.

use std::sync::Mutex;

use std::sync::Arc;

use engine_state_publisher::{ReplicaOptions, ReplicaPublisher, ReplicaStats};
use engine_state_reader::{open_replicas, ReaderOptions, ReplicaReading, ReplicaSource, StateUri};
use engine_state_router::{DecisionLog, Policy, Request, RouterSettings};
use engine_state_shm_format::EngineId;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict, PyType};

use crate::errors::{publisher_error, reader_error, EngineStateError};
use crate::reader::EngineState;

fn router_error(error: engine_state_router::Error) -> PyErr {
    use engine_state_router::Error as E;
    match error {
        E::InvalidSetting { .. }
        | E::InvalidRequest { .. }
        | E::ForeignReservation { .. }
        | E::UnknownInstance(_)
        | E::DuplicateInstance(_) => PyValueError::new_err(error.to_string()),
        E::AllShuttingDown => EngineStateError::new_err(error.to_string()),
        _ => PyRuntimeError::new_err(error.to_string()),
    }
}

/// A serde value as a Python object (dicts, lists, numbers, strings).
fn to_python<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// The embedded router: shadow counters per instance, `max(shadow, real)` with
/// fresh engine state, and the routing policies. Thread-safe.
#[pyclass(module = "engine_state._native", name = "Router", frozen)]
pub(crate) struct Router {
    inner: engine_state_router::Router,
    /// The peers' reservations and this replica's publishing counters,
    /// once `share_reservations` was called. Locked only with the GIL
    /// released (a read may wait on Redis): a thread that held the GIL
    /// while waiting for it would deadlock with one that holds it and
    /// waits for the GIL.
    sharing: Mutex<Option<Sharing>>,
}

/// What `share_reservations` set up.
struct Sharing {
    peers: Box<dyn ReplicaSource>,
    reading: ReplicaReading,
    stats: Arc<ReplicaStats>,
}

impl Router {
    fn sharing(&self) -> std::sync::MutexGuard<'_, Option<Sharing>> {
        self.sharing.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Router {
    /// `instances`: instance (engine) ids. `policy`: load_only, lmetric, sticky
    /// or unified. `settings`: a dict of router settings (e.g.
    /// `{"decode_weight": 0.01, "migration": {"rel_hi": 2.0}}`).
    /// `decision_log`: a path to append JSON Lines decision records to.
    #[new]
    #[pyo3(signature = (instances, *, policy=None, settings=None, decision_log=None))]
    fn new(
        py: Python<'_>,
        instances: Vec<String>,
        policy: Option<&str>,
        settings: Option<&Bound<'_, PyDict>>,
        decision_log: Option<&str>,
    ) -> PyResult<Router> {
        let mut parsed = match settings {
            Some(dict) => {
                // Numbers are range-checked by name before JSON: json.dumps
                // writes NaN/Infinity (which the JSON parser refuses without
                // naming the setting), and an int beyond a Rust integer fails
                // parsing with only a position. Unknown names and wrong types
                // are left to the parser, which reports them. Only the one
                // nested section (`migration`) is looked into, once: a
                // self-referential dict (d["migration"] = d) must not
                // recurse without end (json.dumps then refuses it).
                fn check_numbers(
                    dict: &Bound<'_, PyDict>,
                    prefix: &str,
                    nested: bool,
                ) -> PyResult<()> {
                    for (key, value) in dict.iter() {
                        let name = format!("{prefix}{key}");
                        if let Ok(inner) = value.downcast::<PyDict>() {
                            if nested && key.extract::<String>().is_ok_and(|k| k == "migration") {
                                check_numbers(inner, &format!("{name}."), false)?;
                            }
                        } else if value.is_instance_of::<pyo3::types::PyFloat>()
                            || (value.is_instance_of::<pyo3::types::PyInt>()
                                && !value.is_instance_of::<pyo3::types::PyBool>())
                        {
                            // An int too big for a double is beyond every range.
                            let number = value.extract::<f64>().unwrap_or(f64::INFINITY);
                            let float = value.is_instance_of::<pyo3::types::PyFloat>();
                            RouterSettings::check_number(&name, number, float)
                                .map_err(router_error)?;
                        }
                    }
                    Ok(())
                }
                check_numbers(dict, "", true)?;
                let text: String = py
                    .import("json")?
                    .call_method1("dumps", (dict,))?
                    .extract()?;
                serde_json::from_str::<RouterSettings>(&text)
                    .map_err(|e| PyValueError::new_err(format!("invalid router settings: {e}")))?
            }
            None => RouterSettings::default(),
        };
        if let Some(name) = policy {
            parsed.policy = name.parse::<Policy>().map_err(router_error)?;
        }
        let inner = engine_state_router::Router::with_instances(parsed, &instances)
            .map_err(router_error)?;
        if let Some(path) = decision_log {
            inner.set_decision_log(Some(DecisionLog::append_to(path).map_err(router_error)?));
        }
        Ok(Router {
            inner,
            sharing: Mutex::new(None),
        })
    }

    /// Shares this router's reservations with the other router replicas at
    /// `uri` (the engines' URI; default `AGENTIC_ENGINE_STATE_URI`) under
    /// `replica_id`, and reads theirs: from now on every pick, prefill_done
    /// and release is published, and `update_peers()` merges the peers'
    /// reservations (effective = max(own + peers, real)). Raises
    /// `EngineIdInUse` when another live router uses the replica id.
    #[pyo3(signature = (replica_id, uri=None))]
    fn share_reservations(
        &self,
        py: Python<'_>,
        replica_id: &str,
        uri: Option<&str>,
    ) -> PyResult<()> {
        let uri = StateUri::from_flag_or_env(uri).map_err(|e| reader_error(e.into()))?;
        let id = EngineId::new(replica_id)
            .map_err(|e| publisher_error(engine_state_publisher::Error::Shm(e)))?;
        py.detach(|| {
            let publisher = ReplicaPublisher::start(&uri, &id, ReplicaOptions::default())
                .map_err(publisher_error)?;
            let peers = open_replicas(&uri, Some(replica_id), ReaderOptions::default())
                .map_err(reader_error)?;
            let stats = publisher.stats();
            self.inner.set_reservation_sink(Some(Box::new(publisher)));
            *self.sharing() = Some(Sharing {
                peers,
                reading: ReplicaReading::default(),
                stats,
            });
            Ok(())
        })
    }

    /// Reads every peer replica's reservations now and merges them; returns
    /// how many (replica, engine) entries were taken. Call it before picks
    /// (a read of a peer that changed nothing is one load on shared
    /// memory). Raises `RuntimeError` before `share_reservations`.
    fn update_peers(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| {
            let mut sharing = self.sharing();
            let Sharing { peers, reading, .. } = sharing.as_mut().ok_or_else(|| {
                PyRuntimeError::new_err("call share_reservations(replica_id) before update_peers()")
            })?;
            peers.read_into(reading).map_err(reader_error)?;
            Ok(self.inner.update_from_replicas(reading))
        })
    }

    /// The per-replica errors of the last `update_peers()` (bad records in
    /// the routers' directory, foreign keys), as `"name: message"` strings.
    fn peer_errors(&self, py: Python<'_>) -> Vec<String> {
        py.detach(|| {
            self.sharing().as_ref().map_or_else(Vec::new, |sharing| {
                sharing
                    .reading
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", e.name, e.error))
                    .collect()
            })
        })
    }

    /// This replica's publishing counters: `published` (changes written),
    /// `errors` (changes that could not be: an invalid engine id, more than
    /// 256 engines), `recreated` (its file put back after another process
    /// removed it) and `last_error`; None when not sharing.
    fn sharing_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(stats) = py.detach(|| self.sharing().as_ref().map(|s| s.stats.clone())) else {
            return Ok(None);
        };
        let dict = PyDict::new(py);
        dict.set_item("published", stats.published())?;
        dict.set_item("errors", stats.errors())?;
        dict.set_item("recreated", stats.recreated())?;
        dict.set_item("last_error", stats.last_error())?;
        Ok(Some(dict))
    }

    /// Stops sharing: the replica's record is removed (its peers drop its
    /// reservations at their next read) and the peers' are forgotten.
    fn stop_sharing(&self, py: Python<'_>) {
        py.detach(|| {
            self.inner.set_reservation_sink(None);
            self.inner.clear_peer_reservations();
            *self.sharing() = None;
        })
    }

    /// Chooses an instance for a request and reserves it there, in one step.
    /// Give the prompt as `tokens` (token ids) or as chained 512-token
    /// `block_hashes` plus `input_len`. Returns `(Decision, Reservation)`.
    /// Instances whose fresh state said they are shutting down are skipped;
    /// when every instance is, raises `EngineStateError`.
    #[pyo3(signature = (request_id, *, tokens=None, block_hashes=None, input_len=None, session_id=None))]
    fn pick(
        &self,
        request_id: String,
        tokens: Option<Vec<u32>>,
        block_hashes: Option<Vec<u64>>,
        input_len: Option<u64>,
        session_id: Option<String>,
    ) -> PyResult<(Decision, Reservation)> {
        let request = request(request_id, tokens, block_hashes, input_len, session_id)?;
        let (decision, reservation) = self.inner.pick(&request).map_err(router_error)?;
        Ok((Decision::from(decision), Reservation { inner: reservation }))
    }

    /// This router's id, unique in the process: a `Reservation`'s
    /// `router_id` says which router made it.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    /// Stores the real state of engines, e.g. `router.update_real_state(reader.read())`.
    /// Only fresh state is ever merged, and it ages from when it was read
    /// (an old `EngineState` handed over late is already stale). Returns how
    /// many instances were updated.
    fn update_real_state(&self, states: Vec<PyRef<'_, EngineState>>) -> usize {
        self.inner
            .update_real_state(states.iter().map(|s| (s.id().to_owned(), s.real_state())))
    }

    /// The migration trigger and target for a request that would run on
    /// `source` and holds no reservation yet (advise before reserving), as a
    /// dict. For a request a pick already reserved, use
    /// `migration_advice_for(reservation, ...)`: asked here while a
    /// reservation for `request_id` is live on `source`, it would count the
    /// request against itself, so it raises `ValueError`.
    #[pyo3(signature = (source, request_id, *, tokens=None, block_hashes=None, input_len=None, session_id=None))]
    #[allow(clippy::too_many_arguments)] // mirrors pick(): the prompt's forms are keywords
    fn migration_advice<'py>(
        &self,
        py: Python<'py>,
        source: &str,
        request_id: String,
        tokens: Option<Vec<u32>>,
        block_hashes: Option<Vec<u64>>,
        input_len: Option<u64>,
        session_id: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = request(request_id, tokens, block_hashes, input_len, session_id)?;
        to_python(
            py,
            &self
                .inner
                .migration_advice(&request, source)
                .map_err(router_error)?,
        )
    }

    /// The migration trigger and target for a request already reserved by
    /// `reservation` (the source is its instance), with its own reservation
    /// left out of the source's load, as a dict. `ValueError` for a
    /// reservation another `Router` made (it changes nothing).
    #[pyo3(signature = (reservation, request_id, *, tokens=None, block_hashes=None, input_len=None, session_id=None))]
    #[allow(clippy::too_many_arguments)] // mirrors pick(): the prompt's forms are keywords
    fn migration_advice_for<'py>(
        &self,
        py: Python<'py>,
        reservation: PyRef<'_, Reservation>,
        request_id: String,
        tokens: Option<Vec<u32>>,
        block_hashes: Option<Vec<u64>>,
        input_len: Option<u64>,
        session_id: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let request = request(request_id, tokens, block_hashes, input_len, session_id)?;
        to_python(
            py,
            &self
                .inner
                .migration_advice_for(&request, &reservation.inner)
                .map_err(router_error)?,
        )
    }

    /// Migrates a request already reserved by `reservation` if the trigger
    /// fires and a target exists: reserves it on the target, releases it on
    /// the old instance, and `reservation` then holds the new instance (one
    /// step). Returns the `Decision`, or `None` when the request stays.
    /// `ValueError` for a reservation another `Router` made (nothing changes
    /// on either router).
    #[pyo3(signature = (reservation, request_id, *, tokens=None, block_hashes=None, input_len=None, session_id=None))]
    #[allow(clippy::too_many_arguments)] // mirrors pick(): the prompt's forms are keywords
    fn migrate(
        &self,
        mut reservation: PyRefMut<'_, Reservation>,
        request_id: String,
        tokens: Option<Vec<u32>>,
        block_hashes: Option<Vec<u64>>,
        input_len: Option<u64>,
        session_id: Option<String>,
    ) -> PyResult<Option<Decision>> {
        let request = request(request_id, tokens, block_hashes, input_len, session_id)?;
        let moved = self
            .inner
            .migrate_reservation(&request, &mut reservation.inner)
            .map_err(router_error)?;
        Ok(moved.map(Decision::from))
    }

    /// Adds an instance.
    fn add_instance(&self, instance_id: &str) -> PyResult<()> {
        self.inner.add_instance(instance_id).map_err(router_error)
    }

    /// Removes an instance (its counters and sessions go with it).
    fn remove_instance(&self, instance_id: &str) -> PyResult<()> {
        self.inner
            .remove_instance(instance_id)
            .map_err(router_error)
    }

    /// Forgets a session's instance; returns whether it was known.
    fn end_session(&self, session_id: &str) -> bool {
        self.inner.end_session(session_id)
    }

    /// Every instance's shadow counters and effective state, as dicts.
    fn instances<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.inner.instances())
    }

    /// Decisions made and reservations completed, failed, dropped and
    /// migrated away.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.inner.stats())
    }

    /// The settings in force, as a dict.
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, self.inner.settings())
    }
}

fn request(
    request_id: String,
    tokens: Option<Vec<u32>>,
    block_hashes: Option<Vec<u64>>,
    input_len: Option<u64>,
    session_id: Option<String>,
) -> PyResult<Request> {
    let request =
        match (tokens, block_hashes, input_len) {
            (Some(tokens), None, None) => Request::from_tokens(request_id, tokens),
            (None, Some(hashes), Some(len)) => Request::from_block_hashes(request_id, hashes, len),
            _ => return Err(PyValueError::new_err(
                "give the prompt either as tokens=[...] or as block_hashes=[...] with input_len=N",
            )),
        };
    Ok(match session_id {
        Some(session) => request.with_session(session),
        None => request,
    })
}

/// One routing decision.
#[pyclass(module = "engine_state._native", name = "Decision", frozen, get_all)]
pub(crate) struct Decision {
    request_id: String,
    session_id: Option<String>,
    instance_id: String,
    reason: &'static str,
    input_len: u64,
    cache_hit_tokens: u64,
    /// `engine` (the instance's fresh cache digest) or `estimated`.
    cache_knowledge: &'static str,
    new_prefill_tokens: u64,
    consulted_real_state: bool,
}

impl From<engine_state_router::Decision> for Decision {
    fn from(d: engine_state_router::Decision) -> Decision {
        Decision {
            request_id: d.request_id,
            session_id: d.session_id,
            instance_id: d.instance_id,
            reason: d.reason.name(),
            input_len: d.input_len,
            cache_hit_tokens: d.cache_hit_tokens,
            cache_knowledge: d.cache_knowledge.name(),
            new_prefill_tokens: d.new_prefill_tokens,
            consulted_real_state: d.consulted_real_state,
        }
    }
}

#[pymethods]
impl Decision {
    fn __repr__(&self) -> String {
        format!(
            "Decision(request_id={:?}, instance_id={:?}, reason={:?}, new_prefill_tokens={})",
            self.request_id, self.instance_id, self.reason, self.new_prefill_tokens
        )
    }
}

/// The load a pick reserved on an instance. `prefill_done()` when the first
/// token streams, then `complete()` or `fail()`; as a context manager it
/// completes on success and fails on an exception; dropping it unreleased
/// releases it too.
#[pyclass(module = "engine_state._native", name = "Reservation")]
pub(crate) struct Reservation {
    inner: engine_state_router::Reservation,
}

#[pymethods]
impl Reservation {
    /// Moves the request's prefill tokens to decode.
    fn prefill_done(&mut self) {
        self.inner.prefill_done();
    }

    /// Releases everything the request reserved (success).
    fn complete(&mut self) {
        self.inner.complete();
    }

    /// Releases everything the request reserved (failure).
    fn fail(&mut self) {
        self.inner.fail();
    }

    /// The instance the load is reserved on.
    #[getter]
    fn instance_id(&self) -> String {
        self.inner.instance_id().to_owned()
    }

    /// The id of the router that made it (`Router.id`): only that router
    /// may migrate it or advise on it.
    #[getter]
    fn router_id(&self) -> u64 {
        self.inner.router_id()
    }

    /// True once completed, failed or released.
    #[getter]
    fn released(&self) -> bool {
        self.inner.is_released()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (exc_type=None, _exc_value=None, _traceback=None))]
    fn __exit__(
        &mut self,
        exc_type: Option<&Bound<'_, PyType>>,
        _exc_value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        if exc_type.is_some() {
            self.inner.fail();
        } else {
            self.inner.complete();
        }
        false
    }
}

/// Chained 512-token block hashes of a prompt (the router's prefix keys).
#[pyfunction]
pub(crate) fn block_hashes(tokens: Vec<u32>) -> Vec<u64> {
    engine_state_router::block_hashes(&tokens)
}

/// The default capacity of an engine's cache digest for `publish_cache`:
/// `gpu_blocks_total x kv_block_size / BLOCK_TOKENS`, at most the entries a
/// digest may hold (docs/FORMAT.md, "Capacity and overflow").
#[pyfunction]
pub(crate) fn default_cache_capacity(gpu_blocks_total: u64, kv_block_size: u64) -> usize {
    engine_state_shm_format::default_cache_capacity(gpu_blocks_total, kv_block_size)
}
