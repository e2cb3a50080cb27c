//! Real state input and the `max(shadow, real)` merge (docs/ROUTING.md, "The
//! merge").

use std::sync::Arc;
use std::time::Duration;

use engine_state_shm_format::{CacheDigest, Snapshot};
use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;

use crate::shadow::ShadowCounters;

/// One engine's real state as a reader reported it, with when it was read.
///
/// The router ages it from the reading (docs/ROUTING.md, "The merge"): at a
/// decision its heartbeat is `heartbeat_age` plus the time since
/// `read_mono_ns`, and it is merged only while that is within
/// `real_state_expiry_s` — so a reading handed over late is as old as it really
/// is. [`From<&EngineState>`] (in `feed.rs`) maps the reader's status: only
/// `Fresh` is fresh; `Stale`, `Dead` and `Torn` are stored but never merged.
///
/// [`From<&EngineState>`]: engine_state_reader::EngineState
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealState {
    /// The engine's last snapshot.
    pub snapshot: Snapshot,
    /// The reader judged it fresh (docs/FORMAT.md, "Liveness and staleness").
    pub fresh: bool,
    /// How old the snapshot was when the reader read it.
    pub capture_age: Duration,
    /// How old the engine's heartbeat was when the reader read it.
    pub heartbeat_age: Duration,
    /// `CLOCK_MONOTONIC` nanoseconds ([`engine_state_shm_format::monotonic_ns`])
    /// when it was read: the ages above are as of then.
    pub read_mono_ns: u64,
    /// The engine's cache digest as of the snapshot (the reader's
    /// `EngineState::cache`), if it publishes one: with
    /// `cache_knowledge = engine` the instance's cache hits come from it while
    /// the state is fresh (docs/ROUTING.md, "Where real state is used").
    pub cache: Option<Arc<CacheDigest>>,
}

impl RealState {
    /// A fresh snapshot of the given capture age, read just now with a
    /// heartbeat just stamped.
    pub fn fresh(snapshot: Snapshot, capture_age: Duration) -> RealState {
        RealState {
            snapshot,
            fresh: true,
            capture_age,
            heartbeat_age: Duration::ZERO,
            read_mono_ns: engine_state_shm_format::monotonic_ns(),
            cache: None,
        }
    }

    /// A snapshot the reader judged stale, dead or torn: it never enters the merge.
    pub fn not_fresh(snapshot: Snapshot, capture_age: Duration) -> RealState {
        RealState {
            fresh: false,
            ..RealState::fresh(snapshot, capture_age)
        }
    }

    /// The same state with the engine's cache digest.
    pub fn with_cache(self, cache: CacheDigest) -> RealState {
        RealState {
            cache: Some(Arc::new(cache)),
            ..self
        }
    }

    /// The same state, read at `read_mono_ns` with the given heartbeat age.
    pub fn read_at(self, read_mono_ns: u64, heartbeat_age: Duration) -> RealState {
        RealState {
            read_mono_ns,
            heartbeat_age,
            ..self
        }
    }
}

/// Which effective fields came from real state (real strictly above shadow).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RealFields(u8);

impl RealFields {
    /// `num_requests` (real: `num_running + num_waiting`).
    pub const NUM_REQUESTS: RealFields = RealFields(1 << 0);
    /// `pending_prefill_tokens`.
    pub const PENDING_PREFILL_TOKENS: RealFields = RealFields(1 << 1);
    /// `ongoing_decode_tokens`.
    pub const ONGOING_DECODE_TOKENS: RealFields = RealFields(1 << 2);
    /// `num_prefilling`.
    pub const NUM_PREFILLING: RealFields = RealFields(1 << 3);
    /// `max_prefill_remaining`.
    pub const MAX_PREFILL_REMAINING: RealFields = RealFields(1 << 4);
    /// `kv_used_frac` (real only: the shadow knows nothing of KV blocks).
    pub const KV_USED_FRAC: RealFields = RealFields(1 << 5);

    const NAMES: [&'static str; 6] = [
        "num_requests",
        "pending_prefill_tokens",
        "ongoing_decode_tokens",
        "num_prefilling",
        "max_prefill_remaining",
        "kv_used_frac",
    ];

