//! Shadow accounting: what the router itself has sent to one instance.

use std::collections::BTreeMap;

use crate::lru::Lru;
use engine_state_shm_format::blocks::BLOCK_TOKENS;

/// The router's own counters for one instance (docs/ROUTING.md, "Shadow
/// accounting"), kept from the requests it reserved there and has not yet
/// seen complete, fail or drop: shm-format's `Reservations`, the record a
/// replica shares with its peers (docs/FORMAT.md, "Shared reservations"),
/// so that the counters and their order live in one place.
///
/// - `num_requests`: reserved requests not yet released;
/// - `ongoing_tokens`: prompt tokens of those requests;
/// - `pending_prefill_tokens`: prefill still to do, `input_len - cache hit`
///   of requests before `prefill_done`;
/// - `ongoing_decode_tokens`: prompt tokens of requests after
///   `prefill_done` (their decode context);
/// - `num_prefilling`: requests before `prefill_done`;
/// - `max_prefill_remaining`: largest pending prefill of one request before
///   `prefill_done`.
pub type ShadowCounters = engine_state_shm_format::Reservations;

/// What one reservation added to an instance's counters, so that releasing it
/// takes back exactly that (never a recomputed amount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Load {
    pub input_len: u64,
    pub new_prefill: u64,
}

/// Counters plus the prefix-block cache of one instance.
#[derive(Debug)]
pub(crate) struct InstanceShadow {
    /// `max_prefill_remaining` included: kept current by every change to
    /// `prefills`, since every decision reads every instance's counters.
    counters: ShadowCounters,
    /// Multiset of pending prefills, for `max_prefill_remaining`.
    prefills: BTreeMap<u64, u32>,
    cache: Lru<()>,
}

/// Subtract a released amount. A release can only take back what a
/// reservation added, so underflow is a bug: it panics in debug builds (and
/// the property tests), and saturates in release builds, because a wrapped
/// counter would make the instance look infinitely loaded forever.
fn take(counter: &mut u64, amount: u64) {
    debug_assert!(
        *counter >= amount,
        "shadow counter underflow: {counter} - {amount}"
    );
    *counter = counter.saturating_sub(amount);
}

impl InstanceShadow {
    pub(crate) fn new(cache_blocks: usize) -> InstanceShadow {
        InstanceShadow {
            counters: ShadowCounters::default(),
            prefills: BTreeMap::new(),
            cache: Lru::new(cache_blocks),
        }
    }

    pub(crate) fn counters(&self) -> ShadowCounters {
        self.counters
    }

    /// Tokens covered by the longest run of leading blocks in the cache.
    ///
    /// The cached blocks of any prompt always form a leading run:
    /// [`remember_prefix`] touches a prefix's blocks last to first, and block
    /// hashes chain, so every touch of a block is followed by a touch of its
    /// predecessor; a block is thus always used more recently than any
    /// successor, and LRU eviction removes successors first. (Past a miss, a
    /// later block present could only be a 64-bit collision.) "Block `i` is
    /// cached" is thus true up to the run's end and false after it, and the
    /// end can be searched for instead of scanned to.
    ///
    /// The search gallops from the start: it probes blocks 1, 3, 7, 15, …
    /// (and the last block) until one misses, then bisects the last gap.
    /// That is about `2 log2(run)` lookups instead of `log2(blocks)`: most
    /// instances share only a short head with a prompt (a system prompt, a
    /// tool list), and on a 200k-token prompt they cost 3 lookups, not 9.
    /// The instance holding the whole conversation costs at most twice a
    /// plain bisection's lookups, and the same when its run covers the
    /// prompt.
    ///
    /// [`remember_prefix`]: InstanceShadow::remember_prefix
    pub(crate) fn cache_hit_tokens(&self, blocks: &[u64]) -> u64 {
        let cached = |index: usize| self.cache.contains(blocks[index]);
        // Blocks before `start` are cached; block `end` (if any) is not.
        let (mut start, mut end) = (0, blocks.len());
        let mut probe = 1;
        while start < end {
            let index = probe.min(end - 1);
            if cached(index) {
                start = index + 1;
                probe = 2 * probe + 1;
            } else {
                end = index;
                break;
            }
        }
        // Bisect the gap between the last probe that hit and the one that missed.
        while start < end {
            let middle = start + (end - start) / 2;
            if cached(middle) {
                start = middle + 1;
            } else {
                end = middle;
            }
        }
        (start * BLOCK_TOKENS) as u64
    }

    /// The same by a linear scan, to check the search against.
    #[cfg(test)]
    fn cache_hit_tokens_linear(&self, blocks: &[u64]) -> u64 {
        let run = blocks
            .iter()
            .take_while(|&&hash| self.cache.contains(hash))
            .count();
        (run * BLOCK_TOKENS) as u64
    }

