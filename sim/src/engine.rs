//! One modelled vLLM 0.33 engine with V1 scheduler semantics: continuous
//! batching, an FCFS waiting queue, a token budget and `max_num_seqs` per
//! step, running requests first then waiting ones, chunked prefill, 16-token
//! KV blocks with prefix caching, and preemption by recompute.
//!
//! Pure, like the router's `policy.rs`: [`Engine::schedule`] turns the state
//! into one [`ScheduledStep`] (with its modelled duration) and
//! [`Engine::finish_step`] applies its outcome; the driver owns the clock.
//! Checked step by step against vLLM 0.33's real scheduler by
//! sim/tests_vllm (docs/ROUTING.md, "Model vs vLLM").

use std::collections::VecDeque;

use std::rc::Rc;
use std::sync::Arc;

use engine_state_shm_format::{CacheDigest, RequestTokens, Snapshot, WaitingRequest};

use crate::kv::{BlockPool, U64Map};
use crate::profile::{EngineProfile, KV_BLOCK_TOKENS};
use crate::residency::{Capture, Residency, KV_PER_ROUTER_BLOCK};
use crate::trace::mix;

/// A request as an engine receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRequest {
    /// The caller's id (unique per engine).
    pub id: u64,
    /// Prompt tokens.
    pub prompt_len: u64,
    /// Tokens to generate (at least 1; the first is sampled by the step that
    /// completes the prefill).
    pub output_len: u64,
    /// Chained hashes of the request's full 16-token blocks, leading block
    /// first: the prompt's, and the output's where the caller knows them
    /// (an append-only session whose next turn contains this output). Blocks
    /// past the list hold content of the request's own (its output: vLLM
    /// hashes and caches output blocks too, so a recompute after a
    /// preemption can hit them); the engine hashes those from the id.
    pub block_hashes: Vec<u64>,
    /// Chained hashes of the 512-token router blocks `block_hashes` covers
    /// in full (router block `b` = its KV blocks `32b .. 32b + 32`): what a
    /// digest lists when the engine holds them (only read by an engine that
    /// publishes its cache residency, [`Engine::publish_residency`]).
    pub router_block_hashes: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Waiting,
    Running,
    /// Back in the waiting queue after a preemption, not yet re-admitted.
    Preempted,
}

#[derive(Clone, Debug)]
struct Live {
    request: EngineRequest,
    num_computed: u64,
    num_output: u64,
    blocks: Vec<u32>,
    /// Leading blocks already offered to the prefix cache.
    num_cached_blocks: usize,
    status: Status,
}

/// Salt of the hashes of blocks past [`EngineRequest::block_hashes`].
const OWN_BLOCK_SALT: u64 = 0x6f77_6e5f_626c_6f63;

impl Live {
    /// The chained hash of 16-token block `index` of this request.
    fn block_hash(&self, index: usize) -> u64 {
        match self.request.block_hashes.get(index) {
            Some(&hash) => hash,
            None => mix(OWN_BLOCK_SALT ^ self.request.id, index as u64),
        }
    }

    fn num_tokens(&self) -> u64 {
        self.request.prompt_len + self.num_output
    }

    /// The token counts its remaining prefill and decode load come from,
    /// as the vLLM hook reads them from a vLLM request.
    fn tokens(&self) -> RequestTokens {
        RequestTokens {
            prompt: self.request.prompt_len as i64,
            computed: self.num_computed as i64,
            tokens: self.num_tokens() as i64,
        }
    }

    /// Remaining prefill, 0 for a decoding request (shm-format's rule).
    fn remaining_prefill(&self) -> u64 {
        self.tokens().remaining_prefill()
    }
}

/// What one `schedule()` call decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduledStep {
    /// `(request id, tokens scheduled)` in scheduling order.
    pub scheduled: Vec<(u64, u64)>,
    /// Prompt (or recompute) tokens in this step.
    pub prefill_tokens: u64,
    /// Requests decoding one token.
    pub decode_seqs: u64,
    /// Σ context tokens of the decoding requests.
    pub decode_context_tokens: u64,
    /// Requests preempted by this step, in order.
    pub preempted: Vec<u64>,
    /// Tokens served from the prefix cache at first admissions in this step
    /// (as vLLM's prefix-cache stats count them: a recompute after a
    /// preemption is counted apart, see [`ScheduledStep::admitted`]).
    pub prefix_hit_tokens: u64,
    /// Tokens looked up in the prefix cache at first admissions in this step.
    pub prefix_query_tokens: u64,
    /// Every admission from the waiting queue in this step, in order.
    pub admitted: Vec<Admission>,
    /// The step's modelled duration.
    pub duration_ns: u64,
}