    /// Every field in `other` is also in `self`.
    pub fn contains(self, other: RealFields) -> bool {
        self.0 & other.0 == other.0
    }

    /// No field came from real state.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fields' names, in a fixed order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        (0..Self::NAMES.len())
            .filter(move |bit| self.0 & (1 << bit) != 0)
            .map(|bit| Self::NAMES[bit])
    }
}

impl Serialize for RealFields {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for name in self.names() {
            seq.serialize_element(name)?;
        }
        seq.end()
    }
}

/// Fresh real state that entered an [`EffectiveState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RealUsed {
    /// Age of the snapshot at decision time.
    #[serde(rename = "age_ms", serialize_with = "as_millis")]
    pub age: Duration,
    /// Fields where real state exceeded the shadow and so was used.
    pub fields: RealFields,
}

fn as_millis<S: Serializer>(age: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(age.as_secs_f64() * 1e3)
}

/// What a policy sees of one instance: per field `max(shadow, real)` when the
/// real state is fresh, the shadow alone otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct EffectiveState {
    /// Requests in flight (real: running + waiting).
    pub num_requests: u64,
    /// Prompt tokens in flight (shadow only: no snapshot field counts them).
    pub ongoing_tokens: u64,
    /// Prefill tokens still to compute.
    pub pending_prefill_tokens: u64,
    /// Decode context tokens of requests past prefill.
    pub ongoing_decode_tokens: u64,
    /// Requests with prefill left.
    pub num_prefilling: u64,
    /// Largest remaining prefill of one request.
    pub max_prefill_remaining: u64,
    /// KV cache used fraction; `None` without fresh real state.
    pub kv_used_frac: Option<f64>,
    /// Whether and how fresh real state was merged.
    pub real: Option<RealUsed>,
}

impl EffectiveState {
    /// The shadow alone.
    pub fn shadow_only(shadow: &ShadowCounters) -> EffectiveState {
        EffectiveState {
            num_requests: shadow.num_requests,
            ongoing_tokens: shadow.ongoing_tokens,
            pending_prefill_tokens: shadow.pending_prefill_tokens,
            ongoing_decode_tokens: shadow.ongoing_decode_tokens,
            num_prefilling: shadow.num_prefilling,
            max_prefill_remaining: shadow.max_prefill_remaining,
            kv_used_frac: None,
            real: None,
        }
    }

    /// `max(shadow, real)` per field if `real` is fresh, the shadow alone if it
    /// is not fresh or absent. As of the reading: this does not age `real`
    /// from `read_mono_ns` (the router does, at each decision).
    ///
    /// The max, not the real value alone: the snapshot lags the router's own
    /// dispatches by up to one publish period, and a request the router just
    /// reserved must count before the engine has seen it.
    pub fn merge(shadow: &ShadowCounters, real: Option<&RealState>) -> EffectiveState {
        match real.filter(|real| real.fresh) {
            Some(real) => {
                EffectiveState::merge_fresh(shadow, &RealLoad::of(&real.snapshot), real.capture_age)
            }
            None => EffectiveState::shadow_only(shadow),
        }
    }

    /// The merge with the load of a snapshot known to be fresh: the router
    /// calls this for every instance on every decision, so the snapshot is
    /// reduced to a [`RealLoad`] once, when it is stored.
    pub(crate) fn merge_fresh(
        shadow: &ShadowCounters,
        real: &RealLoad,
        age: Duration,
    ) -> EffectiveState {
        let mut effective = EffectiveState::shadow_only(shadow);
        let mut fields = RealFields::default();
        let mut take_max = |field: &mut u64, real_value: u64, flag: RealFields| {
            if real_value > *field {
                *field = real_value;
                fields.0 |= flag.0;
            }
        };
        take_max(
            &mut effective.num_requests,
            real.num_requests,
            RealFields::NUM_REQUESTS,
        );
        take_max(
            &mut effective.pending_prefill_tokens,
            real.pending_prefill_tokens,
            RealFields::PENDING_PREFILL_TOKENS,
        );
        take_max(
            &mut effective.ongoing_decode_tokens,
            real.ongoing_decode_tokens,
            RealFields::ONGOING_DECODE_TOKENS,
        );
        take_max(
            &mut effective.num_prefilling,
            real.num_prefilling,
            RealFields::NUM_PREFILLING,
        );
        take_max(
            &mut effective.max_prefill_remaining,
            real.max_prefill_remaining,
            RealFields::MAX_PREFILL_REMAINING,
        );
        effective.kv_used_frac = real.kv_used_frac;
        if effective.kv_used_frac.is_some() {
            fields.0 |= RealFields::KV_USED_FRAC.0;
        }
        effective.real = Some(RealUsed { age, fields });
        effective
    }
}

