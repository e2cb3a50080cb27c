//! The publisher's side of cache residency (docs/FORMAT.md, "Cache
//! residency"): what a digest must satisfy, whether it changed since the
//! last one, and the words later snapshots carry (`stamp.rs` writes them).
//! The backends write the digest itself (`shm_backend.rs`: a file in
//! `<dir>.cache`; `redis_backend.rs`: the `<prefix>cache:<id>` key).

use engine_state_shm_format::MAX_DIGEST_ENTRIES;

use crate::stamp::CacheWords;

/// The last digest published and the words it gave the snapshots.
#[derive(Debug, Default)]
pub(crate) struct CacheState {
    /// The last digest's blocks, ascending, no duplicates.
    last: Vec<u64>,
    /// The caller's blocks of the call in progress, sorted and deduplicated
    /// (kept for its allocation: a capture sorts into it every period).
    next: Vec<u64>,
    /// What later snapshots say of the last digest.
    pub(crate) words: CacheWords,
    /// The engine's KV block size in tokens, for the digest's header (0:
    /// not given).
    pub(crate) kv_block_size: u32,
    /// The one the last digest was written with.
    last_kv_block_size: u32,
}

/// A digest to write: its sorted blocks and version.
#[derive(Debug)]
pub(crate) struct NextDigest<'a> {
    /// Ascending, no duplicates.
    pub(crate) blocks: &'a [u64],
    /// The version it is published as (the last one + 1).
    pub(crate) version: u64,
    /// Router blocks the engine held (≥ `blocks.len()`).
    pub(crate) held: u64,
    /// Entries the digest's file holds.
    pub(crate) capacity: usize,
    /// The engine's KV block size in tokens (0: not given).
    pub(crate) kv_block_size: u32,
}

impl CacheState {
    /// Checks a digest of `blocks` (any order; duplicates count once) and
    /// sorts it; `Ok(None)` when it lists exactly the last digest's blocks
    /// and `current` (the backend still holds a digest of this capacity for
    /// the engine's current generation) says no rewrite is needed. The error
    /// says what is wrong and what would be right.
    pub(crate) fn prepare(
        &mut self,
        blocks: &[u64],
        held: u64,
        capacity: usize,
        current: bool,
    ) -> Result<Option<NextDigest<'_>>, String> {
        if capacity > MAX_DIGEST_ENTRIES {
            return Err(format!(
                "capacity {capacity} is above the {MAX_DIGEST_ENTRIES} entries a digest may hold; \
                 pass at most that (the default is gpu_blocks_total x kv_block_size / 512, \
                 docs/FORMAT.md, \"Cache residency\")"
            ));
        }
        self.next.clear();
        self.next.extend_from_slice(blocks);
        self.next.sort_unstable();
        self.next.dedup();
        let count = self.next.len();
        if count > capacity {
            return Err(format!(
                "{count} distinct blocks do not fit in a digest of capacity {capacity}; cut the \
                 list to the capacity first, keeping it prefix-closed (shm-format's \
                 cut_prefix_closed), and pass how many there were as held"
            ));
        }
        if held < count as u64 {
            return Err(format!(
                "held ({held}) is below the {count} distinct blocks listed; pass the number of \
                 router blocks the engine held at the capture (at least the blocks listed)"
            ));
        }
        if current
            && self.words.version != 0
            && self.next == self.last
            && self.kv_block_size == self.last_kv_block_size
        {
            return Ok(None);
        }
        Ok(Some(NextDigest {
            blocks: &self.next,
            version: self.words.version + 1,
            held,
            capacity,
            kv_block_size: self.kv_block_size,
        }))
    }

    /// The digest [`CacheState::prepare`] returned was written: later
    /// snapshots name it.
    pub(crate) fn published(&mut self) {
        std::mem::swap(&mut self.last, &mut self.next);
        self.last_kv_block_size = self.kv_block_size;
        self.words = CacheWords {
            blocks: self.last.len() as u64,
            version: self.words.version + 1,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_changed_set_is_written_and_its_version_moves() {
        let mut state = CacheState::default();
        let first = state.prepare(&[9, 3, 3, 5], 4, 8, false).unwrap().unwrap();
        assert_eq!((first.blocks, first.version), (&[3, 5, 9][..], 1));
        state.published();
        assert_eq!(
            state.words,
            CacheWords {
                blocks: 3,
                version: 1
            }
        );
        assert!(state.prepare(&[5, 9, 3], 3, 8, true).unwrap().is_none());
        // The same set, but the backend must rewrite it (a new file).
        let again = state.prepare(&[5, 9, 3], 3, 8, false).unwrap().unwrap();
        assert_eq!(again.version, 2);
        state.published();
        let next = state.prepare(&[3, 5], 2, 8, true).unwrap().unwrap();
        assert_eq!((next.blocks, next.version), (&[3, 5][..], 3));
        state.published();
        assert_eq!(
            state.words,
            CacheWords {
                blocks: 2,
                version: 3
            }
        );
        // An empty digest is a digest too (the engine holds nothing).
        assert!(state.prepare(&[], 0, 8, true).unwrap().is_some());
    }

    #[test]
    fn bad_digests_are_refused_with_what_to_do() {
        let mut state = CacheState::default();
        let err = |r: Result<Option<NextDigest<'_>>, String>| r.unwrap_err();
        assert!(err(state.prepare(&[1, 2, 3], 3, 2, false)).contains("do not fit"));
        assert!(err(state.prepare(&[1], 1, MAX_DIGEST_ENTRIES + 1, false)).contains("capacity"));
        assert!(err(state.prepare(&[1, 2], 1, 4, false)).contains("held (1)"));
        // Duplicates count once.
        assert!(state.prepare(&[1, 1, 1], 1, 1, false).unwrap().is_some());
        assert_eq!(state.words, CacheWords::default(), "nothing published");
    }
}
