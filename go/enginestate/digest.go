package enginestate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Cache residency (docs/FORMAT.md, "Cache residency"): an engine's cache
// digest, the set of 512-token router blocks (BlockHashes) its KV cache
// holds in full, in its own file <dir>.cache/<id> (DigestFile, Linux) and
// Redis value <prefix>cache:<id> (DecodeDigestValue). The layout is the Rust
// shm-format crate's (shm-format/src/digest_layout.rs); the golden vectors
// format/vectors/cache/ check this copy of it.

const (
	// DigestMagic is the first word of every digest file and value: "ESDIGEST".
	DigestMagic uint64 = 0x5453454749445345
	// DigestLayoutVersion is the digest layout version this package reads
	// (the digest's own, independent of LayoutVersion).
	DigestLayoutVersion uint32 = 1
	// DigestHeaderSize is the bytes before the entries: the header (cache
	// line 0) and the seqlock and control words (cache line 1).
	DigestHeaderSize = 128
	// DigestEntrySize is the bytes of one entry (a router block hash).
	DigestEntrySize = 8
	// MaxDigestEntries is the most entries a digest may have; a file or
	// value claiming more is refused, so every read is bounded.
	MaxDigestEntries = 131_072
	// MaxDigestSize is the largest digest file or value.
	MaxDigestSize = DigestHeaderSize + DigestEntrySize*MaxDigestEntries
	// CacheFetchEnd is the last byte a reader fetches of a digest's Redis
	// key, GETRANGE <prefix>cache:<id> 0 CacheFetchEnd: one byte more than
	// the largest digest, so a larger value is told from one without
	// transferring it.
	CacheFetchEnd = MaxDigestSize
	// CacheDirSuffix is what the digests' directory adds to the state
	// directory's path (CacheDir).
	CacheDirSuffix = ".cache"

	digestFixedHeaderSize = 64
	digestStateWord       = 3
	digestSeqOffset       = 64
	digestControlOffset   = 72
	digestControlWords    = 7
	digestEntriesOffset   = DigestHeaderSize
	controlVersion        = 0
	controlCapturedMonoNs = 1
	controlCapturedUnixNs = 2
	controlCount          = 3
	controlHeld           = 4
)

// CacheDir is the directory of the cache digests of the engines publishing
// into stateDir: its path, trailing slashes dropped, with CacheDirSuffix
// appended (a sibling, never inside stateDir).
func CacheDir(stateDir string) string {
	trimmed := strings.TrimRight(stateDir, "/")
	if trimmed == "" && stateDir != "" {
		trimmed = "/"
	}
	return trimmed + CacheDirSuffix
}

// CacheKey is the Redis key of one engine's digest value.
func CacheKey(prefix, engineID string) string { return prefix + "cache:" + engineID }

// DigestHeader is cache line 0 of a digest, as loaded at open.
type DigestHeader struct {
	Magic         uint64
	LayoutVersion uint32
	HeaderSize    uint16
	EntrySize     uint16
	WriterPID     uint32 // in the writer's pid namespace
	Capacity      uint32 // entries the file holds (a Redis value: its count)
	State         uint64 // StateActive or StateRetired (may change after open)
	Generation    uint64 // the engine file's (Redis record's) generation
	CreatedUnixNs uint64
	KVBlockSize   uint32 // the engine's KV block size in tokens (display)
	BlockTokens   uint32 // BlockTokens
	Reserved      uint64
}

// digestHeaderFromWords takes the u32/u16 fields out of the words that hold
// them (readers load only whole words).
func digestHeaderFromWords(w *[digestFixedHeaderSize / 8]uint64) DigestHeader {
	return DigestHeader{
		Magic:         w[0],
		LayoutVersion: uint32(w[1]),
		HeaderSize:    uint16(w[1] >> 32),
		EntrySize:     uint16(w[1] >> 48),
		WriterPID:     uint32(w[2]),
		Capacity:      uint32(w[2] >> 32),
		State:         w[3],
		Generation:    w[4],
		CreatedUnixNs: w[5],
		KVBlockSize:   uint32(w[6]),
		BlockTokens:   uint32(w[6] >> 32),
		Reserved:      w[7],
	}
}

