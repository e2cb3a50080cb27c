//! Tests of `step_trace.rs` (a sibling file: docs/ARCHITECTURE.md, "Layout conventions").

use super::*;

fn scenario(json: &str) -> StepScenario {
    serde_json::from_str(json).unwrap()
}

#[test]
fn idle_steps_are_skipped_and_arrivals_follow_the_scenario_clock() {
    let profile = EngineProfile {
        max_num_batched_tokens: 64,
        kv_capacity_tokens: 16 * 32,
        ..EngineProfile::default()
    };
    let s = scenario(
        r#"{"requests": [
            {"id": 7, "arrival_step": 0, "prompt_len": 100, "output_len": 2},
            {"id": 8, "arrival_step": 10, "prompt_len": 10, "output_len": 1}]}"#,
    );
    let records = step_trace(&profile, &s).unwrap();
    let steps: Vec<u64> = records.iter().map(|r| r.step).collect();
    // 100 tokens in chunks of 64 + 36 (first token), one decode; then idle until 10.
    assert_eq!(steps, vec![0, 1, 2, 10]);
    assert_eq!(records[0].scheduled, vec![(7, 64)]);
    assert_eq!(records[1].scheduled, vec![(7, 36)]);
    assert_eq!(records[2].finished, vec![7]);
    assert_eq!(records[3].admitted.len(), 1);
    assert_eq!(
        records[3].state.num_running, 0,
        "request 8 finished in its first step"
    );
}

#[test]
fn a_scenario_that_cannot_run_is_refused_with_the_reason() {
    let profile = EngineProfile {
        kv_capacity_tokens: 16 * 4,
        ..EngineProfile::default()
    };
    let too_big = scenario(
        r#"{"requests": [{"id": 1, "arrival_step": 0, "prompt_len": 100, "output_len": 1}]}"#,
    );
    let err = step_trace(&profile, &too_big).unwrap_err().to_string();
    assert!(err.contains("must fit the profile's KV cache"), "{err}");
    let twice = scenario(
        r#"{"requests": [{"id": 1, "arrival_step": 0, "prompt_len": 1, "output_len": 1},
                         {"id": 1, "arrival_step": 1, "prompt_len": 1, "output_len": 1}]}"#,
    );
    let err = step_trace(&profile, &twice).unwrap_err().to_string();
    assert!(err.contains("appears twice"), "{err}");
}

#[test]
fn a_record_is_the_json_the_vllm_comparison_reads() {
    let s = scenario(
        r#"{"requests": [{"id": 7, "arrival_step": 0, "prompt_len": 100, "output_len": 2},
                         {"id": 8, "arrival_step": 0, "prompt_len": 40, "output_len": 3}]}"#,
    );
    let records = step_trace(&EngineProfile::default(), &s).unwrap();
    let value = serde_json::to_value(&records[0]).unwrap();
    let object = value.as_object().unwrap();
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let fields = Snapshot::FIELD_NAMES.into_iter().filter(|name| {
        !NOT_COMPARED.contains(name)
            && !Snapshot::CAPTURE_STAMPS.contains(name)
            && !Snapshot::CACHE_STAMPS.contains(name)
    });
    // Pinned literally (what sim/tests_vllm/test_engine_vs_vllm.py reads),
    // not derived from the filter the serialiser uses.
    let mut expected = vec![
        "step",
        "scheduled",
        "preempted",
        "admitted",
        "finished",
        "num_running",
        "num_waiting",
        "gpu_blocks_free",
        "pending_prefill_tokens",
        "ongoing_decode_tokens",
        "num_prefilling",
        "max_prefill_remaining",
        "num_preempted",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    for name in fields {
        assert_eq!(
            object[name],
            records[0].state.field(name).unwrap(),
            "{name}"
        );
    }
    assert_eq!(object["scheduled"], serde_json::json!([[7, 100], [8, 40]]));
}
