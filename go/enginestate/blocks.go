package enginestate

import "math/bits"

// Router block hashes (docs/FORMAT.md, "Keys: router block hashes"): the
// keys of a cache digest. The one owner of the function is the Rust
// shm-format crate (shm-format/src/blocks.rs); this is a copy of it, checked
// against the golden vector cache/block_hashes.json.

const (
	// BlockTokens is the number of tokens of one router block.
	BlockTokens = 512
	// ChainSeed is the parent hash of a prompt's first block ("es-route").
	ChainSeed uint64 = 0x6573_2d72_6f75_7465
)

// blockKeys are odd 64-bit constants (wyhash's and the golden ratio's): one
// per lane.
var blockKeys = [8]uint64{
	0xa076_1d64_78bd_642f,
	0xe703_7ed1_a0b4_28db,
	0x8ebc_6af0_9c88_c6e3,
	0x5899_65cc_7537_4cc3,
	0x1d8e_4e27_c47d_124f,
	0x9e37_79b9_7f4a_7c15,
	0xc2b2_ae3d_27d4_eb4f,
	0x1656_67b1_9e37_79f9,
}

// foldMul is the 128-bit product of a and b folded to 64 bits by xor of its
// halves.
func foldMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hashBlock is the hash of one full block seeded with its predecessor's
// hash: 8 lanes, each taking 4 tokens (two u64 words) per 32-token stripe.
func hashBlock(block []uint32, seed uint64) uint64 {
	var lanes [8]uint64
	for i, key := range blockKeys {
		lanes[i] = seed ^ key
	}
	for s := 0; s+32 <= len(block); s += 32 {
		stripe := block[s : s+32]
		for lane := range lanes {
			w := stripe[4*lane : 4*lane+4]
			x := uint64(w[0]) | uint64(w[1])<<32
			y := uint64(w[2]) | uint64(w[3])<<32
			lanes[lane] = foldMul(x^blockKeys[0], y^lanes[lane])
		}
	}
	mixed := foldMul(lanes[0]^blockKeys[1], lanes[1]^blockKeys[2]) ^
		foldMul(lanes[2]^blockKeys[3], lanes[3]^blockKeys[4]) ^
		foldMul(lanes[4]^blockKeys[5], lanes[5]^blockKeys[6]) ^
		foldMul(lanes[6]^blockKeys[7], lanes[7]^seed)
	return foldMul(mixed^blockKeys[0], seed^blockKeys[5])
}

// BlockHashes is the chained hash of each full BlockTokens-token block of a
// prompt's token ids: block i's hash covers its tokens and block i-1's hash
// (ChainSeed for the first), so equal hashes at position i mean equal
// prompts up to the end of block i. A trailing partial block has no hash.
func BlockHashes(tokens []uint32) []uint64 {
	hashes := make([]uint64, 0, len(tokens)/BlockTokens)
	previous := ChainSeed
	for start := 0; start+BlockTokens <= len(tokens); start += BlockTokens {
		previous = hashBlock(tokens[start:start+BlockTokens], previous)
		hashes = append(hashes, previous)
	}
	return hashes
}
