//! Prefix-block hashing: a prompt becomes one chained hash per full 512-token block.
//!
//! The one owner of the router block hash: routers hash prompts with it
//! (`engine-state-router`), the vLLM hook hashes the blocks an engine holds
//! with it, and the cache-residency digest's keys are its values
//! (docs/FORMAT.md, "Cache residency").

/// Tokens per prefix block (the unit of the shadow prefix cache).
///
/// Only full blocks are hashed: a trailing partial block can never be a cache
/// hit on its own, exactly as in vLLM's prefix cache.
pub const BLOCK_TOKENS: usize = 512;

/// Seed of the first block's hash ("es-route"): the parent of block 0.
pub const CHAIN_SEED: u64 = 0x6573_2d72_6f75_7465;

/// Odd 64-bit constants (wyhash's and the golden ratio's): one per lane.
const KEYS: [u64; 8] = [
    0xa076_1d64_78bd_642f,
    0xe703_7ed1_a0b4_28db,
    0x8ebc_6af0_9c88_c6e3,
    0x5899_65cc_7537_4cc3,
    0x1d8e_4e27_c47d_124f,
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
];

/// The 128-bit product of `a` and `b`, folded to 64 bits by xor of its halves.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// Hash of one full block, seeded with its predecessor's hash.
///
/// wyhash's bulk step (`lane = fold_mul(x ^ key, y ^ lane)`, 16 bytes per
/// 64×64→128 multiply) on 8 independent lanes, so the multiplies pipeline.
/// Measured on this project's 2-core Xeon it hashes 200k tokens in ~25 µs
/// where xxh3 (SSE2 build) takes ~40 µs; hashing is most of the decision
/// latency on long prompts. Its one weak input, a token pair equal to the
/// first key, needs a token id above 2.6 billion: no vocabulary is that large.
fn hash_block(block: &[u32], seed: u64) -> u64 {
    let mut lanes = KEYS.map(|key| seed ^ key);
    for stripe in block.chunks_exact(32) {
        for (lane, words) in lanes.iter_mut().zip(stripe.chunks_exact(4)) {
            let x = u64::from(words[0]) | (u64::from(words[1]) << 32);
            let y = u64::from(words[2]) | (u64::from(words[3]) << 32);
            *lane = fold_mul(x ^ KEYS[0], y ^ *lane);
        }
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    let mixed = fold_mul(a ^ KEYS[1], b ^ KEYS[2])
        ^ fold_mul(c ^ KEYS[3], d ^ KEYS[4])
        ^ fold_mul(e ^ KEYS[5], f ^ KEYS[6])
        ^ fold_mul(g ^ KEYS[7], h ^ seed);
    fold_mul(mixed ^ KEYS[0], seed ^ KEYS[5])
}

/// The chained hashes of the full [`BLOCK_TOKENS`]-token blocks of `tokens`.
///
/// Block `i`'s hash is seeded with block `i - 1`'s, so equal hashes at
/// position `i` mean (up to 64-bit collisions) equal prompts up to the end of
/// block `i`: a hit on a block is a hit on the whole prefix before it.
/// The values are part of the format (docs/FORMAT.md, "Cache residency"):
/// the same on every host, run and version, pinned by golden vectors.
pub fn block_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut hashes = Vec::with_capacity(tokens.len() / BLOCK_TOKENS);
    let mut previous = CHAIN_SEED;
    for block in tokens.chunks_exact(BLOCK_TOKENS) {
        previous = hash_block(block, previous);
        hashes.push(previous);
    }
    hashes
}

/// The hash of one full block given its predecessor's hash ([`CHAIN_SEED`]
/// for block 0): `block_hashes` one block at a time, for a caller that hashes
/// each block once as its tokens arrive (the vLLM hook).
///
/// # Panics
/// If `block` is not exactly [`BLOCK_TOKENS`] tokens.
pub fn next_block_hash(parent: u64, block: &[u32]) -> u64 {
    assert_eq!(
        block.len(),
        BLOCK_TOKENS,
        "a router block is {BLOCK_TOKENS} tokens"
    );
    hash_block(block, parent)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn one_block_at_a_time_is_the_chain() {
        let tokens: Vec<u32> = (0..3 * BLOCK_TOKENS as u32)
            .map(|i| i * 31 % 50_000)
            .collect();
        let mut parent = CHAIN_SEED;
        let stepwise: Vec<u64> = tokens
            .chunks_exact(BLOCK_TOKENS)
            .map(|block| {
                parent = next_block_hash(parent, block);
                parent
            })
            .collect();
        assert_eq!(stepwise, block_hashes(&tokens));
    }

    #[test]
    #[should_panic(expected = "a router block is 512 tokens")]
    fn a_partial_block_is_refused() {
        next_block_hash(CHAIN_SEED, &[1; 100]);
    }

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

    #[test]
    fn every_single_token_change_and_swap_changes_the_hash() {
        // One block of realistic ids; every position, every small change.
        let base: Vec<u32> = (0..BLOCK_TOKENS as u32)
            .map(|i| (i * 7919) % 150_000)
            .collect();
        let mut seen = HashSet::new();
        assert!(seen.insert(block_hashes(&base)[0]));
        for position in 0..BLOCK_TOKENS {
            for delta in [1, 2, 1 << 16, 1 << 31] {
                let mut changed = base.clone();
                changed[position] ^= delta;
                assert!(
                    seen.insert(block_hashes(&changed)[0]),
                    "collision at {position} ^ {delta}"
                );
            }
            // Swapping neighbours (within and across lanes and stripes).
            let mut swapped = base.clone();
            swapped.swap(position, (position + 1) % BLOCK_TOKENS);
            assert!(
                seen.insert(block_hashes(&swapped)[0]),
                "swap collision at {position}"
            );
        }
    }

    #[test]
    fn hash_bits_are_balanced() {
        // Over many blocks each output bit is set about half the time.
        let mut ones = [0u32; 64];
        let samples = 4000u32;
        for s in 0..samples {
            let block: Vec<u32> = (0..BLOCK_TOKENS as u32).map(|i| i ^ (s << 9)).collect();
            let hash = block_hashes(&block)[0];
            for (bit, count) in ones.iter_mut().enumerate() {
                *count += ((hash >> bit) & 1) as u32;
            }
        }
        for (bit, count) in ones.iter().enumerate() {
            let frac = f64::from(*count) / f64::from(samples);
            assert!(
                (0.45..0.55).contains(&frac),
                "bit {bit} set {frac:.3} of the time"
            );
        }
    }
}
