//! How many entries a cache digest holds, and which blocks it keeps when
//! the engine holds more (docs/FORMAT.md, "Cache residency").

use crate::blocks::BLOCK_TOKENS;
use crate::digest_layout::MAX_DIGEST_ENTRIES;

/// The default capacity of an engine's digest: the most distinct full
/// router blocks its KV cache can hold, `gpu_blocks_total × kv_block_size /
/// 512` (floor; ~430 on a 220k-token engine), at most
/// [`MAX_DIGEST_ENTRIES`]. Saturating: absurd inputs give the limit, never
/// an overflow.
pub fn default_cache_capacity(gpu_blocks_total: u64, kv_block_size: u64) -> usize {
    let blocks = gpu_blocks_total.saturating_mul(kv_block_size) / BLOCK_TOKENS as u64;
    usize::try_from(blocks)
        .unwrap_or(usize::MAX)
        .min(MAX_DIGEST_ENTRIES)
}

/// One block an engine holds, as its capture sees it: what the overflow
/// rule ([`cut_prefix_closed`]) sorts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DigestEntry {
    /// The router block hash ([`crate::blocks`]).
    pub hash: u64,
    /// The block's index in its prompt (0 for the first block): every
    /// block before it in the prompt has a smaller depth.
    pub depth: u32,
    /// When the block was last used, on any clock that grows (larger: more
    /// recent); ties keep their input order.
    pub last_used: u64,
}

/// The overflow rule: keeps at most `capacity` of `entries`, by depth in
/// the prompt ascending, then most recently used first; the kept entries
/// are left in that order (a digest sorts them by hash).
///
/// A prefix-closed input stays prefix-closed: a kept block's predecessors
/// all have smaller depths, so they sort before it and are kept too. The
/// cut is a stable sort and a truncation: `O(n log n)`, only when the
/// engine holds more than `capacity` (nothing is done otherwise).
pub fn cut_prefix_closed(entries: &mut Vec<DigestEntry>, capacity: usize) {
    if entries.len() <= capacity {
        return;
    }
    entries.sort_by(|a, b| {
        a.depth
            .cmp(&b.depth)
            .then_with(|| b.last_used.cmp(&a.last_used))
    });
    entries.truncate(capacity);
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn default_capacity_is_full_router_blocks() {
        // 220k tokens in 16-token blocks: 13 750 blocks, 429 full router blocks.
        assert_eq!(default_cache_capacity(13_750, 16), 429);
        assert_eq!(default_cache_capacity(31, 16), 0);
        assert_eq!(default_cache_capacity(32, 16), 1);
        assert_eq!(default_cache_capacity(0, 16), 0);
        assert_eq!(
            default_cache_capacity(u64::MAX, u64::MAX),
            MAX_DIGEST_ENTRIES
        );
        assert_eq!(default_cache_capacity(10_000_000, 16), MAX_DIGEST_ENTRIES);
    }

    #[test]
    fn shallow_blocks_first_then_most_recent() {
        let entry = |hash, depth, last_used| DigestEntry {
            hash,
            depth,
            last_used,
        };
        let mut entries = vec![
            entry(1, 0, 5),
            entry(2, 1, 9),
            entry(3, 0, 7),
            entry(4, 1, 3),
            entry(5, 2, 10),
        ];
        cut_prefix_closed(&mut entries, 3);
        let kept: Vec<u64> = entries.iter().map(|e| e.hash).collect();
        assert_eq!(kept, [3, 1, 2]);
        let mut small = vec![entry(9, 4, 0)];
        cut_prefix_closed(&mut small, 1);
        assert_eq!(small, [entry(9, 4, 0)], "within capacity: untouched");
        cut_prefix_closed(&mut small, 0);
        assert!(small.is_empty());
    }

    /// A forest of prompts: each block names its parent (`None` for a
    /// prompt's first block), as a prefix tree of cached blocks does.
    fn forest() -> impl Strategy<Value = (Vec<(Option<usize>, u64)>, usize)> {
        (1usize..120, 0usize..140).prop_flat_map(|(n, capacity)| {
            let nodes = (0..n)
                .map(|i| {
                    let parent = if i == 0 {
                        Just(None).boxed()
                    } else {
                        prop_oneof![Just(None), (0..i).prop_map(Some)].boxed()
                    };
                    (parent, 0u64..50)
                })
                .collect::<Vec<_>>();
            (nodes, Just(capacity))
        })
    }

    proptest! {
        #[test]
        fn the_cut_is_prefix_closed_and_within_capacity((nodes, capacity) in forest()) {
            let mut depth = vec![0u32; nodes.len()];
            for (i, (parent, _)) in nodes.iter().enumerate() {
                depth[i] = parent.map_or(0, |p| depth[p] + 1);
            }
            let parent_of: HashMap<u64, Option<u64>> = nodes
                .iter()
                .enumerate()
                .map(|(i, (parent, _))| (i as u64, parent.map(|p| p as u64)))
                .collect();
            let mut entries: Vec<DigestEntry> = nodes
                .iter()
                .enumerate()
                .map(|(i, (_, last_used))| DigestEntry {
                    hash: i as u64,
                    depth: depth[i],
                    last_used: *last_used,
                })
                .collect();
            let before = entries.len();
            cut_prefix_closed(&mut entries, capacity);
            prop_assert_eq!(entries.len(), before.min(capacity));
            let kept: HashSet<u64> = entries.iter().map(|e| e.hash).collect();
            for hash in &kept {
                if let Some(parent) = parent_of[hash] {
                    prop_assert!(kept.contains(&parent), "{} kept without its parent {}", hash, parent);
                }
            }
        }
    }
}
