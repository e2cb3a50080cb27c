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

    #[test]
    fn capacity_one_keeps_the_newest() {
        let mut lru = Lru::new(1);
        lru.insert(1, ());
        lru.insert(2, ());
        assert!(!lru.contains(1) && lru.contains(2));
    }
}