// check is validation step 5: sizes, block tokens, state, capacity bound
// (magic and version are checked before it).
func (h *DigestHeader) check(name string) error {
	switch {
	case h.HeaderSize != DigestHeaderSize || h.EntrySize != DigestEntrySize:
		return corruptDigest(name, fmt.Sprintf("header/entry size %d/%d, expected %d/%d",
			h.HeaderSize, h.EntrySize, DigestHeaderSize, DigestEntrySize))
	case h.BlockTokens != BlockTokens:
		return corruptDigest(name, fmt.Sprintf("block_tokens %d, expected %d", h.BlockTokens, BlockTokens))
	case h.State != StateActive && h.State != StateRetired:
		return corruptDigest(name, fmt.Sprintf("state %d", h.State))
	case h.Capacity > MaxDigestEntries:
		return corruptDigest(name, fmt.Sprintf("capacity %d is above the limit of %d entries", h.Capacity, MaxDigestEntries))
	}
	return nil
}

// digestSize is the size of a digest file (or value) of capacity entries.
func digestSize(capacity uint32) int64 {
	return DigestHeaderSize + DigestEntrySize*int64(capacity)
}

// checkDigestStart is validation steps 2 to 6 of a digest whose first
// bytes are start (up to DigestHeaderSize of them) and whose size is size.
func checkDigestStart(name string, start []byte, size int64) (DigestHeader, error) {
	le := binary.LittleEndian
	if len(start) < 8 || le.Uint64(start) != DigestMagic {
		return DigestHeader{}, &DigestError{Class: NotDigest, Name: name}
	}
	if len(start) >= 12 {
		if version := le.Uint32(start[8:]); version != DigestLayoutVersion {
			return DigestHeader{}, &DigestError{Class: UnknownVersion, Name: name, Found: version}
		}
	}
	if len(start) < DigestHeaderSize {
		return DigestHeader{}, &DigestError{Class: WrongSize, Name: name, Size: size, Expected: DigestHeaderSize}
	}
	var words [digestFixedHeaderSize / 8]uint64
	for i := range words {
		words[i] = le.Uint64(start[8*i:])
	}
	h := digestHeaderFromWords(&words)
	if err := h.check(name); err != nil {
		return DigestHeader{}, err
	}
	if expected := digestSize(h.Capacity); size != expected {
		return DigestHeader{}, &DigestError{Class: WrongSize, Name: name, Size: size, Expected: expected}
	}
	return h, nil
}

// checkControl is validation step 8: a version, count within the capacity,
// held at least count.
func checkControl(name string, h *DigestHeader, control *[digestControlWords]uint64) error {
	count := control[controlCount]
	switch {
	case count > uint64(h.Capacity):
		return corruptDigest(name, fmt.Sprintf("count %d is above the capacity of %d entries", count, h.Capacity))
	case control[controlVersion] == 0:
		return corruptDigest(name, "version 0 (a published digest has version 1 or more)")
	case control[controlHeld] < count:
		return corruptDigest(name, fmt.Sprintf("held %d is below count %d", control[controlHeld], count))
	}
	return nil
}

// checkEntries is validation step 9: strictly ascending (so no duplicate).
func checkEntries(name string, blocks []uint64) error {
	for i := 1; i < len(blocks); i++ {
		if blocks[i-1] >= blocks[i] {
			return corruptDigest(name, fmt.Sprintf("entries %d and %d are not strictly ascending (%#016x then %#016x)",
				i-1, i, blocks[i-1], blocks[i]))
		}
	}
	return nil
}

