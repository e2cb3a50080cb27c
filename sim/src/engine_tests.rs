//! The engine model against closed forms and the V1 scheduler's rules.

use std::collections::HashMap;

use super::*;

fn request(id: u64, prompt_len: u64, output_len: u64, prefix: u64) -> EngineRequest {
    // Blocks of the first `prefix` tokens are shared (hash by position); the rest unique per id.
    let blocks = prompt_len / KV_BLOCK_TOKENS;
    let block_hashes = (0..blocks)
        .map(|b| {
            if (b + 1) * KV_BLOCK_TOKENS <= prefix {
                b
            } else {
                (id + 1) << 32 | b
            }
        })
        .collect();
    EngineRequest {
        id,
        prompt_len,
        output_len,
        block_hashes,
        router_block_hashes: Vec::new(),
    }
}

/// Run until idle; returns `(time of first token, time of finish)` per id.
fn run(engine: &mut Engine) -> HashMap<u64, (u64, u64)> {
    let mut now = 0;
    let mut first = HashMap::new();
    let mut done = HashMap::new();
    while engine.num_requests() > 0 {
        let step = engine.schedule();
        assert!(!step.is_empty(), "work left but nothing scheduled");
        now += step.duration_ns;
        let out = engine.finish_step(&step);
        for id in out.first_token {
            first.insert(id, now);
        }
        for id in out.finished {
            done.insert(id, (first[&id], now));
        }
    }
    done
}

#[test]
fn a_lone_requests_ttft_is_its_prefill_steps_times_step_time() {
    let profile = EngineProfile::default();
    let mut engine = Engine::new(profile.clone());
    engine.add_request(request(1, 20_000, 1, 0));
    let done = run(&mut engine);
    let expected = 2 * profile.step_ns(8192, 0, 0) + profile.step_ns(20_000 - 2 * 8192, 0, 0);
    assert_eq!(done[&1], (expected, expected));
    assert_eq!(engine.counters().steps, 3);
}

#[test]
fn a_decode_only_batch_steps_at_the_decode_formula() {
    let profile = EngineProfile::default();
    let mut engine = Engine::new(profile.clone());
    for id in 0..4 {
        engine.add_request(request(id, 1000, 11, 0));
    }
    // Step 1 prefills all four (4,000 tokens) and samples each one's first token.
    let first = engine.schedule();
    assert_eq!((first.prefill_tokens, first.decode_seqs), (4000, 0));
    engine.finish_step(&first);
    // Then ten decode steps; the k-th attends 1000 + k tokens per sequence.
    for k in 1..=10u64 {
        let step = engine.schedule();
        assert_eq!(step.prefill_tokens, 0);
        assert_eq!(step.decode_seqs, 4);
        assert_eq!(step.decode_context_tokens, 4 * (1000 + k));
        assert_eq!(step.duration_ns, profile.step_ns(0, 4, 4 * (1000 + k)));
        let out = engine.finish_step(&step);
        assert_eq!(out.finished.len(), if k == 10 { 4 } else { 0 });
    }
    assert_eq!(engine.num_requests(), 0);
    assert_eq!(engine.free_blocks(), engine.total_blocks());
}

#[test]
fn capacity_exhaustion_preempts_the_newest_running_request() {
    // 20 blocks = 320 tokens; two requests of 150 prompt tokens each need 10
    // blocks apiece once they decode past 160 tokens.
    let profile = EngineProfile {
        kv_capacity_tokens: 320,
        ..EngineProfile::default()
    };
    let mut engine = Engine::new(profile);
    engine.add_request(request(1, 150, 40, 0));
    engine.add_request(request(2, 150, 40, 0));
    let mut preempted = Vec::new();
    let mut now_steps = 0;
    while engine.num_requests() > 0 {
        let step = engine.schedule();
        if !step.preempted.is_empty() {
            // No admission in a step that preempted.
            assert!(step.prefix_query_tokens == 0);
            let snap = engine.snapshot();
            assert_eq!(snap.num_preempted, 1);
            assert!(
                snap.pending_prefill_tokens > 150,
                "recompute of prompt + outputs"
            );
        }
        preempted.extend(step.preempted.iter().copied());
        engine.finish_step(&step);
        now_steps += 1;
        assert!(now_steps < 1000);
    }
    assert_eq!(
        preempted.first(),
        Some(&2),
        "the newest running request goes first"
    );
    assert!(engine.counters().preemptions >= 1);
}

#[test]
fn a_shared_prefix_hits_the_cache_in_whole_blocks() {
    let mut engine = Engine::new(EngineProfile::default());
    engine.add_request(request(1, 1000, 1, 800));
    run(&mut engine);
    engine.add_request(request(2, 1000, 1, 800));
    let step = engine.schedule();
    assert_eq!(step.prefix_hit_tokens, 800, "50 whole blocks");
    assert_eq!(step.prefill_tokens, 200);
}

