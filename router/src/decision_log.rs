//! The optional decision log: one JSON object per line per decision.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{LineWriter, Write};
use std::path::Path;

use serde::Serialize;

use crate::decision::Decision;
use crate::effective::EffectiveState;
use crate::error::Error;
use crate::migration::{avoided, Avoided, MigrationAdvice};
use crate::policy::{AffinityCheck, Candidate};
use crate::settings::RouterSettings;
use crate::state::Instance;

/// Where decision records go: JSON Lines, one record per decision.
///
/// Each record holds the time — `clock_ns`, the router's [`crate::Clock`] at
/// the decision (`CLOCK_MONOTONIC`, or a simulator's simulated time), and
/// `time_unix_ns`, the wall clock, only with the real clock — then the
/// decision's sequence number `seq`, the request and session ids, the chosen
/// instance and reason, its cache hit and where it came from
/// (`cache_knowledge`: `engine` for a fresh engine digest, `estimated` for
/// the router's estimate; the setting itself is `cache_knowledge_setting`),
/// and for every instance its score, cache hit (with its `cache_knowledge`)
/// and effective state, with the fields that came from real state and their age
/// (`"real": {"age_ms": …, "fields": […]}`, `null` for shadow alone).
/// A failed write never fails a decision; it is counted in
/// [`crate::RouterStats::decision_log_errors`].
pub struct DecisionLog {
    out: Box<dyn Write + Send>,
}

impl fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecisionLog").finish_non_exhaustive()
    }
}

impl DecisionLog {
    /// Log to any writer (wrap slow ones in a `BufWriter`; records are written
    /// whole, one `write_all` each).
    pub fn new(out: impl Write + Send + 'static) -> DecisionLog {
        DecisionLog { out: Box::new(out) }
    }

    /// Append to a file, creating it; flushed at every line so a crash loses
    /// at most the record being written.
    pub fn append_to(path: impl AsRef<Path>) -> Result<DecisionLog, Error> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| Error::DecisionLog {
                path: path.display().to_string(),
                source,
            })?;
        Ok(DecisionLog::new(LineWriter::new(file)))
    }

    pub(crate) fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(b"\n")
    }
}

/// How the candidates were scored, for their `score` / `avoided` fields.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scoring<'a> {
    /// By the configured policy.
    Policy,
    /// By the migration target scorer.
    Migration {
        settings: &'a crate::settings::MigrationSettings,
        source: usize,
    },
    /// Not at all (`reserve_on`).
    None,
}

#[derive(Serialize)]
struct Record<'a> {
    clock_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    time_unix_ns: Option<u64>,
    seq: u64,
    request_id: &'a str,
    session_id: Option<&'a str>,
    policy: &'static str,
    real_state_use: &'static str,
    cache_knowledge_setting: &'static str,
    consulted_real_state: bool,
    instance: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow_only_instance: Option<&'a str>,
    reason: &'static str,
    input_len: u64,
    cache_hit_tokens: u64,
    cache_knowledge: &'static str,
    new_prefill_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    affinity: Option<AffinityRecord<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    migration: Option<&'a MigrationAdvice>,
    candidates: Vec<CandidateRecord<'a>>,
}

#[derive(Serialize)]
struct AffinityRecord<'a> {
    instance: &'a str,
    hit_ratio: f64,
    num_requests: u64,
    limit: f64,
}

#[derive(Serialize)]
struct CandidateRecord<'a> {
    instance: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    avoided: Option<Avoided>,
    cache_hit_tokens: u64,
    cache_knowledge: &'static str,
    new_prefill_tokens: u64,
    effective: &'a EffectiveState,
}

/// Everything one record is made of, borrowed from the decision in progress.
pub(crate) struct RecordInput<'a> {
    pub clock_ns: u64,
    pub time_unix_ns: Option<u64>,
    pub seq: u64,
    pub settings: &'a RouterSettings,
    pub decision: &'a Decision,
    pub instances: &'a [Instance],
    pub candidates: &'a [Candidate],
    pub scoring: Scoring<'a>,
    pub affinity: Option<AffinityCheck>,
    pub migration: Option<&'a MigrationAdvice>,
}

/// The record as one JSON line (without the newline).
pub(crate) fn render(input: &RecordInput<'_>) -> String {
    let d = input.decision;
    let candidates = input
        .candidates
        .iter()
        .zip(input.instances)
        .enumerate()
        .map(|(position, (c, instance))| CandidateRecord {
            instance: &instance.id,
            score: match input.scoring {
                Scoring::Policy => Some(crate::policy::score(input.settings, c, d.input_len)),
                _ => None,
            },
            avoided: match input.scoring {
                Scoring::Migration { settings, source } => avoided(settings, c, position, source),
                // No policy chooses an instance that is shutting down.
                Scoring::Policy => c.shutting_down.then_some(Avoided::ShuttingDown),
                Scoring::None => None,
            },
            cache_hit_tokens: c.cache_hit_tokens,
            cache_knowledge: c.cache_knowledge.name(),
            new_prefill_tokens: c.new_prefill(d.input_len),
            effective: &c.state,
        })
        .collect();
    let record = Record {
        clock_ns: input.clock_ns,
        time_unix_ns: input.time_unix_ns,
        seq: input.seq,
        request_id: &d.request_id,
        session_id: d.session_id.as_deref(),
        policy: input.settings.policy.name(),
        real_state_use: input.settings.real_state_use.name(),
        cache_knowledge_setting: input.settings.cache_knowledge.name(),
        consulted_real_state: d.consulted_real_state,
        instance: &d.instance_id,
        shadow_only_instance: d.shadow_only_instance_id.as_deref(),
        reason: d.reason.name(),
        input_len: d.input_len,
        cache_hit_tokens: d.cache_hit_tokens,
        cache_knowledge: d.cache_knowledge.name(),
        new_prefill_tokens: d.new_prefill_tokens,
        affinity: input.affinity.map(|a| AffinityRecord {
            instance: &input.instances[a.instance].id,
            hit_ratio: a.hit_ratio,
            num_requests: a.num_requests,
            limit: a.limit,
        }),
        migration: input.migration,
        candidates,
    };
    // Serializing plain structs of numbers and strings cannot fail.
    serde_json::to_string(&record).expect("decision record serializes")
}
