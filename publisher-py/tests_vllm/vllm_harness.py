"""Builds vLLM 0.33's real V1 scheduler on CPU and drives it with fake model
outputs, the way vLLM's own tests/v1/core/utils.py does (create_scheduler,
create_requests). No GPU, network, tokenizer or weights: a hand-written
config.json of a tiny Llama.

Scenario: long prompts with a small token budget (prefills are chunked) and a
small block pool (requests are preempted and recomputed). With async
scheduling the fake output of a step is built right after its schedule() and
consumed one step later, emulating EngineCore.step_with_batch_queue.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest

BLOCK_SIZE = 16
NUM_BLOCKS = 16  # block 0 is the null block: 15 usable = 240 tokens
MAX_BATCHED = 64  # token budget per step: 100-token prompts are chunked
MAX_MODEL_LEN = 256
PROMPT_LENS = (100, 70, 100, 100, 40)  # r1 shares r0's first 64 tokens
MAX_TOKENS = 24
EOS_TOKEN_ID = 2

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,  # test_residency's sessions run to 4,096 tokens
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": EOS_TOKEN_ID,
    "torch_dtype": "float32",
}


def set_cpu_environment() -> None:
    """vLLM on a CPU-only machine, offline; call before importing vLLM."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def model_dir() -> str:
    """A folder holding ``TINY_LLAMA``'s config.json, named by its content (so
    that test runs of checkouts with another config, at the same time, do not
    overwrite it under each other), written atomically."""
    text = json.dumps(TINY_LLAMA, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"engine-state-tiny-llama-{digest}")
    os.makedirs(path, exist_ok=True)
    config = os.path.join(path, "config.json")
    if not os.path.exists(config):
        temporary = f"{config}.{os.getpid()}"
        with open(temporary, "w") as f:
            f.write(text)
        os.replace(temporary, config)
    return path


def build_scheduler(
    async_scheduling: bool,
    prefix_caching: bool = False,
    scheduler_cls: str | None = None,
    num_blocks: int = NUM_BLOCKS,
    max_num_seqs: int = 8,
    max_batched: int = MAX_BATCHED,
    policy: str = "fcfs",
    max_model_len: int = MAX_MODEL_LEN,
):
    """Returns (scheduler, vllm_config), built like EngineCore builds it."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(
        model=model_dir(),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=max_model_len,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
        watermark=0.0,
        policy=policy,
    )
    cache_config = CacheConfig(
        block_size=BLOCK_SIZE,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=prefix_caching,
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        parallel_config=ParallelConfig(),
    )
    # The CPU platform turns async scheduling off in VllmConfig.__post_init__;
    # restore it so that get_scheduler_cls() picks what a GPU engine picks.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    if scheduler_cls is not None:
        vllm_config.scheduler_config.scheduler_cls = scheduler_cls
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )
    return scheduler, vllm_config


_none_hash = False


def make_request(request_id: str, prompt_token_ids: list, max_tokens: int, **extra):
    """A request that generates exactly ``max_tokens`` tokens (EOS ignored),
    its blocks hashed as vLLM's engine hashes them (sha256, chained).
    ``extra``: more ``Request`` arguments (``cache_salt``, ...)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    global _none_hash
    if not _none_hash:
        init_none_hash(sha256)
        _none_hash = True
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, EOS_TOKEN_ID)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
        **extra,
    )


def make_requests(prompt_lens=PROMPT_LENS, max_tokens=MAX_TOKENS, prefix=""):
    return [
        make_request(f"{prefix}r{i}", [10 + (0 if i == 1 else i)] * n, max_tokens)
        for i, n in enumerate(prompt_lens)
    ]


def fields_from_scheduler(scheduler) -> dict:
    """The snapshot fields (docs/VLLM.md, "What each field means and how the
    hook computes it") computed from the scheduler, independently of the
    hook: requests are classified by their status (not by queue membership)
    and the remaining prefill uses ``num_output_tokens`` and ``num_tokens``."""
    from vllm.v1.request import RequestStatus

    live = [r for r in scheduler.requests.values() if not RequestStatus.is_finished(r.status)]
    running = [r for r in live if r.status == RequestStatus.RUNNING]

    def remaining(r) -> int:
        if r.num_output_tokens > 0:
            value = r.num_tokens - 1 - r.num_computed_tokens
        else:
            value = r.num_prompt_tokens - r.num_computed_tokens
        return max(value, 0)

    pool = scheduler.kv_cache_manager.block_pool
    return dict(
        num_running=len(running),
        num_waiting=len(live) - len(running),
        gpu_blocks_total=pool.num_gpu_blocks - 1,
        gpu_blocks_free=pool.get_num_free_blocks(),
        pending_prefill_tokens=sum(remaining(r) for r in live),
        ongoing_decode_tokens=sum(r.num_tokens for r in running if remaining(r) == 0),
        num_prefilling=sum(1 for r in running if remaining(r) > 0),
        max_prefill_remaining=max((remaining(r) for r in live), default=0),
        num_preempted=sum(1 for r in live if r.status == RequestStatus.PREEMPTED),
    )


