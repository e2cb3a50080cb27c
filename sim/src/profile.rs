//! An engine profile: the scheduler limits and the step-time formula of one
//! modelled vLLM engine, with the default calibrated to the reference
//! deployment (Qwen3-Coder-30B-A3B, TP=1, one H20 96 GB per engine).

use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// vLLM's KV block size on GPUs (`block_size` default 16, notes/vllm-0.33-scheduling.md).
pub const KV_BLOCK_TOKENS: u64 = 16;

/// Scheduler limits and step-time coefficients of one engine.
///
/// Step time (seconds) = `step_base_s + prefill_token_s · prefill_tokens +
/// decode_seq_s · decode_seqs + decode_context_token_s · Σ decode context
/// tokens`, where a step's prefill tokens are its scheduled prompt (or
/// recompute) chunks and its decode sequences are the requests that sample
/// their next token from one new token.
///
/// Only two sums are calibrated by measurement (issue 12): a long prefill
/// runs at ≈ 7,000 tokens/s, and TPOT is ≈ 20 ms at moderate batch. How
/// those 20 ms split between the fixed cost, per-sequence and per-context
/// terms is an assumption, stated per field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineProfile {
    /// `max_num_batched_tokens`: tokens per step. 8192 = vLLM 0.33's API-server
    /// default on a ≥ 70 GiB non-A100 GPU such as the H20
    /// (`EngineArgs.get_batch_defaults`, notes/vllm-0.33-scheduling.md).
    pub max_num_batched_tokens: u64,
    /// `max_num_seqs`: running requests at most. 1024, same source.
    pub max_num_seqs: usize,
    /// KV cache capacity in tokens (rounded down to 16-token blocks). 220,000:
    /// 48 layers × 4 KV heads × 128 dims × 2 (K and V) × 2 bytes (bf16) =
    /// 96 KiB per token, in the ~22 GB an H20 (96 GB) has left after the
    /// 30B-A3B weights (~61 GB bf16) and activations at
    /// `gpu_memory_utilization` 0.9 (issue 12).
    pub kv_capacity_tokens: u64,
    /// Fixed cost per step, seconds. 8 ms: an assumption (kernel launches,
    /// sampling, scheduler and MoE routing of a small batch), chosen so that
    /// the moderate-batch TPOT below comes out at ≈ 20 ms.
    pub step_base_s: f64,
    /// Seconds per prefill token. 1/7,000 − 8 ms/8,192: a long prompt
    /// prefilled in full 8,192-token chunks runs at 7,000 tokens/s, the rate
    /// measured on the reference deployment (13,360 + 22,686 tokens in
    /// 5.1 s; docs/ROUTING.md, "Migration", router
    /// `MigrationSettings::prefill_tokens_per_s`).
    pub prefill_token_s: f64,
    /// Seconds per decoding sequence. 0.1 ms: assumption (sampling and
    /// per-sequence MoE work of a 3B-active model).
    pub decode_seq_s: f64,
    /// Seconds per context token attended by a decoding sequence. 27.5 ns:
    /// chosen so that a moderate batch (32 sequences of 10,000 tokens of
    /// context) decodes in 8 + 3.2 + 8.8 = 20 ms per step, the TPOT observed
    /// on the reference deployment (p90 22–24 ms, issue 12).
    pub decode_context_token_s: f64,
}

impl Default for EngineProfile {
    fn default() -> Self {
        let step_base_s = 0.008;
        EngineProfile {
            max_num_batched_tokens: 8192,
            max_num_seqs: 1024,
            kv_capacity_tokens: 220_000,
            step_base_s,
            prefill_token_s: 1.0 / 7000.0 - step_base_s / 8192.0,
            decode_seq_s: 0.000_1,
            decode_context_token_s: 27.5e-9,
        }
    }
}

impl EngineProfile {
    /// Usable KV blocks (vLLM's `num_gpu_blocks - 1`: the null block excluded).
    pub fn kv_blocks(&self) -> u64 {
        self.kv_capacity_tokens / KV_BLOCK_TOKENS
    }

    /// One step's duration in nanoseconds.
    pub fn step_ns(&self, prefill_tokens: u64, decode_seqs: u64, decode_context: u64) -> u64 {
        let seconds = self.step_base_s
            + self.prefill_token_s * prefill_tokens as f64
            + self.decode_seq_s * decode_seqs as f64
            + self.decode_context_token_s * decode_context as f64;
        (seconds * 1e9).round() as u64
    }

    /// Refuse profiles no engine can run with.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::Config(format!("engine profile: {what}")));
        if self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 {
            return bad("max_num_batched_tokens and max_num_seqs must be ≥ 1");
        }
        if self.kv_blocks() < 2 {
            return bad("kv_capacity_tokens must hold at least two 16-token blocks");
        }
        let coefficients = [
            self.step_base_s,
            self.prefill_token_s,
            self.decode_seq_s,
            self.decode_context_token_s,
        ];
        if coefficients.iter().any(|c| !c.is_finite() || *c < 0.0) || self.step_base_s <= 0.0 {
            return bad("step-time coefficients must be finite and ≥ 0, step_base_s > 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_profile_matches_its_calibration() {
        let p = EngineProfile::default();
        p.validate().unwrap();
        // A full prefill chunk: 8,192 tokens at 7,000 tokens/s.
        let chunk_s = p.step_ns(8192, 0, 0) as f64 / 1e9;
        assert!((8192.0 / chunk_s - 7000.0).abs() < 1.0, "{chunk_s}");
        // Moderate batch: 32 sequences × 10k context → ≈ 20 ms.
        let tpot_ms = p.step_ns(0, 32, 320_000) as f64 / 1e6;
        assert!((tpot_ms - 20.0).abs() < 0.01, "{tpot_ms}");
        assert_eq!(p.kv_blocks(), 13_750);
    }

    #[test]
    fn the_shipped_profile_file_is_the_default() {
        let file: EngineProfile =
            toml::from_str(include_str!("../profiles/h20-qwen3-coder-30b-a3b.toml")).unwrap();
        let default = EngineProfile::default();
        assert!((file.prefill_token_s / default.prefill_token_s - 1.0).abs() < 1e-12);
        let same = EngineProfile {
            prefill_token_s: default.prefill_token_s,
            ..file
        };
        assert_eq!(same, default);
    }

    #[test]
    fn toml_fills_defaults_and_refuses_unknown_keys() {
        let p: EngineProfile = toml::from_str("kv_capacity_tokens = 1600").unwrap();
        assert_eq!(p.kv_blocks(), 100);
        assert_eq!(p.max_num_batched_tokens, 8192);
        assert!(toml::from_str::<EngineProfile>("kv_tokens = 1").is_err());
    }
}
