//! Cache residency in memory: the set of 512-token router blocks one engine
//! holds in full in its KV cache, as of one capture (docs/FORMAT.md, "Cache
//! residency").
//!
//! Keys are [`crate::blocks`] hashes. The set is *prefix-closed*: a block is
//! listed only with every block before it in its prompt, so a prompt's cache
//! hit is the leading run of its blocks found here, which
//! [`CacheDigest::leading_blocks`] finds by bisection.

/// One engine's cache digest: router block hashes, ascending, no duplicates,
/// and what its writer said of the capture (`held`, `kv_block_size`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CacheDigest {
    version: u64,
    captured_mono_ns: u64,
    blocks: Vec<u64>,
    /// Router blocks held at the capture, at least `blocks.len()`.
    held: u64,
    kv_block_size: u32,
}

impl CacheDigest {
    /// A digest of `blocks` (any order, duplicates dropped), published as
    /// `version` (a writer's counter, 1 for its first digest) and captured at
    /// `captured_mono_ns` on the writer's host.
    /// It says the engine held exactly these blocks ([`CacheDigest::held`]
    /// is the count) and does not know the KV block size (0).
    pub fn new(version: u64, captured_mono_ns: u64, blocks: Vec<u64>) -> CacheDigest {
        CacheDigest::with_capture(version, captured_mono_ns, blocks, 0, 0)
    }

    /// [`CacheDigest::new`] of a capture that held `held` router blocks
    /// (more than `blocks` when the digest was cut to its capacity; a value
    /// below the count is the count) of an engine whose KV blocks are
    /// `kv_block_size` tokens (0: unknown).
    pub fn with_capture(
        version: u64,
        captured_mono_ns: u64,
        mut blocks: Vec<u64>,
        held: u64,
        kv_block_size: u32,
    ) -> CacheDigest {
        blocks.sort_unstable();
        blocks.dedup();
        CacheDigest::from_ascending(version, captured_mono_ns, blocks, held, kv_block_size)
    }

    /// A digest of `blocks` already strictly ascending (checked by the
    /// caller: a decoded or read digest), without sorting again.
    pub(crate) fn from_ascending(
        version: u64,
        captured_mono_ns: u64,
        blocks: Vec<u64>,
        held: u64,
        kv_block_size: u32,
    ) -> CacheDigest {
        debug_assert!(blocks.windows(2).all(|pair| pair[0] < pair[1]));
        CacheDigest {
            version,
            captured_mono_ns,
            held: held.max(blocks.len() as u64),
            blocks,
            kv_block_size,
        }
    }

    /// The blocks, their allocation kept for the next digest read into it
    /// (`DigestFile::read_into`).
    pub(crate) fn into_blocks(self) -> Vec<u64> {
        self.blocks
    }

    /// Router blocks the engine held at the capture (the `held` of its file
    /// or Redis value): [`CacheDigest::len`], or more when the digest was
    /// cut to its capacity (docs/FORMAT.md, "Cache residency").
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The engine's KV block size in tokens, as its writer said (display;
    /// 0: unknown).
    pub fn kv_block_size(&self) -> u32 {
        self.kv_block_size
    }

    /// The writer's counter: it changes exactly when the set may have.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// `CLOCK_MONOTONIC` of the writer's host at the capture.
    pub fn captured_mono_ns(&self) -> u64 {
        self.captured_mono_ns
    }

    /// The block hashes, ascending.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }

    /// Number of blocks listed (`cache_blocks`).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// No block listed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether `hash` is listed.
    pub fn contains(&self, hash: u64) -> bool {
        self.blocks.binary_search(&hash).is_ok()
    }

    /// How many leading blocks of a prompt (its chained block hashes, in
    /// order) the engine holds.
    ///
    /// Bisects on the prompt: in a prefix-closed digest "block `i` is
    /// listed" is true up to the hit's end and false after it, so
    /// `log2(prompt)` lookups suffice. The answer `n` always has blocks
    /// `n - 1` listed and `n` not (or the prompt's end), so a digest that is
    /// not prefix-closed (a writer's bug) still yields a run boundary, never
    /// a panic.
    pub fn leading_blocks(&self, prompt: &[u64]) -> usize {
        // Blocks before `start` are listed; block `end` (if any) is not.
        let (mut start, mut end) = (0, prompt.len());
        while start < end {
            let middle = start + (end - start) / 2;
            if self.contains(prompt[middle]) {
                start = middle + 1;
            } else {
                end = middle;
            }
        }
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::block_hashes;

    #[test]
    fn blocks_are_sorted_and_unique() {
        let digest = CacheDigest::new(3, 7, vec![9, 1, 5, 1]);
        assert_eq!(digest.blocks(), &[1, 5, 9]);
        assert_eq!(
            (digest.version(), digest.captured_mono_ns(), digest.len()),
            (3, 7, 3)
        );
        assert!(digest.contains(5) && !digest.contains(4));
        assert!(CacheDigest::default().is_empty());
    }

    #[test]
    fn the_hit_is_the_leading_run_of_a_prompt() {
        let tokens: Vec<u32> = (0..6 * 512).map(|i| i % 1000).collect();
        let prompt = block_hashes(&tokens);
        for held in 0..=prompt.len() {
            let digest = CacheDigest::new(1, 0, prompt[..held].to_vec());
            assert_eq!(digest.leading_blocks(&prompt), held);
            assert_eq!(digest.leading_blocks(&prompt[..held.min(2)]), held.min(2));
        }
        assert_eq!(CacheDigest::default().leading_blocks(&prompt), 0);
        assert_eq!(
            CacheDigest::new(1, 0, prompt.clone()).leading_blocks(&[]),
            0
        );
    }

    #[test]
    fn a_digest_that_is_not_prefix_closed_still_gives_a_run_boundary() {
        let prompt = [10, 20, 30, 40, 50];
        let digest = CacheDigest::new(1, 0, vec![10, 30, 40]);
        let n = digest.leading_blocks(&prompt);
        assert!(n <= prompt.len());
        assert!(n == 0 || digest.contains(prompt[n - 1]));
        assert!(n == prompt.len() || !digest.contains(prompt[n]));
    }
}
