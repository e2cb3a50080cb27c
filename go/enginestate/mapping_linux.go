package enginestate

import (
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// mapping is a read-only shared mapping of an engine file (FileSize bytes)
// or of a cache digest file (its own size), seen as 8-byte words. Every load from it goes through guard, so that a
// file truncated under the mapping cannot crash the process.
//
// The only unsafe code of the package is here: word turns an offset into a
// *uint64 into the mapping. Invariants it relies on:
//   - the mapping is len(data) bytes (the length passed to mmap) and offsets
//     are checked against it, so the word lies inside it;
//   - mmap returns a page-aligned address and every offset is a multiple of
//     8, so the word is 8-aligned as sync/atomic's 64-bit operations require
//     (also on 32-bit platforms);
//   - the mapping is not Go heap memory: the garbage collector never moves
//     or frees it, and it stays mapped until close, after which no word is
//     used (a Dir drops its files before unmapping them);
//   - every access, in every process, is an atomic 8-byte access of the
//     whole word (docs/FORMAT.md), so there is no mixed-size access and no
//     data race; on this PROT_READ mapping only loads are done.
type mapping struct {
	data []byte
	// faulted: a load touched a page beyond the file's end (the file was
	// truncated under the mapping). From then on nothing is loaded.
	faulted bool
}

// hostLittleEndian: layout version 1 stores little-endian words, which an
// atomic load reads as their values only on a little-endian host.
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// mapFile maps the first length bytes of fd (FileSize for an engine file).
func mapFile(fd, length int) (*mapping, error) {
	data, err := syscall.Mmap(fd, 0, length, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return &mapping{data: data}, nil
}

func (m *mapping) close() {
	if m.data != nil {
		_ = syscall.Munmap(m.data)
		m.data = nil
	}
}

// word is the 8-byte word at byte offset off (see the invariants above).
func (m *mapping) word(off int) *uint64 {
	if off%8 != 0 || off+8 > len(m.data) {
		panic("enginestate: word offset out of the layout")
	}
	return (*uint64)(unsafe.Pointer(&m.data[off]))
}

// words is the n words from byte offset off (see the invariants above: the
// range is checked against the mapping, off is a multiple of 8).
func (m *mapping) words(off, n int) []uint64 {
	if off%8 != 0 || n < 0 || off+8*n > len(m.data) {
		panic("enginestate: words out of the layout")
	}
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&m.data[off])), n)
}

// load is one relaxed-or-stronger load of the word at off (sync/atomic
// loads are sequentially consistent, FORMAT.md).
func (m *mapping) load(off int) uint64 { return atomic.LoadUint64(m.word(off)) }

// guardedLoad is one load at off under guard (0 when the file was truncated
// under the mapping: faulted then says so).
func (m *mapping) guardedLoad(off int) uint64 {
	var v uint64
	m.guard(func() { v = m.load(off) })
	return v
}

// guard runs loads, which may fault: a file can be truncated under the
// mapping by another process, and a load from a page beyond its end raises
// SIGBUS. debug.SetPanicOnFault turns that fault into a panic of this
// goroutine, recovered here (absorb): the mapping is marked faulted and
// guard reports false; the caller reports the engine torn, and the next
// directory listing opens the file again (and reports its new size).
//
// The alternatives cost more: an fstat before each read is a system call
// (several times a whole read) and still racy (the file can shrink between
// the fstat and the load); pread instead of a mapping is a system call per
// read and not word-atomic. SetPanicOnFault costs two runtime calls and one
// deferred function per read (BenchmarkReadOneEngine). The size is still
// checked with fstat once, at open, before anything is mapped.
func (m *mapping) guard(loads func()) (ok bool) {
	if m.faulted || m.data == nil {
		return false
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			ok = m.absorb(r)
		}
	}()
	loads()
	return true
}

// absorb takes a recovered panic: a fault inside this mapping marks it
// faulted (false); anything else is not ours and panics on.
func (m *mapping) absorb(r interface{}) bool {
	fault, isFault := r.(interface{ Addr() uintptr })
	if !isFault || !m.contains(fault.Addr()) {
		panic(r)
	}
	m.faulted = true
	return false
}

func (m *mapping) contains(addr uintptr) bool {
	start := uintptr(unsafe.Pointer(&m.data[0]))
	return addr >= start && addr < start+uintptr(len(m.data))
}

// snapshotWords views a Snapshot as its 16 words, so a read copies the
// payload straight into the caller's snapshot. Sound because Snapshot is
// sixteen uint64 fields (15 named, then [1]uint64) in word order: Go lays
// struct fields out in order, and uint64 fields need no padding between
// them; the size is asserted below.
func snapshotWords(s *Snapshot) *[SnapshotWords]uint64 {
	return (*[SnapshotWords]uint64)(unsafe.Pointer(s))
}

// A compile-time check that Snapshot is exactly 16 words.
var _ [unsafe.Sizeof(Snapshot{}) - SnapshotWords*8]byte
var _ [SnapshotWords*8 - unsafe.Sizeof(Snapshot{})]byte

// payload is the snapshot words (see word for the invariants).
func (m *mapping) payload() *[SnapshotWords]uint64 {
	if PayloadOffset+PayloadSize > len(m.data) {
		panic("enginestate: payload out of the layout")
	}
	return (*[SnapshotWords]uint64)(unsafe.Pointer(&m.data[PayloadOffset]))
}