// recordOf is the record of a checked header, control words and blocks.
func recordOf(h *DigestHeader, control *[digestControlWords]uint64, blocks []uint64) DigestRecord {
	return DigestRecord{
		WriterPID:      h.WriterPID,
		State:          h.State,
		Generation:     h.Generation,
		CreatedUnixNs:  h.CreatedUnixNs,
		KVBlockSize:    h.KVBlockSize,
		Capacity:       h.Capacity,
		CapturedUnixNs: control[controlCapturedUnixNs],
		Held:           control[controlHeld],
		Digest: CacheDigest{
			Version:        control[controlVersion],
			CapturedMonoNs: control[controlCapturedMonoNs],
			Blocks:         blocks,
		},
	}
}

// CacheDigest is one engine's cache digest: the router block hashes it
// holds, strictly ascending. A digest handed out by a reader is shared
// between reads: do not modify it. Its methods accept a nil digest (no
// digest: no block held).
type CacheDigest struct {
	// Version is the writer's counter: it changes exactly when the set may have.
	Version uint64
	// CapturedMonoNs is CLOCK_MONOTONIC of the writer's host at the capture.
	CapturedMonoNs uint64
	// Blocks are the block hashes, strictly ascending.
	Blocks []uint64
}

// Len is the number of blocks listed.
func (d *CacheDigest) Len() int {
	if d == nil {
		return 0
	}
	return len(d.Blocks)
}

// Contains reports whether hash is listed.
func (d *CacheDigest) Contains(hash uint64) bool {
	if d == nil {
		return false
	}
	i := sort.Search(len(d.Blocks), func(i int) bool { return d.Blocks[i] >= hash })
	return i < len(d.Blocks) && d.Blocks[i] == hash
}

// LeadingBlocks is how many leading blocks of a prompt (its BlockHashes, in
// order) the engine holds: its cache hit, in blocks. A digest is
// prefix-closed, so "block i is listed" is true up to the hit's end and
// false after it, and a bisection needs log2(len(prompt)) lookups. On a
// digest that is not prefix-closed (a writer's bug) the answer n is still a
// run boundary (block n-1 listed, block n not, or the prompt's end), never a
// failure.
func (d *CacheDigest) LeadingBlocks(prompt []uint64) int {
	start, end := 0, len(prompt) // blocks before start are listed; block end (if any) is not
	for start < end {
		middle := int(uint(start+end) >> 1)
		if d.Contains(prompt[middle]) {
			start = middle + 1
		} else {
			end = middle
		}
	}
	return start
}

// DigestRecord is one digest with what its header and control words say
// about it.
type DigestRecord struct {
	WriterPID uint32 // in the writer's pid namespace
	// State is StateActive or StateRetired (a value is always active); a
	// reader does not use a retired digest.
	State uint64
	// Generation is the engine file's (Redis record's) generation: a digest
	// is used only when it equals the engine's.
	Generation     uint64
	CreatedUnixNs  uint64
	KVBlockSize    uint32 // display only
	Capacity       uint32 // entries the file holds (a value: its count)
	CapturedUnixNs uint64 // CLOCK_REALTIME at the capture (display)
	// Held is the router blocks the engine held at the capture: Digest.Len(),
	// or more when the digest was cut to its capacity.
	Held   uint64
	Digest CacheDigest
}

// DecodeDigestValue decodes the Redis value of key (<prefix>cache:<id>) and
// validates it in the order of docs/FORMAT.md, "Cache residency" (steps 2
// to 6, 8 and 9): magic, version, at least a header, the header's fields,
// the size, ACTIVE, count equal to capacity, the control words, then the
// entries. The error is a *DigestError naming key.
func DecodeDigestValue(key string, b []byte) (DigestRecord, error) {
	start := b
	if len(start) > DigestHeaderSize {
		start = start[:DigestHeaderSize]
	}
	h, err := checkDigestStart(key, start, int64(len(b)))
	if err != nil {
		return DigestRecord{}, err
	}
	le := binary.LittleEndian
	var control [digestControlWords]uint64
	for i := range control {
		control[i] = le.Uint64(b[digestControlOffset+8*i:])
	}
	if h.State != StateActive {
		return DigestRecord{}, corruptDigest(key, fmt.Sprintf("state %d in a Redis value (only ACTIVE values are written)", h.State))
	}
	if count := control[controlCount]; count != uint64(h.Capacity) {
		return DigestRecord{}, corruptDigest(key, fmt.Sprintf("count %d differs from capacity %d (a Redis value's are equal)", count, h.Capacity))
	}
	if err := checkControl(key, &h, &control); err != nil {
		return DigestRecord{}, err
	}
	blocks := make([]uint64, h.Capacity)
	for i := range blocks {
		blocks[i] = le.Uint64(b[digestEntriesOffset+DigestEntrySize*i:])
	}
	if err := checkEntries(key, blocks); err != nil {
		return DigestRecord{}, err
	}
	return recordOf(&h, &control, blocks), nil
}

