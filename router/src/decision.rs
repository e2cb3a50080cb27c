//! What the router decided, and why.

use serde::Serialize;

use crate::settings::CacheKnowledge;

/// Why an instance was chosen; logged under these snake_case names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// `load_only`: least effective `num_requests`.
    LeastLoaded,
    /// `lmetric`: least `(pending_prefill + new_prefill) × num_requests`.
    Lmetric,
    /// `sticky`/`unified`: a session's first request (or one without a
    /// session, or whose instance was removed or forgotten) placed by load.
    Placement,
    /// `sticky`/`unified`: the session's instance, kept.
    Affinity,
    /// `sticky`/`unified`: a session this router had not bound, bound to the
    /// instance whose engine digest holds more than half of its prompt
    /// (`cache_knowledge = engine`), and kept there.
    Adoption,
    /// `unified`: the session's instance had a cold cache (hit ratio not above
    /// the threshold), so the fallback score chose.
    FallbackColdCache,
    /// `unified`: the session's instance had a warm cache but was overloaded.
    FallbackOverloaded,
    /// Chosen by the migration target scorer.
    Migration,
    /// Named by the caller (`Router::reserve_on`).
    Forced,
}

impl Reason {
    /// The name used in the decision log.
    pub fn name(self) -> &'static str {
        match self {
            Reason::LeastLoaded => "least_loaded",
            Reason::Lmetric => "lmetric",
            Reason::Placement => "placement",
            Reason::Affinity => "affinity",
            Reason::Adoption => "adoption",
            Reason::FallbackColdCache => "fallback_cold_cache",
            Reason::FallbackOverloaded => "fallback_overloaded",
            Reason::Migration => "migration",
            Reason::Forced => "forced",
        }
    }
}

/// One routing decision. Owned and `Clone`, so bindings can hand it out.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// The request's id.
    pub request_id: String,
    /// The request's session, if any.
    pub session_id: Option<String>,
    /// The chosen instance.
    pub instance_id: String,
    /// Why it was chosen.
    pub reason: Reason,
    /// Prompt length in tokens.
    pub input_len: u64,
    /// Tokens of the prompt's leading blocks the chosen instance is believed to cache.
    pub cache_hit_tokens: u64,
    /// Where `cache_hit_tokens` came from: `Engine`, the instance's fresh
    /// cache digest; `Estimated`, the router's own estimate (the setting is
    /// `estimated`, or the instance had no fresh digest).
    pub cache_knowledge: CacheKnowledge,
    /// `input_len - cache_hit_tokens`: the prefill reserved on the instance.
    pub new_prefill_tokens: u64,
    /// Fresh real state was consulted for this decision (per `real_state_use`).
    pub consulted_real_state: bool,
    /// The instance the policy would have chosen from the shadow counters
    /// alone, for a pick that consulted real state while
    /// [`crate::Router::set_shadow_comparison`] is on; `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow_only_instance_id: Option<String>,
}

impl Decision {
    /// Whether real state changed this decision: `Some(true)` when the
    /// shadow counters alone would have chosen another instance, `None` when
    /// that was not evaluated (see [`Decision::shadow_only_instance_id`]).
    pub fn real_state_changed(&self) -> Option<bool> {
        self.shadow_only_instance_id
            .as_ref()
            .map(|id| *id != self.instance_id)
    }
}
