//! Router settings: the policy, where real state is consulted, and every
//! threshold with its documented default (docs/ROUTING.md, "The router").

use std::fmt;
use std::str::FromStr;

use engine_state_reader::DEFAULT_STALE_AFTER;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A routing policy (docs/ROUTING.md, "The policies"). Ties are broken
/// round-robin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Policy {
    /// Least effective `num_requests`.
    #[serde(rename = "load_only")]
    LoadOnly,
    /// Least `(pending_prefill + new_prefill) × num_requests`.
    #[serde(rename = "lmetric")]
    LMetric,
    /// A session's first request goes to the least-loaded instance, later ones
    /// follow it whatever the load.
    #[serde(rename = "sticky")]
    Sticky,
    /// Session affinity while the cache is warm and the instance not
    /// overloaded, otherwise the decode-aware LMetric score.
    #[default]
    #[serde(rename = "unified")]
    Unified,
}

/// Where fresh real state enters the merge (docs/ROUTING.md, "Where real
/// state is used").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RealStateUse {
    /// Shadow counters alone, always.
    #[serde(rename = "never")]
    Never,
    /// Only for the decision that first binds a session to an instance: a
    /// `sticky`/`unified` request with a session id whose session is not bound
    /// (its first request, or its instance was removed, forgotten or is
    /// shutting down). Every other decision uses shadow alone: requests without
    /// a session, later requests of a bound session, and every decision of
    /// `load_only` and `lmetric` (they bind nothing) — per-request load polling
    /// herds (docs/ROUTING.md, "The GPU findings, checked": +17 % / +27 % TTFT
    /// p90 in the GPU experiments). Migrations (a request placed anew) consult
    /// real state in this mode too.
    #[serde(rename = "placement")]
    Placement,
    /// Every decision. The default: fresh state is ground truth and the merge
    /// can only raise the load the router sees, never hide its own reservations.
    #[default]
    #[serde(rename = "always")]
    Always,
}

/// Where a policy's cache hits come from (docs/ROUTING.md, "Where real
/// state is used").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CacheKnowledge {
    /// The router's own estimate: the prefixes it dispatched to each
    /// instance (its shadow cache).
    #[serde(rename = "estimated")]
    Estimated,
    /// The engine's own account: the leading run of the prompt's blocks in
    /// the instance's latest fresh cache digest (`RealState::cache`); the
    /// estimate for an instance while it has no fresh digest. Sessions a
    /// replica has not bound yet are adopted by the instance whose digest
    /// holds more than half of their prompt. The default.
    #[default]
    #[serde(rename = "engine")]
    Engine,
}

