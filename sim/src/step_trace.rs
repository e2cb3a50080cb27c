//! `essim step-trace`: one engine model driven step by step through a
//! scenario, printing its state after every step, so that a test can run the
//! same scenario through vLLM's real `Scheduler` and compare the two step by
//! step (sim/tests_vllm/test_engine_vs_vllm.py, docs/ROUTING.md "Model vs
//! vLLM").
//!
//! A step is one `schedule()` + `update_from_output()` pair, as
//! `EngineCore.step` makes it. Requests arrive before the `schedule()` of
//! their `arrival_step`; a step index at which the engine holds no request is
//! skipped (EngineCore does not schedule an idle engine), so step numbers
//! follow the scenario's clock, not the count of steps run.

use std::collections::BTreeMap;

use engine_state_shm_format::Snapshot;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use crate::engine::{Admission, Engine, EngineRequest};
use crate::error::SimError;
use crate::profile::EngineProfile;

/// A scenario: requests with their arrival steps.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepScenario {
    /// The requests (any order; ids unique).
    pub requests: Vec<ScenarioRequest>,
    /// Stop after this step index even if work is left (default: run until
    /// every request has finished).
    #[serde(default)]
    pub max_steps: Option<u64>,
}

/// One request of a scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioRequest {
    /// Its id.
    pub id: u64,
    /// The step before whose `schedule()` it is added.
    pub arrival_step: u64,
    /// Prompt tokens.
    pub prompt_len: u64,
    /// Output tokens (the request finishes when it has sampled them).
    pub output_len: u64,
    /// Chained hashes of the prompt's full 16-token blocks (see
    /// [`EngineRequest::block_hashes`]).
    #[serde(default)]
    pub block_hashes: Vec<u64>,
}

/// The engine after one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// The scenario's step index.
    pub step: u64,
    /// `(request id, tokens)` scheduled, in scheduling order.
    pub scheduled: Vec<(u64, u64)>,
    /// Requests preempted by this step, in order.
    pub preempted: Vec<u64>,
    /// Requests admitted from the waiting queue, with their prefix-cache lookup.
    pub admitted: Vec<Admission>,
    /// Requests that sampled their last token.
    pub finished: Vec<u64>,
    /// The engine's snapshot after the step ([`Engine::snapshot`]).
    pub state: Snapshot,
}

/// Snapshot fields a record's JSON leaves out: the capture and cache stamps
/// (never set by the model; the digest is checked by its own tests), the engine's own step count (the record's `step` is the
/// scenario's), the fixed block count and the flags. Every other field is
/// written under its snapshot name, in word order, as vLLM's side of the
/// comparison names it.
const NOT_COMPARED: [&str; 3] = ["step", "gpu_blocks_total", "flags"];

impl Serialize for StepRecord {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("step", &self.step)?;
        map.serialize_entry("scheduled", &self.scheduled)?;
        map.serialize_entry("preempted", &self.preempted)?;
        map.serialize_entry("admitted", &self.admitted)?;
        map.serialize_entry("finished", &self.finished)?;
        for (name, value) in self.state.fields() {
            if !NOT_COMPARED.contains(&name)
                && !Snapshot::CAPTURE_STAMPS.contains(&name)
                && !Snapshot::CACHE_STAMPS.contains(&name)
            {
                map.serialize_entry(name, &value)?;
            }
        }
        map.end()
    }
}

/// Run `scenario` through one engine with `profile`; one record per step run.
pub fn step_trace(
    profile: &EngineProfile,
    scenario: &StepScenario,
) -> Result<Vec<StepRecord>, SimError> {
    profile.validate()?;
    let mut engine = Engine::new(profile.clone());
    let mut arrivals: BTreeMap<u64, Vec<&ScenarioRequest>> = BTreeMap::new();
    let mut ids = std::collections::HashSet::new();
    for r in &scenario.requests {
        if !ids.insert(r.id) {
            return Err(SimError::Config(format!(
                "step-trace scenario: request id {} appears twice (ids must be unique)",
                r.id
            )));
        }
        if r.output_len == 0 || !engine.fits(r.prompt_len, r.output_len) {
            return Err(SimError::Config(format!(
                "step-trace scenario: request {} ({} + {} tokens) needs output_len ≥ 1 and \
                 must fit the profile's KV cache ({} blocks of 16 tokens)",
                r.id,
                r.prompt_len,
                r.output_len,
                engine.total_blocks()
            )));
        }
        arrivals.entry(r.arrival_step).or_default().push(r);
    }
    let mut records = Vec::new();
    let mut step = 0;
    loop {
        if scenario.max_steps.is_some_and(|max| step > max) {
            break;
        }
        for r in arrivals.remove(&step).unwrap_or_default() {
            engine.add_request(EngineRequest {
                id: r.id,
                prompt_len: r.prompt_len,
                output_len: r.output_len,
                block_hashes: r.block_hashes.clone(),
                router_block_hashes: Vec::new(),
            });
        }
        if engine.num_requests() == 0 {
            match arrivals.keys().next() {
                Some(&next) => {
                    step = next;
                    continue;
                }
                None => break,
            }
        }
        let scheduled = engine.schedule();
        let output = engine.finish_step(&scheduled);
        records.push(StepRecord {
            step,
            scheduled: scheduled.scheduled,
            preempted: scheduled.preempted,
            admitted: scheduled.admitted,
            finished: output.finished,
            state: engine.snapshot(),
        });
        step += 1;
    }
    Ok(records)
}

#[cfg(test)]
#[path = "step_trace_tests.rs"]
mod tests;