    /// Record that the instance will hold this prefix once it has prefilled it.
    ///
    /// Inserted last block first, so the leading blocks are the most recently
    /// used and a full cache evicts prefixes from the tail (as vLLM frees
    /// them): this keeps every prompt's cached part a leading run.
    pub(crate) fn remember_prefix(&mut self, blocks: &[u64]) {
        self.cache.insert_run(blocks);
    }

    pub(crate) fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// The counters without one of its reservations (`decoding`: that
    /// reservation's `prefill_done` was called): what migration advice about
    /// a request already reserved here compares, so that the request does not
    /// count against itself (docs/ROUTING.md, "Migration").
    pub(crate) fn counters_without(&self, load: Load, decoding: bool) -> ShadowCounters {
        let mut c = self.counters;
        c.num_requests = c.num_requests.saturating_sub(1);
        c.ongoing_tokens = c.ongoing_tokens.saturating_sub(load.input_len);
        if decoding {
            c.ongoing_decode_tokens = c.ongoing_decode_tokens.saturating_sub(load.input_len);
        } else {
            c.pending_prefill_tokens = c.pending_prefill_tokens.saturating_sub(load.new_prefill);
            c.num_prefilling = c.num_prefilling.saturating_sub(1);
            // The max of the multiset with one `new_prefill` taken out.
            if self.prefills.get(&load.new_prefill) == Some(&1)
                && c.max_prefill_remaining == load.new_prefill
            {
                c.max_prefill_remaining = self
                    .prefills
                    .range(..load.new_prefill)
                    .next_back()
                    .map_or(0, |(&prefill, _)| prefill);
            }
        }
        c
    }

    pub(crate) fn reserve(&mut self, load: Load) {
        let c = &mut self.counters;
        c.num_requests += 1;
        c.ongoing_tokens += load.input_len;
        c.pending_prefill_tokens += load.new_prefill;
        c.num_prefilling += 1;
        c.max_prefill_remaining = c.max_prefill_remaining.max(load.new_prefill);
        *self.prefills.entry(load.new_prefill).or_insert(0) += 1;
    }

    /// Move a request's tokens from pending prefill to decode.
    pub(crate) fn prefill_done(&mut self, load: Load) {
        self.end_prefill(load);
        self.counters.ongoing_decode_tokens += load.input_len;
    }

    /// Take back everything a reservation added; `decoding` says whether its
    /// `prefill_done` already moved it to decode.
    pub(crate) fn release(&mut self, load: Load, decoding: bool) {
        if decoding {
            take(&mut self.counters.ongoing_decode_tokens, load.input_len);
        } else {
            self.end_prefill(load);
        }
        take(&mut self.counters.num_requests, 1);
        take(&mut self.counters.ongoing_tokens, load.input_len);
    }