macro_rules! names {
    ($ty:ty, $what:literal, $($variant:path => $name:literal),+) => {
        impl $ty {
            /// The setting's name as used in JSON, logs and Python.
            pub fn name(self) -> &'static str {
                match self { $($variant => $name),+ }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
        impl FromStr for $ty {
            type Err = Error;
            fn from_str(text: &str) -> Result<Self, Error> {
                match text {
                    $($name => Ok($variant),)+
                    _ => Err(Error::InvalidSetting {
                        name: $what,
                        value: text.to_owned(),
                        expected: concat!("one of" $(, " ", $name)+).to_owned(),
                    }),
                }
            }
        }
    };
}

names!(Policy, "policy",
    Policy::LoadOnly => "load_only", Policy::LMetric => "lmetric",
    Policy::Sticky => "sticky", Policy::Unified => "unified");
names!(RealStateUse, "real_state_use",
    RealStateUse::Never => "never", RealStateUse::Placement => "placement",
    RealStateUse::Always => "always");
names!(CacheKnowledge, "cache_knowledge",
    CacheKnowledge::Estimated => "estimated", CacheKnowledge::Engine => "engine");

/// Everything that shapes a decision. `Default` gives the documented defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    /// The routing policy (default `unified`).
    pub policy: Policy,
    /// Where real state is consulted (default `always`).
    pub real_state_use: RealStateUse,
    /// Where cache hits come from (default `engine`: the engines' cache
    /// digests where fresh, the router's estimate elsewhere).
    pub cache_knowledge: CacheKnowledge,
    /// `unified`: the session's instance is overloaded above
    /// `max(mean num_requests, 1) × overload_factor`. Default 2.0
    /// (docs/ROUTING.md, "The policies"; 1.3 is the tuned value).
    pub overload_factor: f64,
    /// `unified`: weight of `ongoing_decode_tokens` in the fallback score.
    /// Default 0.0 (docs/ROUTING.md, "The policies"; 0.01 is the tuned value).
    pub decode_weight: f64,
    /// `unified`: stick only when the session instance's cache hit ratio is
    /// strictly above this. Default 0.5 (docs/ROUTING.md, "The policies").
    pub affinity_min_hit_ratio: f64,
    /// Prefix blocks (512 tokens each) remembered per instance. Default 1024
    /// blocks = 524,288 tokens: about the KV capacity of one 80 GB GPU serving
    /// an 8B model, so the shadow cache forgets roughly when the engine would.
    pub prefix_cache_blocks: usize,
    /// Session bindings remembered; the least recently used is forgotten
    /// beyond this (its next request is placed anew). Default 65,536: far more
    /// live sessions than a fleet serves at once, a few MB at most.
    pub max_sessions: usize,
    /// Stored real state is merged while the engine's heartbeat, aged from the
    /// reading (the reader's `heartbeat_age` plus the time since the read:
    /// docs/ROUTING.md, "The merge"), is at most this many seconds old: the
    /// reader's `stale_after` rule (docs/FORMAT.md, "Liveness and staleness")
    /// applied again at decision time, so a router whose feed stopped, or that
    /// was handed an old reading, does not trust it. Default 2.0: the reader's
    /// default `stale_after` ([`DEFAULT_STALE_AFTER`]). A setting of its own,
    /// not read from the reading, because a [`RealState`](crate::RealState)
    /// carries no threshold and may come from any reader or process
    /// (docs/ARCHITECTURE.md, "Multi-node and routing").
    pub real_state_expiry_s: f64,
    /// Migration target scoring and trigger thresholds.
    pub migration: MigrationSettings,
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            policy: Policy::default(),
            real_state_use: RealStateUse::default(),
            cache_knowledge: CacheKnowledge::default(),
            overload_factor: 2.0,
            decode_weight: 0.0,
            affinity_min_hit_ratio: 0.5,
            prefix_cache_blocks: 1024,
            max_sessions: 65_536,
            real_state_expiry_s: DEFAULT_STALE_AFTER.as_secs_f64(),
            migration: MigrationSettings::default(),
        }
    }
}

/// Thresholds of the migration target scorer and trigger (docs/ROUTING.md,
/// "Migration").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigrationSettings {
    /// Trigger: projected prefill time on the source above this. Default 2.5 s
    /// (docs/ROUTING.md, "Migration").
    pub ttft_slo_s: f64,
    /// Trigger: source pending prefill above `rel_hi ×` the fleet median.
    /// Default 1.5 (docs/ROUTING.md, "Migration").
    pub rel_hi: f64,
    /// Prefill throughput used to project prefill time. Default 7,000 tokens/s
    /// (docs/ROUTING.md, "Migration"): the long-prefill rate measured on the
    /// reference deployment (Qwen3-Coder-30B-A3B, TP=1, one H20: 13,360 +
    /// 22,686 tokens prefilled in 5.1 s). Set it from your own measurement.
    pub prefill_tokens_per_s: f64,
    /// Targets whose `max_prefill_remaining` is at least this are avoided.
    /// Default 16,384 tokens: ~2.3 s of engine time at the default throughput,
    /// most of the default TTFT SLO, so a migrated request would queue behind
    /// it and miss the SLO anyway.
    pub big_prefill_threshold: u64,
    /// Targets whose KV used fraction is at least this are avoided. Default
    /// 0.9: above it a new long request makes vLLM preempt running ones.
    pub kv_wall_frac: f64,
}