def fake_output(scheduler, scheduler_output, step: int):
    """The model's output for ``scheduler_output``, built right after its
    schedule(): no token for a request in the middle of its prefill."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    tokens = [
        [] if scheduler.requests[rid].is_prefill_chunk else [100 + (step + i) % 500]
        for i, rid in enumerate(ids)
    ]
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=tokens,
    )


def normalize_schedule(out) -> tuple:
    """What vLLM's engine does with a SchedulerOutput, minus object identity."""
    return (
        tuple(sorted(out.num_scheduled_tokens.items())),
        out.total_num_scheduled_tokens,
        tuple(sorted(out.preempted_req_ids or ())),
        tuple(sorted(r.req_id for r in out.scheduled_new_reqs)),
        tuple(sorted(out.finished_req_ids)),
    )


def normalize_update(outputs: dict) -> tuple:
    """EngineCoreOutputs minus timestamps and events."""
    result = []
    for index in sorted(outputs):
        o = outputs[index]
        stats = o.scheduler_stats
        result.append(
            (
                index,
                tuple(
                    (x.request_id, tuple(x.new_token_ids), str(x.finish_reason), x.stop_reason)
                    for x in o.outputs
                ),
                tuple(sorted(o.finished_requests or ())),
                None
                if stats is None
                else (
                    stats.num_running_reqs,
                    stats.num_waiting_reqs,
                    round(stats.kv_cache_usage, 9),
                    stats.prefix_cache_stats.requests,
                    stats.prefix_cache_stats.queries,
                    stats.prefix_cache_stats.hits,
                    stats.prefix_cache_stats.preempted_requests,
                ),
            )
        )
    return tuple(result)


def drive(
    scheduler,
    requests,
    depth: int,
    steps: int = 200,
    on_boundary: Callable[[str, int], None] | None = None,
    before_boundary: Callable[[], None] | None = None,
):
    """EngineCore.step (depth 1) / step_with_batch_queue (depth 2). Calls
    ``on_boundary(kind, schedule_calls)`` after each schedule() and
    update_from_output(). Returns the normalized outputs of every call."""
    for request in requests:
        scheduler.add_request(request)
    inflight: deque = deque()
    trace = []
    schedule_calls = 0
    for step in range(steps):
        if scheduler.has_requests():
            if before_boundary:
                before_boundary()
            out = scheduler.schedule()
            schedule_calls += 1
            trace.append(("schedule", normalize_schedule(out)))
            if on_boundary:
                on_boundary("schedule", schedule_calls)
            if out.total_num_scheduled_tokens > 0:
                inflight.appendleft((out, fake_output(scheduler, out, step)))
            if len(inflight) < depth and out.total_num_scheduled_tokens > 0:
                continue
        if not inflight:
            break
        out, model_output = inflight.pop()
        if before_boundary:
            before_boundary()
        trace.append(("update", normalize_update(scheduler.update_from_output(out, model_output))))
        if on_boundary:
            on_boundary("update", schedule_calls)
    return trace


def sleep_past(period_ms: float) -> Callable[[], None]:
    """A ``before_boundary`` that lets the hook's period expire."""

    def wait() -> None:
        time.sleep(period_ms / 1000 * 1.2)

    return wait


def esdump() -> Path:
    """The esdump binary built from this tree (ENGINE_STATE_BIN, CARGO_TARGET_DIR
    or target/release)."""
    root = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("ENGINE_STATE_BIN", ""), os.environ.get("CARGO_TARGET_DIR", "")]
    for folder in candidates[:1] + [f"{candidates[1]}/release", str(root / "target/release")]:
        if folder and (Path(folder) / "esdump").exists():
            return Path(folder) / "esdump"
    pytest.fail("esdump not found: run `cargo build --release --bins` or set ENGINE_STATE_BIN")