#[test]
fn the_snapshot_follows_the_field_definitions() {
    let mut engine = Engine::new(EngineProfile::default());
    engine.add_request(request(1, 20_000, 5, 0));
    engine.add_request(request(2, 100, 5, 0));
    let idle = Engine::new(EngineProfile::default()).snapshot();
    assert_eq!(idle.flags, engine_state_shm_format::FLAG_IDLE);
    let before = engine.snapshot();
    assert_eq!((before.num_running, before.num_waiting), (0, 2));
    assert_eq!(before.pending_prefill_tokens, 20_100);
    assert_eq!(before.max_prefill_remaining, 20_000);
    let step = engine.schedule();
    assert_eq!(
        step.scheduled,
        vec![(1, 8192)],
        "the chunk takes the whole budget"
    );
    engine.finish_step(&step);
    let s = engine.snapshot();
    assert_eq!((s.num_running, s.num_waiting, s.num_prefilling), (1, 1, 1));
    assert_eq!(s.pending_prefill_tokens, 20_000 - 8192 + 100);
    assert_eq!(s.gpu_blocks_free, s.gpu_blocks_total - 512);
    assert_eq!(s.ongoing_decode_tokens, 0);
    assert_eq!(s.step, 1);
    // Run request 1 to its first token: it decodes; its context is num_tokens.
    for _ in 0..2 {
        let step = engine.schedule();
        engine.finish_step(&step);
    }
    let s = engine.snapshot();
    assert_eq!(s.num_prefilling, 0);
    assert_eq!(s.pending_prefill_tokens, 0);
    assert!(s.ongoing_decode_tokens >= 20_001);
}

#[test]
fn admission_needs_blocks_for_the_whole_prompt_not_only_its_first_chunk() {
    // vLLM 0.33's scheduler_reserve_full_isl: 20 blocks; A holds 7 (then
    // more as it decodes), B's 250-token prompt needs 16 — its first
    // 64-token chunk (4 blocks) would fit, B itself does not until A is gone.
    let profile = EngineProfile {
        max_num_batched_tokens: 64,
        kv_capacity_tokens: 320,
        ..EngineProfile::default()
    };
    let mut engine = Engine::new(profile);
    engine.add_request(request(1, 100, 20, 0));
    let mut a_done = None;
    let mut b_first = None;
    for step in 0..200 {
        if step == 3 {
            engine.add_request(request(2, 250, 1, 0));
        }
        let scheduled = engine.schedule();
        if b_first.is_none() && scheduled.scheduled.iter().any(|&(id, _)| id == 2) {
            b_first = Some(step);
        }
        if engine.finish_step(&scheduled).finished.contains(&1) {
            a_done = Some(step);
        }
        if engine.num_requests() == 0 {
            break;
        }
    }
    let (a_done, b_first) = (a_done.unwrap(), b_first.unwrap());
    assert!(
        b_first > a_done,
        "B admitted at step {b_first}, A finished at {a_done}"
    );
    assert_eq!(engine.counters().preemptions, 0);
}

#[test]
fn a_recompute_after_preemption_hits_its_own_output_blocks() {
    // vLLM hashes and caches output blocks too: a preempted request that
    // comes back before they are evicted finds its prompt and output cached.
    let profile = EngineProfile {
        kv_capacity_tokens: 320,
        ..EngineProfile::default()
    };
    let mut engine = Engine::new(profile);
    // 20 blocks: 1 holds 10, 2 holds 7; as they decode, 2 asks for a 4th
    // extra block with none free and preempts itself (8 full blocks, 2 of
    // them output); 1 finishes within its 12 blocks; 2 comes back.
    engine.add_request(request(1, 150, 40, 0));
    engine.add_request(request(2, 100, 60, 0));
    let mut resumed = Vec::new();
    for _ in 0..1000 {
        let step = engine.schedule();
        resumed.extend(step.admitted.iter().filter(|a| a.resumed).copied());
        engine.finish_step(&step);
        if engine.num_requests() == 0 {
            break;
        }
    }
    assert_eq!(engine.num_requests(), 0);
    let back = resumed.first().expect("a preempted request came back");
    assert_eq!(back.id, 2);
    assert_eq!(
        (back.hit_tokens, back.query_tokens),
        (128, 129),
        "the prompt's 6 full blocks and 2 more"
    );
    assert_eq!(
        engine.counters().prefix_query_tokens,
        250,
        "recomputes are not vLLM prefix-cache queries"
    );
}

