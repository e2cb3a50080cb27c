//! The KV block pool of one engine, with vLLM's prefix cache: 16-token blocks,
//! reference counts, chained block hashes, and a free queue from whose front
//! allocation takes blocks, evicting what they cached
//! (`vllm/v1/core/block_pool.py`, notes/vllm-0.33-scheduling.md).
//!
//! As in vLLM 0.33's `BlockPool.free_blocks`, a freed block that caches a
//! hash joins the queue's back (cached blocks are evicted least recently
//! freed first) and a freed block without one its front (reused first), and
//! several blocks may cache the same hash (two requests that computed the
//! same prefix): a lookup finds the first one cached that is still there.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::residency::Residency;

/// A map keyed by `u64` with a cheap mixing hasher: the simulator's keys
/// (block hashes, request ids) need no DoS resistance, and SipHash was
/// half of a run's time.
pub(crate) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// Hashes one `u64` with splitmix64's finaliser.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }
}

/// No block (end of the free queue).
const NIL: u32 = u32::MAX;

/// KV blocks, their reference counts and the prefix cache.
#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    ref_count: Vec<u32>,
    /// The chained hash a block is cached under, if any.
    hash: Vec<Option<u64>>,
    /// The free queue, a doubly linked list over block ids: O(1) removal when
    /// a cache hit revives a free block from its middle.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    free: usize,
    /// Hash → the first block cached under it.
    cached: U64Map<u32>,
    /// Hash → the later blocks cached under it, oldest first (rare: vLLM
    /// does not de-duplicate blocks, `BlockHashToBlockMap`).
    duplicates: U64Map<Vec<u32>>,
    /// Told of every hash that becomes cached or stops being cached, when
    /// the engine publishes its cache residency.
    pub(crate) residency: Option<Residency>,
}

impl BlockPool {
    /// `blocks` usable blocks, all free, none cached.
    pub(crate) fn new(blocks: usize) -> BlockPool {
        assert!(
            blocks > 0 && blocks < NIL as usize,
            "block count out of range"
        );
        let n = blocks as u32;
        BlockPool {
            ref_count: vec![0; blocks],
            hash: vec![None; blocks],
            prev: (0..n).map(|b| if b == 0 { NIL } else { b - 1 }).collect(),
            next: (0..n)
                .map(|b| if b + 1 == n { NIL } else { b + 1 })
                .collect(),
            head: 0,
            tail: n - 1,
            free: blocks,
            cached: U64Map::default(),
            duplicates: U64Map::default(),
            residency: None,
        }
    }

    /// Usable blocks.
    pub(crate) fn total(&self) -> usize {
        self.ref_count.len()
    }

    /// Free blocks, evictable cached ones included (`get_num_free_blocks()`).
    pub(crate) fn num_free(&self) -> usize {
        self.free
    }

    /// Whether some block caches `hash`.
    pub(crate) fn is_cached(&self, hash: u64) -> bool {
        self.cached.contains_key(&hash)
    }

    /// The cached blocks of the longest run of leading `hashes` present.
    pub(crate) fn longest_hit(&self, hashes: impl IntoIterator<Item = u64>) -> Vec<u32> {
        hashes
            .into_iter()
            .map_while(|hash| self.cached.get(&hash).copied())
            .collect()
    }

    /// How many of `blocks` sit in the free queue (a hit on them takes them
    /// out of it, so they count against the free blocks an admission needs).
    pub(crate) fn evictable(&self, blocks: &[u32]) -> usize {
        blocks
            .iter()
            .filter(|&&b| self.ref_count[b as usize] == 0)
            .count()
    }

    /// Take a reference on cached blocks (a prefix hit).
    pub(crate) fn touch(&mut self, blocks: &[u32]) {
        for &block in blocks {
            if self.ref_count[block as usize] == 0 {
                self.unlink(block);
            }
            self.ref_count[block as usize] += 1;
        }
    }

    /// `n` blocks from the front of the free queue (evicting what they
    /// cached), or `None` if fewer are free.
    pub(crate) fn allocate(&mut self, n: usize, into: &mut Vec<u32>) -> bool {
        if n > self.free {
            return false;
        }
        for _ in 0..n {
            let block = self.head;
            self.unlink(block);
            self.evict(block);
            self.ref_count[block as usize] = 1;
            into.push(block);
        }
        true
    }

    /// Drop a request's references in vLLM's order, its last block first:
    /// freed cached blocks join the back of the free queue in that order (a
    /// prompt's tail is evicted before its head), freed uncached blocks its
    /// front in that order (`free_blocks`: `prepend_n` then `append_n`).
    pub(crate) fn release(&mut self, blocks: &[u32]) {
        // First to last, so that pushing each uncached one to the front
        // leaves them in last-to-first order there.
        for &block in blocks {
            let count = &mut self.ref_count[block as usize];
            debug_assert!(*count > 0, "block {block} released twice");
            *count -= 1;
            if *count == 0 && self.hash[block as usize].is_none() {
                self.push_front(block);
            }
        }
        for &block in blocks.iter().rev() {
            if self.ref_count[block as usize] == 0 && self.hash[block as usize].is_some() {
                self.push_back(block);
            }
        }
    }

