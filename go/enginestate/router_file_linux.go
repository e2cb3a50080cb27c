package enginestate

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
)

// RouterFile is one router replica's reservations file
// (<dir>.routers/<replica id>, docs/FORMAT.md, "Shared reservations"),
// opened like an engine file (never blocks, never follows a link, refuses
// anything but a regular file), validated, mapped read-only and never
// written. A file truncated under the mapping reads torn, never crashes
// the process (the loads run under debug.SetPanicOnFault, as an engine
// file's). Not safe for concurrent use.
type RouterFile struct {
	m         *mapping
	path      string
	header    RouterHeader
	replicaID string
	inode     uint64
	// scratch holds the slot words of a read's attempts, reused.
	scratch []uint64
}

// OpenRouterFile opens and validates path in the order of docs/FORMAT.md,
// "Writing and reading reservations": a regular file (else RefusedEntry,
// an *Error), magic, version, header fields, capacity, size, replica id
// (valid and the file's name) (steps 2 to 7, a *RouterError), then one
// read (a torn read does not fail the open, a malformed one does).
func OpenRouterFile(path string) (*RouterFile, error) {
	m, header, inode, err := mapHeaderFile(path, RouterHeaderSize,
		func(start []byte, size int64) (RouterHeader, int, error) {
			h, err := checkRouterStart(path, start, size)
			if err != nil {
				return h, 0, err
			}
			return h, int(routerFileSize(h.Capacity)), nil
		})
	if err != nil {
		return nil, err
	}
	f := &RouterFile{m: m, path: path, header: header, inode: inode}
	if err := f.checkReplicaID(); err != nil {
		m.close()
		return nil, err
	}
	if _, err := f.Read(); err != nil && !isTornRouter(err) {
		m.close()
		return nil, err
	}
	return f, nil
}

func isTornRouter(err error) bool {
	e, ok := err.(*RouterError)
	return ok && e.Class == TornRouter
}

// checkReplicaID loads the replica id field: a valid id, the file's name.
func (f *RouterFile) checkReplicaID() error {
	var id [EngineIDFieldSize]byte
	ok := f.m.guard(func() {
		for i := 0; i < EngineIDFieldSize; i += 8 {
			binary.LittleEndian.PutUint64(id[i:], f.m.load(replicaIDOffset+i))
		}
	})
	if !ok {
		return &RouterError{Class: TornRouter, Name: f.path}
	}
	n := 0
	for n < len(id) && id[n] != 0 {
		n++
	}
	replicaID := string(id[:n])
	for _, b := range id[n:] {
		if b != 0 {
			return corruptRouter(f.path, fmt.Sprintf("its replica id has bytes after its NUL at byte %d", n))
		}
	}
	if ok, reason := ValidEngineID(replicaID); !ok {
		return corruptRouter(f.path, fmt.Sprintf("its replica id %q is invalid: %s", replicaID, reason))
	}
	if name := filepath.Base(f.path); name != replicaID {
		return corruptRouter(f.path, fmt.Sprintf("it names replica %q but the file is called %q", replicaID, name))
	}
	f.replicaID = replicaID
	return nil
}

// Read is a consistent copy of the reservations, checked (count within the
// capacity, every live slot a valid engine id with zero padding, no engine
// twice); a *RouterError of class TornRouter when no consistent copy could
// be had within the retry bound, the sequence was 0, or the file was
// truncated under the mapping.
func (f *RouterFile) Read() (RouterRecord, error) {
	var r RouterRecord
	err := f.ReadInto(&r)
	return r, err
}

// ReadInto is Read into r, reusing r.Engines (the engine ids it holds at the
// same slots are kept: a poller allocates only when the engines change).
// After an error r.Engines is empty.
func (f *RouterFile) ReadInto(r *RouterRecord) error {
	_, _, err := f.read(r)
	return err
}

