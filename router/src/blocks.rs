//! Prefix-block hashing: a prompt becomes one chained hash per full 512-token block.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per prefix block (the unit of the shadow prefix cache).
///
/// Only full blocks are hashed: a trailing partial block can never be a cache
/// hit on its own, exactly as in vLLM's prefix cache.
pub const BLOCK_TOKENS: usize = 512;

/// Seed of the first block's hash. Any constant works; a non-zero one keeps the
/// first block's hash from being the plain unseeded xxh3 of its bytes.
const CHAIN_SEED: u64 = 0x6573_2d72_6f75_7465; // "es-route"

/// The chained hashes of the full [`BLOCK_TOKENS`]-token blocks of `tokens`.
///
/// Block `i`'s hash is xxh3 of its token bytes seeded with block `i - 1`'s
/// hash, so equal hashes at position `i` mean (up to 64-bit collisions) equal
/// prompts up to the end of block `i`: a hit on a block is a hit on the whole
/// prefix before it. xxh3 is used because hashing is most of the decision
/// latency on long prompts (200k tokens = 800 KB per decision).
///
/// Hashes are of the tokens' native-endian bytes; the workspace only builds on
/// little-endian hosts, so they are stable across hosts for one crate version.
pub fn block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / BLOCK_TOKENS);
    let mut previous = CHAIN_SEED;
    for block in tokens.chunks_exact(BLOCK_TOKENS) {
        previous = xxh3_64_with_seed(bytemuck::cast_slice(block), previous);
        hashes.push(previous);
    }
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_blocks_are_hashed() {
        assert!(block_hashes(&[7; BLOCK_TOKENS - 1]).is_empty());
        assert_eq!(block_hashes(&[7; BLOCK_TOKENS]).len(), 1);
        assert_eq!(block_hashes(&[7; 3 * BLOCK_TOKENS + 100]).len(), 3);
    }

    #[test]
    fn hashes_chain_so_equal_blocks_after_different_prefixes_differ() {
        let mut a = vec![1u32; 2 * BLOCK_TOKENS];
        let mut b = a.clone();
        b[0] = 2; // differ in block 0 only
        let (ha, hb) = (block_hashes(&a), block_hashes(&b));
        assert_ne!(ha[0], hb[0]);
        assert_ne!(ha[1], hb[1], "block 1 is identical, but its prefix is not");

        // A change in block 1 leaves block 0's hash alone.
        a[BLOCK_TOKENS] = 9;
        assert_eq!(block_hashes(&a)[0], ha[0]);
        assert_ne!(block_hashes(&a)[1], ha[1]);
    }

    #[test]
    fn a_longer_prompt_extends_the_hashes_of_its_prefix() {
        let tokens: Vec<u32> = (0..5 * BLOCK_TOKENS as u32).collect();
        let short = block_hashes(&tokens[..2 * BLOCK_TOKENS + 1]);
        let long = block_hashes(&tokens);
        assert_eq!(&long[..2], &short[..]);
    }
}