/// The fields of a snapshot that enter the merge, in the merge's terms
/// (`num_requests` = running + waiting, the KV fraction divided out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RealLoad {
    num_requests: u64,
    pending_prefill_tokens: u64,
    ongoing_decode_tokens: u64,
    num_prefilling: u64,
    max_prefill_remaining: u64,
    kv_used_frac: Option<f64>,
}

impl RealLoad {
    pub(crate) fn of(snap: &Snapshot) -> RealLoad {
        RealLoad {
            num_requests: snap.num_running.saturating_add(snap.num_waiting),
            pending_prefill_tokens: snap.pending_prefill_tokens,
            ongoing_decode_tokens: snap.ongoing_decode_tokens,
            num_prefilling: snap.num_prefilling,
            max_prefill_remaining: snap.max_prefill_remaining,
            kv_used_frac: snap.gpu_kv_used_frac(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shadow() -> ShadowCounters {
        ShadowCounters {
            num_requests: 3,
            ongoing_tokens: 9000,
            pending_prefill_tokens: 5000,
            ongoing_decode_tokens: 100,
            num_prefilling: 2,
            max_prefill_remaining: 4000,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            num_running: 4,
            num_waiting: 2,
            pending_prefill_tokens: 1000,
            ongoing_decode_tokens: 20_000,
            num_prefilling: 1,
            max_prefill_remaining: 1000,
            gpu_blocks_total: 100,
            gpu_blocks_free: 25,
            ..Snapshot::default()
        }
    }

    #[test]
    fn fresh_real_state_is_merged_field_by_field() {
        let real = RealState::fresh(snapshot(), Duration::from_millis(30));
        let e = EffectiveState::merge(&shadow(), Some(&real));
        assert_eq!(e.num_requests, 6, "real running + waiting beats shadow 3");
        assert_eq!(e.pending_prefill_tokens, 5000, "shadow beats real");
        assert_eq!(e.ongoing_decode_tokens, 20_000);
        assert_eq!((e.num_prefilling, e.max_prefill_remaining), (2, 4000));
        assert_eq!(e.ongoing_tokens, 9000);
        assert_eq!(e.kv_used_frac, Some(0.75));
        let used = e.real.unwrap();
        assert_eq!(used.age, Duration::from_millis(30));
        let names: Vec<_> = used.fields.names().collect();
        assert_eq!(
            names,
            ["num_requests", "ongoing_decode_tokens", "kv_used_frac"]
        );
    }

    #[test]
    fn state_that_is_not_fresh_or_missing_leaves_the_shadow_alone() {
        let stale = RealState::not_fresh(snapshot(), Duration::from_secs(5));
        let alone = EffectiveState::shadow_only(&shadow());
        assert_eq!(EffectiveState::merge(&shadow(), Some(&stale)), alone);
        assert_eq!(EffectiveState::merge(&shadow(), None), alone);
        assert_eq!(alone.kv_used_frac, None);
    }

    #[test]
    fn provenance_serializes_as_names_and_milliseconds() {
        let real = RealState::fresh(snapshot(), Duration::from_micros(1500));
        let e = EffectiveState::merge(&shadow(), Some(&real));
        let json = serde_json::to_value(e.real.unwrap()).unwrap();
        assert_eq!(json["age_ms"], 1.5);
        assert_eq!(json["fields"][0], "num_requests");
    }
}