impl ScheduledStep {
    /// Nothing was scheduled (no work, or none that fits).
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// One admission from the waiting queue and its prefix-cache lookup (what
/// vLLM's `KVCacheManager.record_prefix_cache_stats` records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Admission {
    /// The request.
    pub id: u64,
    /// Tokens served from the prefix cache (whole blocks).
    pub hit_tokens: u64,
    /// Tokens looked up: the request's prompt plus outputs so far.
    pub query_tokens: u64,
    /// Re-admitted after a preemption (vLLM counts these apart).
    pub resumed: bool,
}

/// What a finished step produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// Requests that sampled their first token.
    pub first_token: Vec<u64>,
    /// Requests that sampled their last token and left the engine.
    pub finished: Vec<u64>,
}

/// Cumulative counters of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Steps run.
    pub steps: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prefix-cache hit tokens at first admissions (vLLM's
    /// `vllm:prefix_cache_hits`, which leaves out recomputes after preemption).
    pub prefix_hit_tokens: u64,
    /// Prefix-cache queried tokens at first admissions (`vllm:prefix_cache_queries`).
    pub prefix_query_tokens: u64,
}

/// One engine: its queues, its KV pool and its counters.
#[derive(Clone, Debug)]
pub struct Engine {
    profile: EngineProfile,
    pool: BlockPool,
    live: U64Map<Live>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    counters: EngineCounters,
}

impl Engine {
    /// An empty engine. The profile must be valid ([`EngineProfile::validate`]).
    pub fn new(profile: EngineProfile) -> Engine {
        let pool = BlockPool::new(profile.kv_blocks() as usize);
        Engine {
            profile,
            pool,
            live: U64Map::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: EngineCounters::default(),
        }
    }

    /// Its profile.
    pub fn profile(&self) -> &EngineProfile {
        &self.profile
    }

    /// Whether a request of this size can ever run here (vLLM refuses
    /// requests longer than the KV cache holds).
    pub fn fits(&self, prompt_len: u64, output_len: u64) -> bool {
        (prompt_len + output_len).div_ceil(KV_BLOCK_TOKENS) <= self.pool.total() as u64
    }

    /// Keep track of which router blocks the prefix cache holds in full,
    /// for [`Engine::cache_digest`] (from now on: call it before adding
    /// requests).
    pub fn publish_residency(&mut self) {
        debug_assert!(self.live.is_empty(), "tracking starts on an empty engine");
        self.pool.residency = Some(Residency::default());
    }

    /// The engine's cache digest as of `now_ns` (docs/FORMAT.md, "Cache
    /// residency"): the router blocks whose 32 KV blocks are all cached,
    /// prefix-closed; a new version only when the set changed. `None` unless
    /// [`Engine::publish_residency`] was called.
    pub fn cache_digest(&mut self, now_ns: u64) -> Option<Arc<CacheDigest>> {
        Some(self.capture_residency(now_ns)?.digest())
    }

    /// What [`Engine::cache_digest`] would return, captured now and made
    /// into a digest only when read (the feed's captures, most of them
    /// superseded before any router reads them).
    pub(crate) fn capture_residency(&mut self, now_ns: u64) -> Option<Rc<Capture>> {
        Some(self.pool.residency.as_mut()?.capture(now_ns))
    }

    /// Queue a request at the back of the waiting queue.
    pub fn add_request(&mut self, request: EngineRequest) {
        let id = request.id;
        assert!(
            self.fits(request.prompt_len, request.output_len.max(1)),
            "request {id} does not fit the KV cache: check with Engine::fits first"
        );
        assert!(
            request.router_block_hashes.len() * KV_PER_ROUTER_BLOCK <= request.block_hashes.len(),
            "request {id}: router blocks past its KV block hashes"
        );
        if let Some(mut residency) = self.pool.residency.take() {
            let pool = &self.pool;
            residency.add_request(&request.router_block_hashes, &request.block_hashes, |h| {
                pool.is_cached(h)
            });
            self.pool.residency = Some(residency);
        }
        let live = Live {
            request: EngineRequest {
                output_len: request.output_len.max(1),
                ..request
            },
            num_computed: 0,
            num_output: 0,
            blocks: Vec::new(),
            num_cached_blocks: 0,
            status: Status::Waiting,
        };
        assert!(
            self.live.insert(id, live).is_none(),
            "request {id} added twice"
        );
        self.waiting.push_back(id);
    }