    fn end_prefill(&mut self, load: Load) {
        take(&mut self.counters.pending_prefill_tokens, load.new_prefill);
        take(&mut self.counters.num_prefilling, 1);
        match self.prefills.get_mut(&load.new_prefill) {
            Some(1) => {
                self.prefills.remove(&load.new_prefill);
                self.counters.max_prefill_remaining =
                    self.prefills.keys().next_back().copied().unwrap_or(0);
            }
            Some(count) => *count -= 1,
            None => debug_assert!(false, "released a prefill that was never reserved"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_moves_and_releases_tokens() {
        let mut shadow = InstanceShadow::new(16);
        let a = Load {
            input_len: 1000,
            new_prefill: 800,
        };
        let b = Load {
            input_len: 300,
            new_prefill: 300,
        };
        shadow.reserve(a);
        shadow.reserve(b);
        let c = shadow.counters();
        assert_eq!((c.num_requests, c.ongoing_tokens), (2, 1300));
        assert_eq!(
            (
                c.pending_prefill_tokens,
                c.num_prefilling,
                c.max_prefill_remaining
            ),
            (1100, 2, 800)
        );

        shadow.prefill_done(a);
        let c = shadow.counters();
        assert_eq!(
            (c.pending_prefill_tokens, c.ongoing_decode_tokens),
            (300, 1000)
        );
        assert_eq!((c.num_prefilling, c.max_prefill_remaining), (1, 300));

        shadow.release(a, true);
        shadow.release(b, false);
        assert_eq!(shadow.counters(), ShadowCounters::default());
    }

    #[test]
    fn counters_without_a_reservation_equal_those_never_given_it() {
        let loads = [(1000, 800), (300, 300), (5000, 5000), (300, 300), (70, 0)].map(
            |(input_len, new_prefill)| Load {
                input_len,
                new_prefill,
            },
        );
        for (left_out, decoding) in (0..loads.len()).flat_map(|i| [(i, false), (i, true)]) {
            let (mut with, mut without) = (InstanceShadow::new(16), InstanceShadow::new(16));
            for (i, &load) in loads.iter().enumerate() {
                with.reserve(load);
                if i != left_out {
                    without.reserve(load);
                }
            }
            if decoding {
                with.prefill_done(loads[left_out]);
            }
            assert_eq!(
                with.counters_without(loads[left_out], decoding),
                without.counters(),
                "reservation {left_out} left out (decoding: {decoding})"
            );
        }
    }

    #[test]
    fn equal_prefills_are_counted_separately_for_the_max() {
        let mut shadow = InstanceShadow::new(16);
        let load = Load {
            input_len: 10,
            new_prefill: 10,
        };
        shadow.reserve(load);
        shadow.reserve(load);
        shadow.release(load, false);
        assert_eq!(shadow.counters().max_prefill_remaining, 10);
        shadow.release(load, false);
        assert_eq!(shadow.counters().max_prefill_remaining, 0);
    }

    #[test]
    fn cache_hit_is_the_leading_run() {
        let mut shadow = InstanceShadow::new(16);
        shadow.remember_prefix(&[1, 2, 3]);
        assert_eq!(shadow.cache_hit_tokens(&[1, 2, 3, 4, 5]), 3 * 512);
        assert_eq!(shadow.cache_hit_tokens(&[1, 2]), 2 * 512);
        assert_eq!(shadow.cache_hit_tokens(&[9, 10, 11]), 0);
        assert_eq!(shadow.cache_hit_tokens(&[]), 0);
    }

    /// Chained prompts over a shared tree of prefixes, later turns that
    /// extend earlier prompts, a small cache, many evictions: the search
    /// always equals the linear scan.
    #[test]
    fn search_matches_the_linear_scan_under_eviction() {
        use engine_state_shm_format::blocks::block_hashes;
        let mut next = crate::xorshift(0x2545_f491_4f6c_dd1d_u64);
        for (capacity, max_len, arity) in [
            (1, 12, 4),
            (3, 12, 4),
            (8, 12, 4),
            (20, 12, 4),
            (20, 40, 2),
            (64, 40, 2),
        ] {
            let mut shadow = InstanceShadow::new(capacity);
            let mut earlier: Vec<Vec<u32>> = Vec::new();
            for _ in 0..2000 {
                let tokens: Vec<u32> = if !earlier.is_empty() && next(3) == 0 {
                    // A later turn: an earlier prompt plus up to 3 blocks.
                    let mut tokens = earlier[next(earlier.len() as u64) as usize].clone();
                    let extra = next(4) as u32 * BLOCK_TOKENS as u32;
                    tokens.extend((0..extra).map(|i| i ^ next(2) as u32));
                    tokens
                } else {
                    // Blocks from a tree of prefixes: lots of shared heads.
                    let len = next(max_len) as u32;
                    (0..len)
                        .flat_map(|block| {
                            let choice = block * arity + next(u64::from(arity)) as u32;
                            std::iter::repeat_n(choice, BLOCK_TOKENS)
                        })
                        .collect()
                };
                let blocks = block_hashes(&tokens);
                assert_eq!(
                    shadow.cache_hit_tokens(&blocks),
                    shadow.cache_hit_tokens_linear(&blocks)
                );
                if next(2) == 0 {
                    shadow.remember_prefix(&blocks);
                }
                earlier.push(tokens);
                if earlier.len() > 30 {
                    earlier.swap_remove(next(30) as usize);
                }
            }
        }
    }

    /// Every run length in every prompt length, across the galloping
    /// search's probe positions (1, 3, 7, … and the last block).
    #[test]
    fn search_finds_every_run_length() {
        let prompt: Vec<u64> = (1..=70).collect();
        for run in 0..=prompt.len() {
            let mut shadow = InstanceShadow::new(100);
            shadow.remember_prefix(&prompt[..run]);
            for len in 0..=prompt.len() {
                let want = (run.min(len) * BLOCK_TOKENS) as u64;
                assert_eq!(
                    shadow.cache_hit_tokens(&prompt[..len]),
                    want,
                    "run {run}, prompt {len} blocks"
                );
            }
        }
    }

    #[test]
    fn a_full_cache_evicts_prefix_tails_first() {
        let mut shadow = InstanceShadow::new(4);
        shadow.remember_prefix(&[1, 2, 3]);
        shadow.remember_prefix(&[7, 8]); // one slot short: evicts block 3
        assert_eq!(
            shadow.cache_hit_tokens(&[1, 2, 3]),
            2 * 512,
            "the tail went, 1 and 2 stay"
        );
        assert_eq!(shadow.cache_hit_tokens(&[7, 8]), 2 * 512);
    }
}