// DecodeFetchedCache judges one fetch of an engine's digest key (the reply
// of GETRANGE <prefix>cache:<id> 0 CacheFetchEnd; empty for a missing key)
// for the record it goes with: the record's Generation and the
// Snapshot.CacheVersion it names. A digest of another generation (another
// run of the engine) or older than the version named is not returned, nor
// is a value that is no digest. The error is an *Error naming key: of class
// CorruptCache (Damaged; its Err the *DigestError, if the value was
// refused) for a value that is no usable digest (report it while the record
// names this version), of class MissingCache for one not there for the
// record: no value, another generation, older (report it once).
//
// Fetch only when the record's cache_version is not 0 and differs from the
// Version of the digest held (NeedsDigest); use the digest only while the
// engine is Fresh (UsableDigest).
func DecodeFetchedCache(key string, value []byte, generation, version uint64) (*CacheDigest, error) {
	notYet := func(what string) error { return &Error{Class: MissingCache, Name: key, What: what} }
	if len(value) == 0 {
		return nil, notYet(fmt.Sprintf("the record names digest version %d, but the key holds no value "+
			"(expired, or not written yet)", version))
	}
	if len(value) > MaxDigestSize {
		return nil, &Error{Class: CorruptCache, Name: key, Damaged: true, What: fmt.Sprintf(
			"a value larger than the largest digest (%d bytes; only its first %d were read)", MaxDigestSize, MaxDigestSize+1)}
	}
	r, err := DecodeDigestValue(key, value)
	if err != nil {
		what := err.Error()
		var refused *DigestError
		if errors.As(err, &refused) {
			what = refused.reason()
		}
		return nil, &Error{Class: CorruptCache, Name: key, Damaged: true, What: what, Err: err}
	}
	if r.Generation != generation {
		return nil, notYet(fmt.Sprintf("it belongs to generation %d of the engine, not to the record's %d", r.Generation, generation))
	}
	if r.Digest.Version < version {
		return nil, notYet(fmt.Sprintf("it holds version %d, older than the version %d the record names", r.Digest.Version, version))
	}
	return &r.Digest, nil
}

// NeedsDigest reports whether a reader holding held (nil: none) for an
// engine whose state is e should fetch the engine's digest again: the
// snapshot names a digest (CacheVersion not 0) and held is older than that
// version (as the Rust reader: a held digest at least as new is kept).
func NeedsDigest(e *EngineState, held *CacheDigest) bool {
	version := e.Snapshot.CacheVersion
	return version != 0 && (held == nil || held.Version < version)
}

// UsableDigest is held if a router may use it for the engine whose state is
// e now (the freshness rule of docs/FORMAT.md, "Cache residency"): the state
// is Fresh and names a digest, held is at least the version it names (an
// older digest is one the engine no longer vouches for), and held is of the
// engine's generation (generation: the one DecodeFetchedCache checked it
// against); else nil.
func UsableDigest(e *EngineState, held *CacheDigest, generation uint64) *CacheDigest {
	if held == nil || e.Status != Fresh || e.Snapshot.CacheVersion == 0 ||
		held.Version < e.Snapshot.CacheVersion || generation != e.Generation {
		return nil
	}
	return held
}
