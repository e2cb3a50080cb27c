package enginestate

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
)

// The seqlock read of docs/FORMAT.md ("The seqlock protocol"), with Go's
// sync/atomic. Go has no fences and no relaxed atomics: every sync/atomic
// operation is sequentially consistent (Go memory model, 2022), so every
// load below is at least an acquire load. That is stronger than the
// protocol needs, and enough for it against a writer in C11, C++ or Rust
// (reasoned about in the C++ model, where these are seq_cst loads; on
// x86-64 they are plain MOVs, on AArch64 LDAR):
//
//   - s0 (read step 1): an acquire load pairs with the writer's release store
//     of s+2: a reader that sees s+2 sees every payload word of that write.
//   - the payload loads (step 2) are each acquire loads, so the reload of seq
//     (step 4) cannot be performed before any of them: that is what the
//     C11/Rust reader's acquire fence (step 3) does. If a payload load saw a
//     store of a later write, that store follows the writer's release fence
//     after its odd store of seq, so the odd seq (or a later value) is
//     visible to the reload and the copy is refused.
//
// Retries are bounded like the Rust reader's: readSpins attempts back to
// back, then readYields attempts each after runtime.Gosched. A writer killed
// mid-write leaves seq odd forever; the engine then reads torn instead of
// spinning.
const (
	readSpins  = 128
	readYields = 16
)

// observed is what one read of an engine file loads from its mapping,
// besides the snapshot.
type observed struct {
	state     uint64
	seq       uint64
	torn      bool
	heartbeat uint64
}

// observe loads state, a consistent snapshot (into snapshot) and the
// heartbeat. False when the mapping faulted (the file was truncated under
// it): then everything reads zero and torn, as the Rust reader sees it (it
// maps zero pages over the file).
func (m *mapping) observe(o *observed, snapshot *Snapshot) (ok bool) {
	if m.faulted || m.data == nil {
		*o, *snapshot = observed{torn: true}, Snapshot{}
		return false
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			ok = m.absorb(r)
			*o, *snapshot = observed{torn: true}, Snapshot{}
		}
	}()
	// state and heartbeat are single words outside the protocol: each is
	// one value and carries no other data (FORMAT.md).
	o.state = atomic.LoadUint64(m.word(stateWord * 8))
	o.seq, o.torn = m.readSeqlock(snapshotWords(snapshot))
	o.heartbeat = atomic.LoadUint64(m.word(HeartbeatOffset))
	return true
}

// readSeqlock copies the payload under the seqlock; torn when no consistent
// copy was had within the retry bound, or the sequence was 0 (never
// published: the file was zeroed; FORMAT.md). A torn copy is zeroed.
func (m *mapping) readSeqlock(out *[SnapshotWords]uint64) (seq uint64, torn bool) {
	seqWord := m.word(SeqOffset)
	payload := m.payload()
	var last uint64
	for attempt := 0; attempt < readSpins+readYields; attempt++ {
		s0 := atomic.LoadUint64(seqWord) // step 1: acquire, pairs with the writer's store of s+2
		last = s0
		if s0&1 == 0 {
			for i := range out {
				out[i] = atomic.LoadUint64(&payload[i]) // step 2 (acquire: stands in for step 3's fence)
			}
			s1 := atomic.LoadUint64(seqWord) // step 4
			if s0 == s1 {
				if s0 == 0 {
					break
				}
				return s0, false
			}
			last = s1
		}
		if attempt >= readSpins {
			runtime.Gosched()
		}
	}
	*out = [SnapshotWords]uint64{}
	return last, true
}

// readDigestSeqlock copies a digest's control words and its first count
// entries (count bounded by capacity before it is used as a length: a torn
// copy can hold anything) under the digest's seqlock (docs/FORMAT.md,
// "Writing and reading a digest"): the engine file's protocol over more
// words, with the same pairings and the same retry bound (readSpins
// attempts back to back, then readYields each after runtime.Gosched). blocks
// is reused across attempts and returned with the accepted copy's entries.
// torn when no consistent copy was had within the bound, or the sequence
// was 0 (never a digest: a zeroed file).
func (m *mapping) readDigestSeqlock(control *[digestControlWords]uint64, capacity int, blocks []uint64) (
	out []uint64, seq uint64, torn bool) {
	seqWord := m.word(digestSeqOffset)
	controlWords := m.words(digestControlOffset, digestControlWords)
	entries := m.words(digestEntriesOffset, capacity)
	var last uint64
	for attempt := 0; attempt < readSpins+readYields; attempt++ {
		s0 := atomic.LoadUint64(seqWord) // acquire, pairs with the writer's store of s+2
		last = s0
		if s0&1 == 0 {
			for i := range control {
				control[i] = atomic.LoadUint64(&controlWords[i]) // acquire: stands in for the fence before the reload
			}
			count := control[controlCount]
			if count > uint64(capacity) {
				count = uint64(capacity)
			}
			blocks = blocks[:0]
			for i := 0; i < int(count); i++ {
				blocks = append(blocks, atomic.LoadUint64(&entries[i]))
			}
			s1 := atomic.LoadUint64(seqWord)
			if s0 == s1 {
				if s0 == 0 {
					break
				}
				return blocks, s0, false
			}
			last = s1
		}
		if attempt >= readSpins {
			runtime.Gosched()
		}
	}
	return blocks[:0], last, true
}