// read is ReadInto, also giving the state and heartbeat words it loaded
// (whatever the reading: 0 when the mapping faulted), all under one guard
// (SetPanicOnFault is two runtime calls: once per read, not per word).
func (f *RouterFile) read(r *RouterRecord) (state, heartbeat uint64, err error) {
	var count, changed, seq uint64
	torn := true
	ok := f.m.guard(func() {
		// state and heartbeat are single words outside the protocol (FORMAT.md).
		state = f.m.load(routerStateWord * 8)
		f.scratch, count, changed, seq, torn = f.m.readRouterSeqlock(int(f.header.Capacity), f.scratch)
		heartbeat = f.m.load(routerHeartbeatOffset)
	})
	r.Engines = r.Engines[:0]
	if !ok || torn {
		return state, heartbeat, &RouterError{Class: TornRouter, Name: f.path, LastSeq: seq}
	}
	if count > uint64(f.header.Capacity) {
		return state, heartbeat, corruptRouter(f.path, fmt.Sprintf(
			"count %d is above the file's capacity of %d slots", count, f.header.Capacity))
	}
	r.Engines, err = decodeSlots(f.path, f.scratch, r.Engines)
	if err != nil {
		return state, heartbeat, err
	}
	r.ReplicaID, r.State, r.Generation = f.replicaID, state, f.header.Generation
	r.Seq, r.ChangedMonoNs, r.HeartbeatMonoNs = seq, changed, heartbeat
	return state, heartbeat, nil
}

// readRouterSeqlock copies count, changed_mono_ns and the first count slots
// (count bounded by capacity before it is used as a length: a torn copy can
// hold anything) under the file's seqlock: the engine file's protocol over
// more words, with the same pairings and retry bound (readSeqlock). words
// is reused across attempts and returned with the accepted copy's slots.
// torn when no consistent copy was had within the bound, or the sequence
// was 0 (a zeroed or truncated file: never a reading).
func (m *mapping) readRouterSeqlock(capacity int, words []uint64) (out []uint64, count, changed, seq uint64, torn bool) {
	seqWord := m.word(routerSeqOffset)
	countWord := m.word(routerCountOffset)
	changedWord := m.word(routerChangedOffset)
	slots := m.words(routerSlotsOffset, capacity*slotWords)
	var last uint64
	for attempt := 0; attempt < readSpins+readYields; attempt++ {
		s0 := atomic.LoadUint64(seqWord) // acquire, pairs with the writer's store of s+2
		last = s0
		if s0&1 == 0 {
			count = atomic.LoadUint64(countWord) // acquire: stands in for the fence before the reload
			changed = atomic.LoadUint64(changedWord)
			live := count
			if live > uint64(capacity) {
				live = uint64(capacity)
			}
			words = words[:0]
			for i := 0; i < int(live)*slotWords; i++ {
				words = append(words, atomic.LoadUint64(&slots[i]))
			}
			s1 := atomic.LoadUint64(seqWord)
			if s0 == s1 {
				if s0 == 0 {
					break
				}
				return words, count, changed, s0, false
			}
			last = s1
		}
		if attempt >= readSpins {
			runtime.Gosched()
		}
	}
	return words[:0], 0, 0, last, true
}

// IsRetired reports that the writer retired this file (closed or replaced
// it): open the path again for the current one. False when the mapping
// faulted (then Truncated is true).
func (f *RouterFile) IsRetired() bool {
	var state uint64
	f.m.guard(func() { state = f.m.load(routerStateWord * 8) })
	return state == StateRetired
}

// HeartbeatMonoNs is the last heartbeat stamp (one load; 0 when faulted).
func (f *RouterFile) HeartbeatMonoNs() uint64 {
	return f.m.guardedLoad(routerHeartbeatOffset)
}

// Seq is the sequence word now (one load): a cheap "did anything change?".
func (f *RouterFile) Seq() uint64 {
	return f.m.guardedLoad(routerSeqOffset)
}

// Truncated reports that a load faulted: the file was truncated under the
// mapping; open it again to see what it is now.
func (f *RouterFile) Truncated() bool { return f.m.faulted }

// Header is the header as it was at open (State may have changed since).
func (f *RouterFile) Header() RouterHeader { return f.header }

// ReplicaID is the replica id recorded in the file (its name).
func (f *RouterFile) ReplicaID() string { return f.replicaID }

// Generation is the file's generation.
func (f *RouterFile) Generation() uint64 { return f.header.Generation }

// Path is the file's path.
func (f *RouterFile) Path() string { return f.path }

// Inode is the file's inode.
func (f *RouterFile) Inode() uint64 { return f.inode }

// Close unmaps the file. The RouterFile must not be used afterwards.
func (f *RouterFile) Close() error {
	f.m.close()
	return nil
}