impl Default for MigrationSettings {
    fn default() -> Self {
        MigrationSettings {
            ttft_slo_s: 2.5,
            rel_hi: 1.5,
            prefill_tokens_per_s: 7_000.0,
            big_prefill_threshold: 16_384,
            kv_wall_frac: 0.9,
        }
    }
}

/// The accepted values of one numeric setting: `min..=max`, without `min`
/// itself when `min_excluded`. Every bound is finite, so NaN and ±inf are
/// refused too; the upper bounds keep every value usable in a decision (a
/// duration must convert to a `Duration`, a score must not overflow to inf).
#[derive(Clone, Copy, Debug)]
struct Range {
    min: f64,
    min_excluded: bool,
    max: f64,
    /// Only whole numbers (the setting is an integer field).
    integer: bool,
}

impl Range {
    const fn closed(min: f64, max: f64) -> Range {
        Range {
            min,
            min_excluded: false,
            max,
            integer: false,
        }
    }

    const fn above(min: f64, max: f64) -> Range {
        Range {
            min,
            min_excluded: true,
            max,
            integer: false,
        }
    }

    /// The same bounds, whole numbers only.
    const fn whole(self) -> Range {
        Range {
            integer: true,
            ..self
        }
    }

    fn contains(&self, value: f64) -> bool {
        // NaN fails both comparisons.
        let above_min = if self.min_excluded {
            value > self.min
        } else {
            value >= self.min
        };
        above_min && value <= self.max && (!self.integer || value.fract() == 0.0)
    }

    /// The range in words, for the error: built from the bounds, so the two
    /// cannot disagree.
    fn expected(&self) -> String {
        let what = if self.integer {
            "a whole number"
        } else {
            "a number"
        };
        if self.min_excluded {
            format!("{what} > {} and <= {}", self.min, self.max)
        } else {
            format!("{what} in [{}, {}]", self.min, self.max)
        }
    }
}

/// Durations in seconds: up to an hour. Long enough for any SLO or expiry a
/// router means, short enough for `Duration::from_secs_f64`.
const SECONDS: Range = Range::closed(0.0, 3600.0);
/// Factors and weights: far beyond any tuned value (1.3, 0.01, 1.5), small
/// enough that scores stay finite.
const FACTOR: Range = Range::closed(0.0, 1000.0);
/// Ratios and fractions.
const FRACTION: Range = Range::closed(0.0, 1.0);
/// Remembered prefix blocks or sessions (the LRU indexes its slots with
/// `u32`, `u32::MAX` meaning none).
const COUNT: Range = Range::closed(1.0, (u32::MAX - 1) as f64).whole();