    /// Remove a request wherever it is (vLLM's abort: a client went away):
    /// its blocks are freed as at a finish (the computed ones stay cached).
    /// False if the engine does not hold it (finished, or never added).
    /// Call it between steps, as vLLM applies aborts between steps.
    pub fn abort(&mut self, id: u64) -> bool {
        let Some(live) = self.live.remove(&id) else {
            return false;
        };
        self.pool.release(&live.blocks);
        if let Some(residency) = &mut self.pool.residency {
            residency.remove_request(&live.request.router_block_hashes);
        }
        match live.status {
            Status::Running => self.running.retain(|&r| r != id),
            Status::Waiting | Status::Preempted => self.waiting.retain(|&r| r != id),
        }
        true
    }

    /// Tokens request `id` has sampled so far (`None`: not in the engine).
    pub fn num_output(&self, id: u64) -> Option<u64> {
        self.live.get(&id).map(|live| live.num_output)
    }

    /// Requests in the engine.
    pub fn num_requests(&self) -> usize {
        self.live.len()
    }

    /// Cumulative counters.
    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Free KV blocks (evictable cached blocks included).
    pub fn free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Usable KV blocks.
    pub fn total_blocks(&self) -> usize {
        self.pool.total()
    }

    /// Allocate blocks so `request` holds `tokens` tokens' worth, counting
    /// `extra_evictable` revived free blocks against the free count.
    fn grow(&mut self, id: u64, tokens: u64, extra_evictable: usize) -> bool {
        let live = self.live.get_mut(&id).expect("live request");
        let need = tokens.div_ceil(KV_BLOCK_TOKENS) as usize;
        let missing = need.saturating_sub(live.blocks.len());
        if missing + extra_evictable > self.pool.num_free() {
            return false;
        }
        let ok = self.pool.allocate(missing, &mut live.blocks);
        debug_assert!(ok);
        true
    }

    /// Offer the full blocks covered by `tokens` computed tokens (prompt and
    /// output) to the prefix cache: vLLM caches blocks as they are allocated
    /// and filled, up to the request's known tokens.
    fn cache_full_blocks(&mut self, id: u64, tokens: u64) {
        let live = self.live.get_mut(&id).expect("live request");
        let full = (tokens / KV_BLOCK_TOKENS) as usize;
        for i in live.num_cached_blocks..full {
            self.pool.cache(live.blocks[i], live.block_hash(i));
        }
        live.num_cached_blocks = live.num_cached_blocks.max(full);
    }

    fn preempt(&mut self, id: u64) {
        let live = self.live.get_mut(&id).expect("live request");
        self.pool.release(&live.blocks);
        live.blocks.clear();
        live.num_cached_blocks = 0;
        live.num_computed = 0;
        live.status = Status::Preempted;
        self.waiting.push_front(id);
        self.counters.preemptions += 1;
    }

