//! A bounded least-recently-used map keyed by 64-bit hashes.
//!
//! Used for each instance's prefix-block cache and for session bindings. A
//! slab of nodes with an intrusive doubly linked list keeps every operation
//! O(1) and allocation-free once the slab is full.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: u32 = u32::MAX;

/// Hasher for keys that are already 64-bit hashes — but maybe caller-supplied
/// and poorly mixed (sequential ids in tests, foreign block hashes), so one
/// folded multiply spreads them over the table instead of trusting them.
#[derive(Default)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        let product = u128::from(value ^ self.0) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

type MixBuild = BuildHasherDefault<MixHasher>;

#[derive(Debug, Clone)]
struct Node<V> {
    key: u64,
    value: V,
    /// Towards the most recently used end.
    newer: u32,
    /// Towards the least recently used end.
    older: u32,
}

/// At most `capacity` entries; inserting into a full map evicts the least
/// recently used one.
#[derive(Clone)]
pub(crate) struct Lru<V> {
    map: HashMap<u64, u32, MixBuild>,
    nodes: Vec<Node<V>>,
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
    capacity: usize,
}

impl<V> std::fmt::Debug for Lru<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lru")
            .field("len", &self.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<V> Lru<V> {
    /// `capacity` must be at least 1 and below `u32::MAX` (settings validate it).
    pub(crate) fn new(capacity: usize) -> Lru<V> {
        assert!(
            capacity >= 1 && capacity < NIL as usize,
            "LRU capacity out of range"
        );
        Lru {
            map: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            capacity,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Present, without counting as a use.
    #[inline]
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// The value, without counting as a use.
    pub(crate) fn peek(&self, key: u64) -> Option<&V> {
        self.map
            .get(&key)
            .map(|&slot| &self.nodes[slot as usize].value)
    }

    /// Insert or overwrite, making `key` the most recently used entry.
    pub(crate) fn insert(&mut self, key: u64, value: V) {
        if let Some(&slot) = self.map.get(&key) {
            self.nodes[slot as usize].value = value;
            self.unlink(slot);
            self.push_newest(slot);
            return;
        }
        let slot = if self.map.len() >= self.capacity {
            // Reuse the evicted node's slot: the slab never outgrows capacity.
            let slot = self.oldest;
            self.unlink(slot);
            let node = &mut self.nodes[slot as usize];
            self.map.remove(&node.key);
            node.key = key;
            node.value = value;
            slot
        } else if let Some(slot) = self.free.pop() {
            let node = &mut self.nodes[slot as usize];
            node.key = key;
            node.value = value;
            slot
        } else {
            self.nodes.push(Node {
                key,
                value,
                newer: NIL,
                older: NIL,
            });
            (self.nodes.len() - 1) as u32
        };
        self.map.insert(key, slot);
        self.push_newest(slot);
    }

    /// Remove `key`; its slot is reused by a later insert.
    pub(crate) fn remove(&mut self, key: u64) -> bool {
        let Some(slot) = self.map.remove(&key) else {
            return false;
        };
        self.unlink(slot);
        self.free.push(slot);
        true
    }

    fn unlink(&mut self, slot: u32) {
        let Node { newer, older, .. } = self.nodes[slot as usize];
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
    }

    /// Move the segment from `first` (its newest entry) to `last` to the
    /// newest end, keeping its order.
    fn move_to_front(&mut self, first: u32, last: u32) {
        let newer = self.nodes[first as usize].newer;
        if newer == NIL {
            return; // already there
        }
        let older = self.nodes[last as usize].older;
        self.nodes[newer as usize].older = older;
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
        self.nodes[last as usize].older = self.newest;
        self.nodes[self.newest as usize].newer = last;
        self.nodes[first as usize].newer = NIL;
        self.newest = first;
    }

    fn push_newest(&mut self, slot: u32) {
        let node = &mut self.nodes[slot as usize];
        node.newer = NIL;
        node.older = self.newest;
        match self.newest {
            NIL => self.oldest = slot,
            n => self.nodes[n as usize].newer = slot,
        }
        self.newest = slot;
    }
}

impl Lru<()> {
    /// Insert every key, the last first, so that `keys[0]` ends up newest:
    /// exactly `for &key in keys.iter().rev() { self.insert(key, ()) }`.
    ///
    /// Faster when a leading run of `keys` is already the newest entries in
    /// that order (the prompt routed here last, which a later turn of the
    /// same conversation extends): those are moved as one segment instead of
    /// one hash lookup and relink each, and when the run is all of `keys`
    /// nothing changes at all.
    pub(crate) fn insert_run(&mut self, keys: &[u64]) {
        // The newest `run` entries are keys[..run], in order.
        let mut run = 0;
        let mut slot = self.newest;
        while run < keys.len() && slot != NIL && self.nodes[slot as usize].key == keys[run] {
            slot = self.nodes[slot as usize].older;
            run += 1;
        }
        if run == keys.len() {
            return;
        }
        if run == 0 {
            for &key in keys.iter().rev() {
                self.insert(key, ());
            }
            return;
        }
        let first = self.newest;
        for &key in keys[run..].iter().rev() {
            self.insert(key, ());
        }
        // Those inserts moved the run back but, unless one of them was a
        // duplicate of a run key or evicted one, left it whole and in order;
        // moving it to the front is then what inserting its keys last to
        // first would do. Checked rather than assumed: keys are the caller's.
        match self.segment_end(first, &keys[..run]) {
            Some(last) => self.move_to_front(first, last),
            None => {
                for &key in keys[..run].iter().rev() {
                    self.insert(key, ());
                }
            }
        }
    }

    /// The last slot of the segment that starts at `first` and holds `keys`
    /// in order, newest first; `None` if there is no such segment.
    fn segment_end(&self, first: u32, keys: &[u64]) -> Option<u32> {
        let mut slot = first;
        let mut last = NIL;
        for &key in keys {
            // Every slot reached is a live entry (nothing was freed since
            // `first` was the newest), so its key is in the map.
            if slot == NIL || self.nodes[slot as usize].key != key {
                return None;
            }
            last = slot;
            slot = self.nodes[slot as usize].older;
        }
        (last != NIL).then_some(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut lru = Lru::new(3);
        for key in 1..=3 {
            lru.insert(key, ());
        }
        lru.insert(1, ()); // 1 becomes newest; 2 is now oldest
        lru.insert(4, ());
        assert!(!lru.contains(2));
        assert!(lru.contains(1) && lru.contains(3) && lru.contains(4));
        assert_eq!(lru.len(), 3);
    }

    #[test]
    fn contains_and_peek_do_not_refresh() {
        let mut lru = Lru::new(2);
        lru.insert(1, "a");
        lru.insert(2, "b");
        assert!(lru.contains(1));
        assert_eq!(lru.peek(1), Some(&"a"));
        lru.insert(3, "c");
        assert!(
            !lru.contains(1),
            "1 was only looked at, so it stayed oldest"
        );
    }

    #[test]
    fn remove_frees_a_slot_for_reuse() {
        let mut lru = Lru::new(2);
        lru.insert(10, 1);
        lru.insert(20, 2);
        assert!(lru.remove(10));
        assert!(!lru.remove(10));
        lru.insert(30, 3);
        assert!(lru.contains(20) && lru.contains(30));
        assert_eq!(lru.nodes.len(), 2);
        lru.insert(40, 4); // full: evicts 20
        assert!(!lru.contains(20));
        assert_eq!(lru.peek(40), Some(&4));
    }

    /// Keys from newest to oldest, checked against the links both ways.
    fn order<V>(lru: &Lru<V>) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut slot = lru.newest;
        let mut newer = NIL;
        while slot != NIL {
            let node = &lru.nodes[slot as usize];
            assert_eq!(node.newer, newer, "broken newer link");
            assert_eq!(lru.map.get(&node.key), Some(&slot));
            keys.push(node.key);
            newer = slot;
            slot = node.older;
        }
        assert_eq!(lru.oldest, newer);
        assert_eq!(keys.len(), lru.len());
        keys
    }

    /// `insert_run` against one `insert` per key, last first: random runs
    /// over a small key space (duplicates, evictions, a cache smaller than
    /// the run), repeats and extensions of the last run, and removals.
    #[test]
    fn insert_run_is_inserting_each_key_last_first() {
        let mut next = crate::xorshift(0x9E37_79B9_7F4A_7C15_u64);
        for capacity in [1, 2, 3, 5, 8, 30] {
            let (mut fast, mut plain) = (Lru::new(capacity), Lru::new(capacity));
            let mut last: Vec<u64> = Vec::new();
            for _ in 0..5000 {
                let keys: Vec<u64> = match next(4) {
                    0 => last.clone(),
                    1 => {
                        let mut keys = last.clone();
                        keys.truncate(next(keys.len() as u64 + 1) as usize);
                        keys.extend((0..next(4)).map(|_| next(40)));
                        keys
                    }
                    _ => (0..next(12)).map(|_| next(40)).collect(),
                };
                if next(10) == 0 {
                    let key = next(40);
                    assert_eq!(fast.remove(key), plain.remove(key));
                }
                fast.insert_run(&keys);
                for &key in keys.iter().rev() {
                    plain.insert(key, ());
                }
                assert_eq!(order(&fast), order(&plain), "after {keys:?}");
                last = keys;
            }
        }
    }

    #[test]
    fn capacity_one_keeps_the_newest() {
        let mut lru = Lru::new(1);
        lru.insert(1, ());
        lru.insert(2, ());
        assert!(!lru.contains(1) && lru.contains(2));
    }
}