impl RouterSettings {
    /// Every numeric setting: its name (as in JSON and Python, nested ones
    /// as `migration.<name>`), its value and its range. The one list
    /// [`validate`](RouterSettings::validate) and
    /// [`check_number`](RouterSettings::check_number) read.
    fn numbers(&self) -> [(&'static str, f64, Range); 11] {
        let m = &self.migration;
        [
            (
                "overload_factor",
                self.overload_factor,
                Range::above(0.0, 1000.0),
            ),
            ("decode_weight", self.decode_weight, FACTOR),
            (
                "affinity_min_hit_ratio",
                self.affinity_min_hit_ratio,
                FRACTION,
            ),
            (
                "prefix_cache_blocks",
                self.prefix_cache_blocks as f64,
                COUNT,
            ),
            ("max_sessions", self.max_sessions as f64, COUNT),
            ("real_state_expiry_s", self.real_state_expiry_s, SECONDS),
            ("migration.ttft_slo_s", m.ttft_slo_s, SECONDS),
            ("migration.rel_hi", m.rel_hi, FACTOR),
            (
                "migration.prefill_tokens_per_s",
                m.prefill_tokens_per_s,
                Range::above(0.0, 1e9),
            ),
            (
                "migration.big_prefill_threshold",
                m.big_prefill_threshold as f64,
                Range::closed(0.0, 1e18).whole(),
            ),
            ("migration.kv_wall_frac", m.kv_wall_frac, FRACTION),
        ]
    }

    /// Refuse values no decision can be made with: NaN, infinities,
    /// negatives, zero capacities, and values beyond each setting's range
    /// (a duration that no `Duration` holds, a factor that makes scores
    /// infinite). The error names the setting and its range.
    pub fn validate(&self) -> Result<(), Error> {
        for (name, value, range) in self.numbers() {
            refuse_outside(name, value, &range)?;
        }
        Ok(())
    }

    /// Check one numeric setting by its name (`"overload_factor"`,
    /// `"migration.ttft_slo_s"`) before it is parsed: for bindings whose
    /// values may be NaN, infinite or out of an integer type's range (Python
    /// floats and ints), so the error names the setting and its range.
    /// `float`: the value was given as a floating-point number, which an
    /// integer setting refuses even when whole (`2.0`), as its parser would,
    /// but here with the setting's name.
    /// `Ok(false)`: no numeric setting has that name (the parser reports it).
    pub fn check_number(name: &str, value: f64, float: bool) -> Result<bool, Error> {
        let numbers = RouterSettings::default().numbers();
        let Some((name, _, range)) = numbers.iter().find(|(known, ..)| *known == name) else {
            return Ok(false);
        };
        if float && range.integer {
            return Err(Error::InvalidSetting {
                name,
                value: value.to_string(),
                expected: range.expected(),
            });
        }
        refuse_outside(name, value, range)?;
        Ok(true)
    }
}

fn refuse_outside(name: &'static str, value: f64, range: &Range) -> Result<(), Error> {
    if range.contains(value) {
        Ok(())
    } else {
        Err(Error::InvalidSetting {
            name,
            value: value.to_string(),
            expected: range.expected(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Router;

    #[test]
    fn defaults_are_the_documented_ones_and_valid() {
        let s = RouterSettings::default();
        assert_eq!((s.overload_factor, s.decode_weight), (2.0, 0.0));
        assert_eq!((s.migration.ttft_slo_s, s.migration.rel_hi), (2.5, 1.5));
        s.validate().unwrap();
    }

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_accepted() {
        for policy in [
            Policy::LoadOnly,
            Policy::LMetric,
            Policy::Sticky,
            Policy::Unified,
        ] {
            assert_eq!(policy.name().parse::<Policy>().unwrap(), policy);
        }
        let err = "lmetrics".parse::<Policy>().unwrap_err().to_string();
        assert!(
            err.contains("one of load_only lmetric sticky unified"),
            "{err}"
        );
        assert_eq!(
            "placement".parse::<RealStateUse>().unwrap(),
            RealStateUse::Placement
        );
        for knowledge in [CacheKnowledge::Estimated, CacheKnowledge::Engine] {
            assert_eq!(
                knowledge.to_string().parse::<CacheKnowledge>().unwrap(),
                knowledge
            );
        }
        let err = "exact".parse::<CacheKnowledge>().unwrap_err().to_string();
        assert!(
            err.contains("cache_knowledge") && err.contains("one of estimated engine"),
            "{err}"
        );
    }

    #[test]
    fn json_uses_the_same_names_and_fills_defaults() {
        let s: RouterSettings =
            serde_json::from_str(r#"{"policy": "lmetric", "migration": {"rel_hi": 2.0}}"#).unwrap();
        assert_eq!(s.policy, Policy::LMetric);
        assert_eq!(s.migration.rel_hi, 2.0);
        assert_eq!(s.migration.ttft_slo_s, 2.5);
        assert_eq!(s.cache_knowledge, CacheKnowledge::Engine, "the default");
        let s: RouterSettings =
            serde_json::from_str(r#"{"cache_knowledge": "estimated"}"#).unwrap();
        assert_eq!(s.cache_knowledge, CacheKnowledge::Estimated);
        assert!(serde_json::from_str::<RouterSettings>(r#"{"polcy": "x"}"#).is_err());
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let bad = RouterSettings {
            overload_factor: f64::NAN,
            ..RouterSettings::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("overload_factor"));
        let bad = RouterSettings {
            prefix_cache_blocks: 0,
            ..RouterSettings::default()
        };
        assert!(bad.validate().is_err());
    }

    /// Every numeric setting, set to each bad value in turn: refused by
    /// `validate` (so `Router::new` never panics converting it) with the
    /// setting's name and range, and by `check_number` the same way.
    #[test]
    fn every_setting_refuses_nan_infinities_negatives_and_huge_values() {
        let set = |name: &str, value: f64| {
            let mut s = RouterSettings::default();
            let m = &mut s.migration;
            match name {
                "overload_factor" => s.overload_factor = value,
                "decode_weight" => s.decode_weight = value,
                "affinity_min_hit_ratio" => s.affinity_min_hit_ratio = value,
                "prefix_cache_blocks" => s.prefix_cache_blocks = value as usize,
                "max_sessions" => s.max_sessions = value as usize,
                "real_state_expiry_s" => s.real_state_expiry_s = value,
                "migration.ttft_slo_s" => m.ttft_slo_s = value,
                "migration.rel_hi" => m.rel_hi = value,
                "migration.prefill_tokens_per_s" => m.prefill_tokens_per_s = value,
                "migration.big_prefill_threshold" => m.big_prefill_threshold = value as u64,
                "migration.kv_wall_frac" => m.kv_wall_frac = value,
                other => panic!("{other} has no case here: add it"),
            }
            s
        };
        for (name, _, range) in RouterSettings::default().numbers() {
            for bad in [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -1.0,
                1e20,
                1e300,
            ] {
                let err = RouterSettings::check_number(name, bad, true)
                    .unwrap_err()
                    .to_string();
                assert!(
                    err.contains(name) && err.contains(&range.expected()),
                    "{err}"
                );
                // Integer fields cannot hold NaN, inf or negatives: their
                // huge values are checked below.
                if !range.integer {
                    let err = set(name, bad).validate().unwrap_err().to_string();
                    assert!(
                        err.contains(name) && err.contains(&range.expected()),
                        "{err}"
                    );
                    assert!(
                        Router::new(set(name, bad)).is_err(),
                        "{name} = {bad}: an error, not a panic"
                    );
                }
            }
            let default = RouterSettings::default().numbers();
            let (_, value, _) = default.iter().find(|(n, ..)| *n == name).unwrap();
            assert!(
                RouterSettings::check_number(name, *value, !range.integer).unwrap(),
                "{name}"
            );
            if range.integer {
                let err = set(name, u64::MAX as f64).validate().unwrap_err();
                assert!(err.to_string().contains(name), "{err}");
                // A fraction, or any float, is refused by name (serde's
                // own error would not name the setting).
                for (value, float) in [(1.5, false), (1.5, true), (2.0, true)] {
                    let err = RouterSettings::check_number(name, value, float)
                        .unwrap_err()
                        .to_string();
                    assert!(err.contains(name) && err.contains("whole number"), "{err}");
                }
            }
        }
        let integers = RouterSettings::default()
            .numbers()
            .iter()
            .filter(|(_, _, range)| range.integer)
            .count();
        assert_eq!(
            integers, 3,
            "prefix_cache_blocks, max_sessions, big_prefill_threshold"
        );
        assert!(!RouterSettings::check_number("no_such_setting", f64::NAN, true).unwrap());
    }
}
