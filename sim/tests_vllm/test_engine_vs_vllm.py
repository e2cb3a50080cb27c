"""essim's engine model (sim/src/engine.rs) against vLLM 0.33's real
``Scheduler``, step by step (issue 12, "Checks").

One seeded scenario — arrivals by step, prompts drawn from a few shared
system prompts and follow-up turns that extend an earlier prompt, fixed
output lengths — runs through both:

- vLLM: the real V1 ``Scheduler`` on CPU with no model, built by the contract
  tests' harness; each step is ``schedule()`` then ``update_from_output()``
  with a fabricated ``ModelRunnerOutput`` (one token per request whose
  prefill is done), exactly as ``EngineCore.step`` makes it. Prefix caching is
  on, the token budget is small (prefills are chunked) and the KV cache is
  small (requests are preempted and recomputed).
- the model: ``essim step-trace --profile P.toml`` with the same block
  count, budget and ``max_num_seqs``, fed the same requests (the prompts'
  full blocks as chained hashes of their tokens).

After every step these must be equal: the requests scheduled and their
token counts (in scheduling order), the requests preempted, every admission
from the waiting queue with its prefix-cache hit and query tokens (as vLLM's
``record_prefix_cache_stats`` sees them), the requests finished, and the
state after the step — ``num_running``, ``num_waiting``, free KV blocks and
the snapshot fields (docs/VLLM.md, "What each field means and how the hook
computes it"). ``KNOWN_DIVERGENCES`` lists the fields allowed to differ,
each with its reason (also in docs/ROUTING.md, "Model vs vLLM"); it is empty:
the model matches vLLM on every field at every step of this scenario.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from vllm_harness import (
    BLOCK_SIZE,
    build_scheduler,
    fake_output,
    fields_from_scheduler,
    make_request,
)

NUM_BLOCKS = 97  # vLLM's count, the null block included: 96 usable = 1,536 tokens
MAX_BATCHED = 192  # token budget per step: most prompts are chunked
MAX_SEQS = 6
MAX_MODEL_LEN = 2048
REQUESTS = 200
SEED = 12

# field -> why the model may differ from vLLM there. Empty: no divergence.
KNOWN_DIVERGENCES: dict[str, str] = {}

STATE_FIELDS = (
    "num_running",
    "num_waiting",
    "gpu_blocks_free",
    "pending_prefill_tokens",
    "ongoing_decode_tokens",
    "num_prefilling",
    "max_prefill_remaining",
    "num_preempted",
)


def essim() -> Path:
    root = Path(__file__).resolve().parents[2]
    folders = [os.environ.get("ENGINE_STATE_BIN", "")]
    if os.environ.get("CARGO_TARGET_DIR"):
        folders.append(os.environ["CARGO_TARGET_DIR"] + "/release")
    folders.append(str(root / "target/release"))
    for folder in folders:
        if folder and (Path(folder) / "essim").exists():
            return Path(folder) / "essim"
    pytest.fail("essim not found: run `cargo build --release --bins` or set ENGINE_STATE_BIN")


def scenario() -> list[dict]:
    """Requests with arrival steps, prompt tokens and output lengths."""
    rng = random.Random(SEED)
    families = [[rng.randrange(3, 1000) for _ in range(rng.randint(40, 400))] for _ in range(6)]
    requests: list[dict] = []
    step = 0
    for index in range(REQUESTS):
        # Arrivals outpace the engine (with lulls): the waiting queue is
        # rarely empty, so KV blocks and max_num_seqs limit admissions.
        step += int(rng.expovariate(1 / 5)) if rng.random() < 0.8 else rng.randint(10, 40)
        # A unique marker opens every request's own tokens, so that no two
        # prompts are equal (their outputs' blocks then never collide).
        own = [3 + index // 997, 3 + index % 997]
        earlier = [r for r in requests if len(r["prompt"]) < 700]
        if earlier and rng.random() < 0.3:  # a follow-up turn: an earlier prompt, extended
            base = rng.choice(earlier)["prompt"]
        else:
            family = rng.choice(families)
            base = family[: rng.randint(1, len(family))]
        prompt = base + own + [rng.randrange(3, 1000) for _ in range(rng.randint(0, 250))]
        output = rng.choice((1, rng.randint(2, 30), rng.randint(30, 300)))
        requests.append(dict(id=index, arrival_step=step, prompt=prompt, output_len=output))
    return requests


def chained_hashes(tokens: list[int]) -> list[int]:
    """The model's block hashes: one per full 16-token block, chained."""
    hashes, parent = [], b""
    for start in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = json.dumps(tokens[start : start + BLOCK_SIZE]).encode()
        parent = hashlib.blake2b(parent + block, digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "little"))
    return hashes


