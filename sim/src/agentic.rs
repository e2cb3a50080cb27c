//! A seeded synthetic agentic trace: sessions with a heavy-tailed number of
//! turns; each turn's prompt is the previous prompt plus its output plus a
//! tool result (an append-only context), separated by think/tool times.

use serde::{Deserialize, Serialize};

use crate::trace::{mix, Content, Trace, TraceRequest};

/// Parameters of the agentic generator. `Default` gives a load shaped like
/// the GPU experiments' agentic trace (1,214 requests in 274 sessions, ≈ 4.4
/// turns per session).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgenticSpec {
    /// Seed (same seed, same trace).
    pub seed: u64,
    /// Sessions.
    pub sessions: usize,
    /// Mean seconds between session starts (Poisson).
    pub session_interarrival_s: f64,
    /// Turns per session: Pareto with this minimum and shape, capped.
    pub turns_min: f64,
    /// Pareto shape of the turn count (smaller = heavier tail).
    pub turns_shape: f64,
    /// Most turns per session.
    pub turns_max: usize,
    /// First prompt (system prompt + task), tokens: uniform in this range.
    pub first_prompt_tokens: (u64, u64),
    /// Tool result appended per turn, tokens: uniform in this range.
    pub tool_result_tokens: (u64, u64),
    /// Output per turn, tokens: uniform in this range.
    pub output_tokens: (u64, u64),
    /// Mean think + tool time between a turn's arrival and the next, seconds (exponential).
    pub think_s: f64,
    /// Contexts are capped here (the agent truncates or ends the session).
    pub max_context_tokens: u64,
}

impl Default for AgenticSpec {
    fn default() -> Self {
        AgenticSpec {
            seed: 1,
            sessions: 274,
            session_interarrival_s: 2.0,
            turns_min: 1.5,
            turns_shape: 1.2,
            turns_max: 40,
            first_prompt_tokens: (4_000, 16_000),
            tool_result_tokens: (200, 4_000),
            output_tokens: (50, 800),
            think_s: 6.0,
            max_context_tokens: 120_000,
        }
    }
}

/// splitmix64: small, seedable, good enough for workloads.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0, 0)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next_u64() % (hi.saturating_sub(lo) + 1)
    }
    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

impl AgenticSpec {
    /// Generate the trace.
    pub fn generate(&self) -> Trace {
        let mut rng = Rng(self.seed);
        let mut requests = Vec::new();
        let mut start_s = 0.0;
        for session in 0..self.sessions as u64 {
            start_s += rng.exponential(self.session_interarrival_s);
            let pareto = self.turns_min / (1.0 - rng.unit()).powf(1.0 / self.turns_shape);
            let turns = (pareto as usize).clamp(1, self.turns_max);
            let mut at_s = start_s;
            let mut context = rng.range(self.first_prompt_tokens);
            for _ in 0..turns {
                let output = rng.range(self.output_tokens);
                requests.push(TraceRequest {
                    arrival_ns: (at_s * 1e9) as u64,
                    input_len: context,
                    output_len: output,
                    session: Some(session),
                    content: Content::Stream(self.seed ^ session.rotate_left(32)),
                });
                context += output + rng.range(self.tool_result_tokens);
                if context > self.max_context_tokens {
                    break;
                }
                at_s += rng.exponential(self.think_s);
            }
        }
        requests.sort_by_key(|r| r.arrival_ns);
        Trace {
            name: format!("agentic(seed={})", self.seed),
            requests,
            skipped_lines: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_trace_and_turns_extend_their_context() {
        let spec = AgenticSpec {
            sessions: 20,
            ..AgenticSpec::default()
        };
        let a = spec.generate();
        assert_eq!(a.requests, spec.generate().requests);
        let other = AgenticSpec {
            seed: 2,
            ..spec.clone()
        }
        .generate();
        assert_ne!(a.requests, other.requests);
        let turns: Vec<_> = a.requests.iter().filter(|r| r.session == Some(0)).collect();
        for pair in turns.windows(2) {
            assert!(pair[1].input_len > pair[0].input_len + pair[0].output_len);
            let (x, y) = (pair[0].kv_block_hashes(0), pair[1].kv_block_hashes(1));
            assert_eq!(
                x[..],
                y[..x.len()],
                "the earlier prompt and output are the later prompt's prefix"
            );
        }
    }
}