    /// Cache a full block under its chained hash (another block may hold it
    /// already: then a lookup keeps finding that one while it is cached).
    pub(crate) fn cache(&mut self, block: u32, hash: u64) {
        if self.hash[block as usize].is_some() {
            return;
        }
        self.hash[block as usize] = Some(hash);
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(block);
                if let Some(residency) = &mut self.residency {
                    residency.cached(hash);
                }
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.duplicates.entry(hash).or_default().push(block);
            }
        }
    }

    /// Forget what `block` caches (it is being reused).
    fn evict(&mut self, block: u32) {
        let Some(hash) = self.hash[block as usize].take() else {
            return;
        };
        let later = self.duplicates.get_mut(&hash);
        if self.cached.get(&hash) == Some(&block) {
            match later {
                Some(later) => {
                    self.cached.insert(hash, later.remove(0));
                    if later.is_empty() {
                        self.duplicates.remove(&hash);
                    }
                }
                None => {
                    self.cached.remove(&hash);
                    if let Some(residency) = &mut self.residency {
                        residency.evicted(hash);
                    }
                }
            }
        } else {
            let later = later.expect("a cached block is first or later under its hash");
            later.retain(|&b| b != block);
            if later.is_empty() {
                self.duplicates.remove(&hash);
            }
        }
    }

    fn unlink(&mut self, block: u32) {
        let (p, n) = (self.prev[block as usize], self.next[block as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.free -= 1;
    }

    fn push_front(&mut self, block: u32) {
        self.next[block as usize] = self.head;
        self.prev[block as usize] = NIL;
        if self.head == NIL {
            self.tail = block;
        } else {
            self.prev[self.head as usize] = block;
        }
        self.head = block;
        self.free += 1;
    }

    fn push_back(&mut self, block: u32) {
        self.prev[block as usize] = self.tail;
        self.next[block as usize] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_cached_blocks_are_hits_until_evicted_least_recently_freed_first() {
        let mut pool = BlockPool::new(4);
        let mut a = Vec::new();
        assert!(pool.allocate(2, &mut a));
        pool.cache(a[0], 10);
        pool.cache(a[1], 11);
        pool.release(&a);
        assert_eq!(pool.num_free(), 4);
        assert_eq!(pool.longest_hit([10, 11, 12]), a);
        // Blocks 2 and 3 were never used: they are at the front.
        let mut b = Vec::new();
        assert!(pool.allocate(2, &mut b));
        assert_eq!(pool.longest_hit([10, 11]).len(), 2);
        // Next comes the tail block (freed first): hash 11 goes, 10 stays.
        let mut c = Vec::new();
        assert!(pool.allocate(1, &mut c));
        assert_eq!(c, vec![a[1]]);
        assert_eq!(pool.longest_hit([10, 11]), vec![a[0]]);
        assert!(!pool.allocate(2, &mut c), "one block left");
    }

    #[test]
    fn a_hit_revives_a_free_block_and_shares_it() {
        let mut pool = BlockPool::new(3);
        let mut a = Vec::new();
        pool.allocate(1, &mut a);
        pool.cache(a[0], 7);
        pool.release(&a);
        let hit = pool.longest_hit([7]);
        assert_eq!(pool.evictable(&hit), 1);
        pool.touch(&hit);
        pool.touch(&hit);
        assert_eq!(pool.num_free(), 2);
        pool.release(&hit);
        assert_eq!(pool.num_free(), 2, "still referenced once");
        pool.release(&hit);
        assert_eq!(pool.num_free(), 3);
    }

    #[test]
    fn freed_uncached_blocks_are_reused_first_and_cached_ones_last() {
        // vLLM 0.33 free_blocks: uncached to the front, cached to the back,
        // each in the request's last-to-first order.
        let mut pool = BlockPool::new(6);
        let mut a = Vec::new();
        assert!(pool.allocate(4, &mut a)); // blocks 0..4; 4 and 5 stay free
        pool.cache(a[0], 10);
        pool.cache(a[1], 11);
        pool.release(&a); // queue: a3 a2 | 4 5 | a1 a0
        let mut b = Vec::new();
        assert!(pool.allocate(4, &mut b));
        assert_eq!(
            b,
            vec![a[3], a[2], 4, 5],
            "uncached first, the tail block first"
        );
        assert_eq!(
            pool.longest_hit([10, 11]),
            vec![a[0], a[1]],
            "cached ones kept"
        );
        let mut c = Vec::new();
        assert!(pool.allocate(1, &mut c));
        assert_eq!(c, vec![a[1]], "then the cached tail block");
        assert_eq!(pool.longest_hit([10, 11]), vec![a[0]]);
    }

    #[test]
    fn a_hash_cached_twice_stays_a_hit_until_both_blocks_are_evicted() {
        let mut pool = BlockPool::new(3);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert!(pool.allocate(1, &mut a));
        assert!(pool.allocate(1, &mut b));
        pool.cache(a[0], 7);
        pool.cache(b[0], 7);
        assert_eq!(pool.longest_hit([7]), a, "the first cached is found");
        pool.release(&a);
        pool.release(&b); // queue: 2 | a b
        let mut c = Vec::new();
        assert!(pool.allocate(2, &mut c));
        assert_eq!(c, vec![2, a[0]]);
        assert_eq!(
            pool.longest_hit([7]),
            b,
            "the duplicate serves the hash now"
        );
        assert!(pool.allocate(1, &mut c));
        assert!(pool.longest_hit([7]).is_empty());
    }
}