def run_model(requests: list[dict], tmp_path: Path) -> list[dict]:
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f"max_num_batched_tokens = {MAX_BATCHED}\n"
        f"max_num_seqs = {MAX_SEQS}\n"
        f"kv_capacity_tokens = {(NUM_BLOCKS - 1) * BLOCK_SIZE}\n"
    )
    scenario_json = json.dumps(
        dict(
            requests=[
                dict(
                    id=r["id"],
                    arrival_step=r["arrival_step"],
                    prompt_len=len(r["prompt"]),
                    output_len=r["output_len"],
                    block_hashes=chained_hashes(r["prompt"]),
                )
                for r in requests
            ]
        )
    )
    result = subprocess.run(
        [str(essim()), "step-trace", "--profile", str(profile)],
        input=scenario_json,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return [normalize(json.loads(line)) for line in result.stdout.splitlines()]


def normalize(record: dict) -> dict:
    record["scheduled"] = [tuple(x) for x in record["scheduled"]]
    record["preempted"] = sorted(record["preempted"])
    record["finished"] = sorted(record["finished"])
    record["admitted"] = [
        (a["id"], a["hit_tokens"], a["query_tokens"], a["resumed"]) for a in record["admitted"]
    ]
    return record


def run_vllm(requests: list[dict], seen: dict) -> list[dict]:
    scheduler, _ = build_scheduler(
        False,
        prefix_caching=True,
        num_blocks=NUM_BLOCKS,
        max_num_seqs=MAX_SEQS,
        max_batched=MAX_BATCHED,
        max_model_len=MAX_MODEL_LEN,
    )
    assert type(scheduler).__name__ == "Scheduler"
    manager = scheduler.kv_cache_manager
    record_stats = manager.record_prefix_cache_stats
    admitted: list[tuple] = []

    def record(request, num_hits: int) -> None:
        admitted.append(
            (int(request.request_id), num_hits, request.num_tokens, request.num_preemptions > 0)
        )
        record_stats(request, num_hits)

    manager.record_prefix_cache_stats = record
    arrivals: dict[int, list[dict]] = {}
    for r in requests:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    records = []
    step = 0
    while True:
        for r in arrivals.pop(step, []):
            scheduler.add_request(make_request(str(r["id"]), r["prompt"], r["output_len"]))
        # EngineCore also runs schedule() once after the last request has
        # finished, to pass the finished ids on to the workers; that call
        # schedules nothing and changes nothing compared here: skipped.
        if scheduler.get_num_unfinished_requests() == 0:
            if not arrivals:
                break
            step = min(arrivals)
            continue
        admitted.clear()
        out = scheduler.schedule()
        seen["chunks"] += sum(
            scheduler.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens
        )
        outputs = scheduler.update_from_output(out, fake_output(scheduler, out, step))
        finished = [
            int(o.request_id)
            for engine_outputs in outputs.values()
            for o in engine_outputs.outputs
            if o.finish_reason is not None
        ]
        fields = fields_from_scheduler(scheduler)
        assert (fields["num_running"], fields["num_waiting"]) == scheduler.get_request_counts()
        records.append(
            dict(
                step=step,
                scheduled=[(int(rid), n) for rid, n in out.num_scheduled_tokens.items()],
                preempted=sorted(int(rid) for rid in out.preempted_req_ids),
                admitted=list(admitted),
                finished=sorted(finished),
                **{f: fields[f] for f in STATE_FIELDS},
            )
        )
        step += 1
    scheduler.shutdown()
    return records


def first_divergence(model: list[dict], vllm: list[dict]) -> str | None:
    fields = [f for f in vllm[0] if f not in KNOWN_DIVERGENCES] if vllm else []
    for i, (m, v) in enumerate(zip(model, vllm, strict=False)):
        diff = {f: (m[f], v[f]) for f in fields if m[f] != v[f]}
        if diff:
            before = "\n".join(f"  vLLM {r}" for r in vllm[max(0, i - 3) : i])
            return (
                f"step {v['step']} (record {i}): (model, vLLM) differ in {diff}\n"
                f"model: {m}\nvLLM:  {v}\nthe steps before, in vLLM:\n{before}"
            )
    if len(model) != len(vllm):
        return f"{len(model)} model steps, {len(vllm)} vLLM steps (the rest matched)"
    return None


def test_the_engine_model_schedules_as_vllm_does(tmp_path):
    requests = scenario()
    seen = dict(chunks=0)
    started = time.monotonic()
    vllm = run_vllm(requests, seen)
    vllm_s = time.monotonic() - started
    model = run_model(requests, tmp_path)

    divergence = first_divergence(model, vllm)
    assert divergence is None, divergence

    # The scenario exercises what it claims to.
    assert len(vllm) >= 2000, len(vllm)
    assert sum(r["num_running"] + r["num_waiting"] == 0 for r in vllm) < len(vllm) // 10
    preemptions = sum(len(r["preempted"]) for r in vllm)
    admissions = [a for r in vllm for a in r["admitted"]]
    fresh_hits = sum(hit for _, hit, _, resumed in admissions if not resumed)
    recompute_hits = [(rid, hit) for rid, hit, _, resumed in admissions if resumed and hit > 0]
    prompt_len = {r["id"]: len(r["prompt"]) for r in requests}
    # A recompute that found its own output's blocks still cached.
    output_block_hits = [rid for rid, hit in recompute_hits if hit > prompt_len[rid]]
    assert seen["chunks"] >= 150, seen
    assert preemptions >= 20, preemptions
    assert fresh_hits >= 10_000, fresh_hits
    assert len(recompute_hits) >= 10 and output_block_hits, (recompute_hits, output_block_hits)
    assert max(r["num_running"] for r in vllm) == MAX_SEQS
    assert sum(len(r["finished"]) for r in vllm) == REQUESTS
    print(
        f"{len(vllm)} steps ({vllm_s:.1f} s in vLLM), {seen['chunks']} prefill chunks, "
        f"{preemptions} preemptions, {fresh_hits} prefix-hit tokens at first admission, "
        f"{len(recompute_hits)} recomputes with hits ({len(output_block_hits)} into output blocks)"
    )