    /// One `schedule()` call: running requests first (each its decode token
    /// or next prefill chunk, preempting the newest running request while
    /// blocks run out), then — only if nothing was preempted — waiting
    /// requests in FCFS order while budget, `max_num_seqs` and blocks for
    /// their whole prompt (plus outputs so far) allow.
    /// Scheduled tokens count as computed at once (`_update_after_schedule`).
    pub fn schedule(&mut self) -> ScheduledStep {
        let mut step = ScheduledStep::default();
        let mut budget = self.profile.max_num_batched_tokens;
        let mut index = 0;
        while index < self.running.len() && budget > 0 {
            let id = self.running[index];
            let live = &self.live[&id];
            let new_tokens = (live.num_tokens() - live.num_computed).min(budget);
            if new_tokens == 0 {
                index += 1;
                continue;
            }
            let target = live.num_computed + new_tokens;
            let mut scheduled = true;
            while !self.grow(id, target, 0) {
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim);
                step.preempted.push(victim);
                if victim == id {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                break;
            }
            self.account(&mut step, id, new_tokens);
            budget -= new_tokens;
            index += 1;
        }
        if step.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.profile.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let live = &self.live[&id];
                let num_tokens = live.num_tokens();
                // At most num_tokens - 1 may hit: one token must be computed
                // to sample from (vLLM's max_cache_hit_length).
                let max_hit_blocks = ((num_tokens - 1) / KV_BLOCK_TOKENS) as usize;
                let hit = self
                    .pool
                    .longest_hit((0..max_hit_blocks).map(|i| live.block_hash(i)));
                let hit_tokens = hit.len() as u64 * KV_BLOCK_TOKENS;
                let new_tokens = (num_tokens - hit_tokens).min(budget);
                // Admission needs blocks for all of the request's tokens, not
                // only this chunk's (`scheduler_reserve_full_isl`, on by
                // default in 0.33: `allocate_slots(full_sequence_must_fit)`);
                // revived cached blocks leave the free queue, so they count.
                let evictable = self.pool.evictable(&hit);
                let need = num_tokens.div_ceil(KV_BLOCK_TOKENS) as usize;
                if need - hit.len() + evictable > self.pool.num_free() {
                    break;
                }
                self.pool.touch(&hit);
                let live = self.live.get_mut(&id).expect("live request");
                let resumed = live.status == Status::Preempted;
                live.blocks = hit;
                live.num_cached_blocks = live.blocks.len();
                live.num_computed = hit_tokens;
                live.status = Status::Running;
                let ok = self.grow(id, hit_tokens + new_tokens, 0);
                debug_assert!(ok, "checked above");
                if !resumed {
                    step.prefix_hit_tokens += hit_tokens;
                    step.prefix_query_tokens += num_tokens;
                }
                step.admitted.push(Admission {
                    id,
                    hit_tokens,
                    query_tokens: num_tokens,
                    resumed,
                });
                self.waiting.pop_front();
                self.running.push(id);
                self.account(&mut step, id, new_tokens);
                budget -= new_tokens;
            }
        }
        self.counters.prefix_hit_tokens += step.prefix_hit_tokens;
        self.counters.prefix_query_tokens += step.prefix_query_tokens;
        step.duration_ns = self.profile.step_ns(
            step.prefill_tokens,
            step.decode_seqs,
            step.decode_context_tokens,
        );
        step
    }

    /// Count a scheduled request into the step and advance its computed tokens.
    fn account(&mut self, step: &mut ScheduledStep, id: u64, new_tokens: u64) {
        let live = self.live.get_mut(&id).expect("live request");
        let decoding = live.num_output > 0 && live.remaining_prefill() == 0 && new_tokens == 1;
        if decoding {
            step.decode_seqs += 1;
            step.decode_context_tokens += live.num_tokens();
        } else {
            step.prefill_tokens += new_tokens;
        }
        live.num_computed += new_tokens;
        let computed = live.num_computed;
        step.scheduled.push((id, new_tokens));
        self.cache_full_blocks(id, computed);
    }

    /// `update_from_output()`: every scheduled request whose tokens are all
    /// computed samples one token; those that reach their output length
    /// finish and free their blocks (tail first).
    pub fn finish_step(&mut self, step: &ScheduledStep) -> StepOutput {
        self.counters.steps += 1;
        let mut output = StepOutput::default();
        for &(id, _) in &step.scheduled {
            let Some(live) = self.live.get_mut(&id) else {
                continue;
            };
            if live.status != Status::Running || live.num_computed < live.num_tokens() {
                continue; // a prefill chunk short of the end samples nothing
            }
            live.num_output += 1;
            if live.num_output == 1 {
                output.first_token.push(id);
            }
            if live.num_output >= live.request.output_len {
                self.pool.release(&live.blocks);
                if let Some(residency) = &mut self.pool.residency {
                    residency.remove_request(&live.request.router_block_hashes);
                }
                self.live.remove(&id);
                self.running.retain(|&r| r != id);
                output.finished.push(id);
            }
        }
        output
    }

    /// The snapshot of this state (docs/FORMAT.md, "Snapshot words"; the
    /// request sums by shm-format's aggregation, as the vLLM hook's capture
    /// makes them): `captured_*` left 0 for the caller to stamp; the idle
    /// flag from the counts.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot {
            step: self.counters.steps,
            gpu_blocks_total: self.pool.total() as u64,
            gpu_blocks_free: self.pool.num_free() as u64,
            ..Snapshot::default()
        };
        for live in self.live.values() {
            match live.status {
                Status::Running => s.add_running(live.tokens()),
                Status::Waiting | Status::Preempted => s.add_waiting(WaitingRequest {
                    remaining_prefill: live.remaining_prefill(),
                    preempted: live.status == Status::Preempted,
                }),
            }
        }
        // Every live request is in exactly the queue its status names.
        debug_assert_eq!(
            (s.num_running, s.num_waiting),
            (self.running.len() as u64, self.waiting.len() as u64)
        );
        s.set_idle_from_counts();
        s
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
