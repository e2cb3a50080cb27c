//! Shadow accounting: what the router itself has sent to one instance.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::blocks::BLOCK_TOKENS;
use crate::lru::Lru;

/// The router's own counters for one instance (DESIGN §8), kept from the
/// requests it reserved there and has not yet seen complete, fail or drop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShadowCounters {
    /// Reserved requests not yet released.
    pub num_requests: u64,
    /// Prompt tokens of those requests.
    pub ongoing_tokens: u64,
    /// Prefill still to do: `input_len - cache hit` of requests before `prefill_done`.
    pub pending_prefill_tokens: u64,
    /// Prompt tokens of requests after `prefill_done` (their decode context).
    pub ongoing_decode_tokens: u64,
    /// Requests before `prefill_done`.
    pub num_prefilling: u64,
    /// Largest pending prefill of one request before `prefill_done`.
    pub max_prefill_remaining: u64,
}

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
        ShadowCounters {
            max_prefill_remaining: self.prefills.keys().next_back().copied().unwrap_or(0),
            ..self.counters
        }
    }

    /// Tokens covered by the longest run of leading blocks in the cache.
    ///
    /// Found by binary search, which is exact because the cached blocks of
    /// any prompt always form a leading run: [`remember_prefix`] touches a
    /// prefix's blocks last to first, and block hashes chain, so every touch
    /// of a block is followed by a touch of its predecessor; a block is thus
    /// always used more recently than any successor, and LRU eviction removes
    /// successors first. (Past a miss, a later block present could only be a
    /// 64-bit collision.) On a 200k-token prompt this is 9 lookups, not 390
    /// cache-missing ones.
    ///
    /// [`remember_prefix`]: InstanceShadow::remember_prefix
    pub(crate) fn cache_hit_tokens(&self, blocks: &[u64]) -> u64 {
        let run = blocks.partition_point(|&hash| self.cache.contains(hash));
        (run * BLOCK_TOKENS) as u64
    }

    /// The same by a linear scan, to check the binary search against.
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
        for &hash in blocks.iter().rev() {
            self.cache.insert(hash, ());
        }
    }

    pub(crate) fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    pub(crate) fn reserve(&mut self, load: Load) {
        let c = &mut self.counters;
        c.num_requests += 1;
        c.ongoing_tokens += load.input_len;
        c.pending_prefill_tokens += load.new_prefill;
        c.num_prefilling += 1;
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

    /// Chained prompts over a shared tree of prefixes, a small cache, many
    /// evictions: the binary search always equals the linear scan.
    #[test]
    fn binary_search_matches_the_linear_scan_under_eviction() {
        use crate::blocks::block_hashes;
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        for capacity in [1, 3, 8, 20] {
            let mut shadow = InstanceShadow::new(capacity);
            for _ in 0..2000 {
                // Blocks from a 4-ary tree of prefixes: lots of shared heads.
                let len = next(12) as usize;
                let tokens: Vec<u32> = (0..len as u32)
                    .flat_map(|block| {
                        let choice = block * 4 + next(4) as u32;
                        std::iter::repeat_n(choice, BLOCK_TOKENS)
                    })
                    .collect();
                let blocks = block_hashes(&tokens);
                assert_eq!(
                    shadow.cache_hit_tokens(&blocks),
                    shadow.cache_hit_tokens_linear(&blocks)
                );
                if next(2) == 0 {
                    shadow.remember_prefix(&blocks);
                }
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