/// The digest the engine publishes (sim/src/residency.rs) against its own
/// prefix cache, as the throwaway experiment checked it: at every step, for
/// each of the last 60 prompts given to the engine, the leading run of the
/// prompt's router blocks in the digest is the engine's leading KV hit over
/// 32 (at most the prompt's full router blocks) — session streams that
/// extend earlier turns and their outputs, Mooncake-style block ids from a
/// tree of shared prefixes, eviction pressure and preemptions.
#[test]
fn the_digest_lists_exactly_the_router_blocks_a_prompt_would_hit() {
    use crate::residency::KV_PER_ROUTER_BLOCK;
    use crate::trace::{mix, Content, TraceRequest};
    let profile = EngineProfile {
        kv_capacity_tokens: 48_000,
        max_num_batched_tokens: 4096,
        max_num_seqs: 8,
        ..EngineProfile::default()
    };
    let mut engine = Engine::new(profile);
    engine.publish_residency();
    let mut draw = {
        let mut n = 0u64;
        move |bound: u64| {
            n += 1;
            mix(0x5eed_d16e, n) % bound
        }
    };
    let mut probes: Vec<(Vec<u64>, Vec<u64>)> = Vec::new();
    let mut sessions = [(0u64, 0u64); 6]; // (stream id, tokens so far)
    let (mut now, mut added, mut last_want) = (0u64, 0u64, HashMap::new());
    let (mut hits_seen, mut drops_seen) = (0, 0);
    while added < 300 || engine.num_requests() > 0 {
        if added < 300 && (engine.num_requests() == 0 || draw(3) == 0) {
            let output_len = 1 + draw(300);
            let (content, input_len) = if draw(2) == 0 {
                let s = draw(sessions.len() as u64) as usize;
                let (stream, so_far) = &mut sessions[s];
                let input_len = *so_far + 1 + draw(3000);
                if input_len + output_len > 24_000 {
                    *stream += 1_000; // the agent starts over
                    *so_far = 0;
                }
                let input_len = *so_far + 1 + draw(3000);
                *so_far = input_len + output_len;
                (Content::Stream(*stream + s as u64), input_len)
            } else {
                let blocks = 1 + draw(20);
                let ids = (0..blocks)
                    .map(|b| if b == 0 { draw(3) } else { b * 4 + draw(4) })
                    .collect();
                (Content::Blocks(ids), blocks * 512 - draw(512))
            };
            let request = TraceRequest {
                arrival_ns: now,
                input_len,
                output_len,
                session: None,
                content,
            };
            let index = added as usize;
            engine.add_request(EngineRequest {
                id: added,
                prompt_len: input_len,
                output_len,
                block_hashes: request.kv_block_hashes(index),
                router_block_hashes: request.known_router_block_hashes(index),
            });
            probes.push((
                request.router_block_hashes(index),
                request.kv_block_hashes(index),
            ));
            added += 1;
        }
        let step = engine.schedule();
        now += step.duration_ns;
        engine.finish_step(&step);
        let digest = engine.cache_digest(now).expect("residency is published");
        for (i, (router, kv)) in probes.iter().enumerate().rev().take(60) {
            let kv_hit = engine.pool.longest_hit(kv.iter().copied()).len();
            let want = (kv_hit / KV_PER_ROUTER_BLOCK).min(router.len());
            assert_eq!(
                digest.leading_blocks(router),
                want,
                "prompt {i} after step {}",
                engine.counters().steps
            );
            hits_seen += usize::from(want > 0);
            if last_want
                .insert(i, want)
                .is_some_and(|before| want < before)
            {
                drops_seen += 1;
            }
        }
    }
    assert!(hits_seen > 10_000, "{hits_seen} prompts with a hit");
    assert!(drops_seen > 50, "only {drops_seen} hits lost to eviction");
    assert!(engine.counters().preemptions > 0, "no preemption");
}

#[test]
fn abort_frees_a_running_or_waiting_request() {
    let profile = EngineProfile {
        max_num_batched_tokens: 64,
        ..EngineProfile::default()
    };
    let mut engine = Engine::new(profile);
    let free = engine.free_blocks();
    engine.add_request(request(1, 64, 10, 0));
    engine.add_request(request(2, 64, 10, 0));
    let step = engine.schedule();
    assert_eq!(step.scheduled, vec![(1, 64)], "the budget admits one");
    engine.finish_step(&step);
    assert_eq!(engine.num_output(1), Some(1));
    assert_eq!(
        (engine.snapshot().num_running, engine.snapshot().num_waiting),
        (1, 1)
    );
    assert!(engine.abort(2), "waiting");
    assert!(engine.abort(1), "running");
    assert!(!engine.abort(1), "already gone");
    assert_eq!(engine.num_requests(), 0);
    assert_eq!(engine.free_blocks(), free);
    let s = engine.snapshot();
    assert_eq!((s.num_running, s.num_waiting), (0, 0));
    assert!(engine.schedule().is_empty());
}
