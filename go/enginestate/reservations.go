package enginestate

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"
)

// Router replicas' shared reservations (docs/FORMAT.md, "Shared
// reservations"): the six counters a router replica holds per engine, the
// 128-byte slot that carries them with the engine id, in a replica's file
// (<dir>.routers/<replica id>, RouterFile, Replicas) and in its Redis value
// (<prefix>router:<id>, DecodeRouterValue) alike. The constants are
// FORMAT.md's (the format_doc test checks them against its tables).
const (
	// RouterMagic is the first word of a router file and value: "ESROUTER".
	RouterMagic uint64 = 0x524554554f525345
	// RouterLayoutVersion is the router file's own layout version.
	RouterLayoutVersion uint32 = 1
	// RouterHeaderSize is the bytes of a router file's header (cache line 0).
	RouterHeaderSize = 64
	// ReservationSlotSize is the bytes of one slot: engine id (64), the six
	// counters (48), zero (16).
	ReservationSlotSize = 128
	// ReservationWords is the number of counters.
	ReservationWords = 6
	// MaxRouterEngines is the slots of a writer's file: the most engines one
	// replica shares reservations on.
	MaxRouterEngines = 256
	// RouterFileSize is the size of a writer's file.
	RouterFileSize = routerSlotsOffset + ReservationSlotSize*MaxRouterEngines
	// RoutersDirSuffix: the replicas' directory is the state directory's
	// path plus this.
	RoutersDirSuffix = ".routers"
	// RouterValueHeaderSize is the bytes before a Redis value's slots.
	RouterValueHeaderSize = 64
	// MaxRouterValueSize is the bytes of the largest Redis value: a reader
	// fetches one byte more (GETRANGE key 0 MaxRouterValueSize).
	MaxRouterValueSize = RouterValueHeaderSize + MaxRouterEngines*ReservationSlotSize

	routerStateWord       = 3
	routerSeqOffset       = 64
	routerHeartbeatOffset = 72
	routerCountOffset     = 80
	routerChangedOffset   = 88
	replicaIDOffset       = 128
	routerSlotsOffset     = 192
	slotWords             = ReservationSlotSize / 8
	slotCountersOffset    = EngineIDFieldSize
)

// routerFileSize is the size of a file of capacity slots.
func routerFileSize(capacity uint32) int64 {
	return routerSlotsOffset + ReservationSlotSize*int64(capacity)
}

// Reservations is what one router replica reserved on one engine and has
// not seen complete: the router's shadow counters, in word order.
type Reservations struct {
	NumRequests          uint64
	OngoingTokens        uint64
	PendingPrefillTokens uint64
	OngoingDecodeTokens  uint64
	NumPrefilling        uint64
	MaxPrefillRemaining  uint64
}

// ReservationFieldNames are the counters' names in word order (the same in
// Rust, C and JSON).
var ReservationFieldNames = [ReservationWords]string{
	"num_requests",
	"ongoing_tokens",
	"pending_prefill_tokens",
	"ongoing_decode_tokens",
	"num_prefilling",
	"max_prefill_remaining",
}

// Words is the counters in word order.
func (r *Reservations) Words() [ReservationWords]uint64 {
	return [ReservationWords]uint64{r.NumRequests, r.OngoingTokens, r.PendingPrefillTokens,
		r.OngoingDecodeTokens, r.NumPrefilling, r.MaxPrefillRemaining}
}

// ReservationsFromWords is the counters of six words in word order.
func ReservationsFromWords(w [ReservationWords]uint64) Reservations {
	return Reservations{w[0], w[1], w[2], w[3], w[4], w[5]}
}

// IsZero: nothing reserved.
func (r *Reservations) IsZero() bool { return *r == Reservations{} }

// EngineReservations is one slot: an engine and the replica's reservations
// on it.
type EngineReservations struct {
	EngineID string
	Reservations
}

// RoutersDir is the directory of the router replicas' files beside the
// engines of stateDir: its path, trailing slashes dropped, with
// RoutersDirSuffix appended (a sibling, never inside stateDir).
func RoutersDir(stateDir string) string {
	trimmed := strings.TrimRight(stateDir, "/")
	if trimmed == "" && stateDir != "" {
		trimmed = "/"
	}
	return trimmed + RoutersDirSuffix
}

// RouterRegistryKey is the Redis key of the set of replica ids.
func RouterRegistryKey(prefix string) string { return prefix + "routers" }

// RouterKey is the Redis key of one replica's value.
func RouterKey(prefix, replicaID string) string { return prefix + "router:" + replicaID }

// The error classes of router files and values, besides UnknownVersion,
// WrongSize, ForeignValue, NoExpiry and RefusedEntry.
const (
	// NotRouter: a router file whose first 8 bytes are not "ESROUTER".
	NotRouter Class = "not_router"
	// CorruptRouter: a router file or value that breaks the format's rules
	// (header fields, replica id, count, a malformed or duplicate slot).
	CorruptRouter Class = "corrupt_router"
	// TornRouter: no consistent copy of a router file within the seqlock's
	// retry bound, or sequence 0; read it again later (TornDigest's class).
	TornRouter Class = TornDigest
)

// RouterError is what is wrong with one router file or Redis value
// (docs/FORMAT.md, "Writing and reading reservations"); Class is the golden
// vectors' class.
type RouterError struct {
	Class Class
	// Name is the file's path or the Redis key.
	Name string
	// Found is the version of an UnknownVersion error.
	Found uint32
	// Size and Expected are the size and the size the header implies
	// (WrongSize).
	Size, Expected int64
	// LastSeq is the last sequence a TornRouter read saw.
	LastSeq uint64
	// What details a CorruptRouter, ForeignValue or NoExpiry error.
	What string
}

func (e *RouterError) Error() string { return e.Name + ": " + e.reason() }

func (e *RouterError) reason() string {
	switch e.Class {
	case NotRouter:
		return "not a router reservations file (bad magic); remove it from the routers directory"
	case UnknownVersion:
		return fmt.Sprintf("router reservations layout version %d, but this build reads version %d; upgrade "+
			"engine-state on this side (or downgrade that router) so both use the same layout",
			e.Found, RouterLayoutVersion)
	case WrongSize:
		return fmt.Sprintf("%d bytes, but its header says %d (truncated, or not a router reservations file); "+
			"remove it (a restarted router creates a new one)", e.Size, e.Expected)
	case TornRouter:
		return fmt.Sprintf("router reservations torn (a write was in progress, sequence %d); read them again later",
			e.LastSeq)
	case ForeignValue:
		return fmt.Sprintf("not a router reservations value (%s); delete the key, or give this fleet its own key "+
			"prefix (?prefix=... in the URI)", e.What)
	case NoExpiry:
		return fmt.Sprintf("a router reservations value whose age cannot be told: %s; it is not used. Delete the "+
			"key (writers always SET it with PX ttl_ms, and a live writer writes it again within a period)", e.What)
	}
	return fmt.Sprintf("corrupt router reservations (%s); ignore this replica until its router restarts "+
		"(remove the file if no router runs under that id)", e.What)
}

func corruptRouter(name, what string) error {
	return &RouterError{Class: CorruptRouter, Name: name, What: what}
}

// decodeSlot decodes one slot's 16 words into dst, whose EngineID is kept
// when the slot holds the same id (no allocation, no validation: it was
// validated when it was decoded). Word by word: the id's NUL is in the
// first word with a zero byte, and every word after it must be zero.
func decodeSlot(name string, w []uint64, dst *EngineReservations) error {
	const idWords = EngineIDFieldSize / 8
	n := -1 // the id's length: the index of its first NUL
	for i := 0; i < idWords && n < 0; i++ {
		for b := 0; b < 8; b++ {
			if byte(w[i]>>(8*b)) == 0 {
				n = 8*i + b
				if w[i]>>(8*b) != 0 {
					return corruptRouter(name, fmt.Sprintf("a slot's engine id has bytes after its NUL at byte %d", n))
				}
				break
			}
		}
	}
	if n < 0 {
		return corruptRouter(name, "a slot's engine id fills its 64 bytes (no NUL)")
	}
	for i := n/8 + 1; i < idWords; i++ {
		if w[i] != 0 {
			return corruptRouter(name, fmt.Sprintf("a slot's engine id has bytes after its NUL at byte %d", n))
		}
	}
	var id [EngineIDFieldSize]byte
	for i := 0; i <= n/8 && i < idWords; i++ {
		binary.LittleEndian.PutUint64(id[8*i:], w[i])
	}
	if string(id[:n]) != dst.EngineID {
		engineID := string(id[:n])
		if ok, reason := ValidEngineID(engineID); !ok {
			return corruptRouter(name, fmt.Sprintf("a slot holds an invalid engine id %q: %s", engineID, reason))
		}
		dst.EngineID = engineID
	}
	if w[slotWords-2] != 0 || w[slotWords-1] != 0 {
		return corruptRouter(name,
			fmt.Sprintf("the slot of engine %q has nonzero padding (bytes 112-127)", dst.EngineID))
	}
	c := w[slotCountersOffset/8:]
	dst.Reservations = Reservations{c[0], c[1], c[2], c[3], c[4], c[5]}
	return nil
}

// decodeSlots decodes consecutive slots (16 words each) into out (reused:
// an engine id out already holds at the same index is kept), checking that
// no engine is in two. On error out is empty.
func decodeSlots(name string, words []uint64, out []EngineReservations) ([]EngineReservations, error) {
	count := len(words) / slotWords
	if cap(out) < count {
		grown := make([]EngineReservations, count)
		copy(grown, out[:cap(out)])
		out = grown
	}
	out = out[:count]
	for i := range out {
		if err := decodeSlot(name, words[i*slotWords:(i+1)*slotWords], &out[i]); err != nil {
			return out[:0], err
		}
	}
	// Few engines per replica: a quadratic check allocates nothing.
	for i := range out {
		for j := 0; j < i; j++ {
			if out[i].EngineID == out[j].EngineID {
				return out[:0], corruptRouter(name,
					fmt.Sprintf("engine %q is in slots %d and %d", out[i].EngineID, j, i))
			}
		}
	}
	return out, nil
}

// RouterHeader is cache line 0 of a router file, as loaded at open.
type RouterHeader struct {
	Magic             uint64
	LayoutVersion     uint32
	HeaderSize        uint16
	SlotSize          uint16
	WriterPID         uint32 // in the writer's pid namespace
	HeartbeatPeriodUs uint32
	State             uint64 // StateActive or StateRetired (may change after open)
	WriterPIDNs       uint64 // inode of the writer's /proc/self/ns/pid; 0 unknown
	CreatedUnixNs     uint64
	Generation        uint64
	Capacity          uint32
	Reserved          uint32
}

// routerHeaderFromBytes is the header of a file's first 64 bytes.
func routerHeaderFromBytes(b *[RouterHeaderSize]byte) RouterHeader {
	le := binary.LittleEndian
	return RouterHeader{
		Magic:             le.Uint64(b[0:]),
		LayoutVersion:     le.Uint32(b[8:]),
		HeaderSize:        le.Uint16(b[12:]),
		SlotSize:          le.Uint16(b[14:]),
		WriterPID:         le.Uint32(b[16:]),
		HeartbeatPeriodUs: le.Uint32(b[20:]),
		State:             le.Uint64(b[24:]),
		WriterPIDNs:       le.Uint64(b[32:]),
		CreatedUnixNs:     le.Uint64(b[40:]),
		Generation:        le.Uint64(b[48:]),
		Capacity:          le.Uint32(b[56:]),
		Reserved:          le.Uint32(b[60:]),
	}
}

// checkRouterStart validates a file's first bytes (start) and size in the
// order of docs/FORMAT.md, "Writing and reading reservations", steps 2 to 6.
func checkRouterStart(name string, start []byte, size int64) (RouterHeader, error) {
	le := binary.LittleEndian
	// Shorter than a magic: wrong_size, as the Rust reader and an engine
	// file's check say.
	if len(start) >= 8 && le.Uint64(start) != RouterMagic {
		return RouterHeader{}, &RouterError{Class: NotRouter, Name: name}
	}
	if len(start) >= 12 {
		if v := le.Uint32(start[8:]); v != RouterLayoutVersion {
			return RouterHeader{}, &RouterError{Class: UnknownVersion, Name: name, Found: v}
		}
	}
	if len(start) < RouterHeaderSize {
		return RouterHeader{}, &RouterError{Class: WrongSize, Name: name, Size: size, Expected: RouterFileSize}
	}
	h := routerHeaderFromBytes((*[RouterHeaderSize]byte)(start[:RouterHeaderSize]))
	switch {
	case h.HeaderSize != RouterHeaderSize || h.SlotSize != ReservationSlotSize:
		return RouterHeader{}, corruptRouter(name, fmt.Sprintf("header/slot size %d/%d, expected %d/%d",
			h.HeaderSize, h.SlotSize, RouterHeaderSize, ReservationSlotSize))
	case h.State != StateActive && h.State != StateRetired:
		return RouterHeader{}, corruptRouter(name, fmt.Sprintf("state %d", h.State))
	case h.Capacity > MaxRouterEngines:
		return RouterHeader{}, corruptRouter(name, fmt.Sprintf("capacity %d is above MAX_ROUTER_ENGINES (%d)",
			h.Capacity, MaxRouterEngines))
	}
	if expected := routerFileSize(h.Capacity); size != expected {
		return RouterHeader{}, &RouterError{Class: WrongSize, Name: name, Size: size, Expected: expected}
	}
	return h, nil
}

// RouterRecord is one consistent reading of a replica's file.
type RouterRecord struct {
	ReplicaID string
	// State is the state word as this read loaded it.
	State      uint64
	Generation uint64
	// Seq is the sequence the reading was published under (even).
	Seq uint64
	// ChangedMonoNs is the writer's CLOCK_MONOTONIC at its last change.
	ChangedMonoNs uint64
	// HeartbeatMonoNs is the last heartbeat stamp (loaded after the read).
	HeartbeatMonoNs uint64
	// Engines are the live slots, in slot order: each engine once.
	Engines []EngineReservations
}

// ReplicaState is one peer replica's reservations as a reader saw them.
type ReplicaState struct {
	// ReplicaID is the file name (or key suffix).
	ReplicaID string
	// Status: only Fresh reservations may be added to a router's own.
	Status Status
	// HeartbeatAge is the time since the replica's last heartbeat.
	HeartbeatAge time.Duration
	// ChangedAge is the time since it last changed its reservations (its
	// writer's clock); ChangedKnown is false when that is unknown (a Redis
	// value of another host).
	ChangedAge   time.Duration
	ChangedKnown bool
	// Generation of its file or value (a restarted router's is another).
	Generation uint64
	// ReadMonoNs is CLOCK_MONOTONIC when the ages were measured.
	ReadMonoNs uint64
	// WriterPID is its writer's pid on its host (display only).
	WriterPID uint32
	// Engines are its reservations per engine, in the writer's slot order
	// (each engine once); empty when torn. Reused by the next read of a
	// ReadInto: copy what must outlive it.
	Engines []EngineReservations
}

// IsFresh: only a fresh replica's reservations may be merged.
func (r *ReplicaState) IsFresh() bool { return r.Status == Fresh }

// ReplicaReading is everything one read of the replicas produced: the
// replicas sorted by id (the reader's own left out) and the per-replica
// errors, which never stop the others from being read.
type ReplicaReading struct {
	Replicas []ReplicaState
	Errors   []EngineError
}

// Get is the replica with this id, if it was read.
func (r *ReplicaReading) Get(replicaID string) (*ReplicaState, bool) {
	for i := range r.Replicas {
		if r.Replicas[i].ReplicaID == replicaID {
			return &r.Replicas[i], true
		}
	}
	return nil, false
}

// replicaStatus is the engines' rule (Freshness.Classify) with no capture
// age: a replica writes only when its reservations change, and its
// heartbeat says it is alive.
func replicaStatus(f Freshness, torn, retired bool, writer Liveness, heartbeatAge time.Duration, clockAhead bool) Status {
	return f.Classify(Observation{Torn: torn, Retired: retired, Writer: writer, HeartbeatAge: heartbeatAge,
		Idle: true, ClockAhead: clockAhead})
}

// RouterValue is one router replica's value in Redis (docs/REDIS.md, "Key
// schema"): a 64-byte header, then Count slots.
type RouterValue struct {
	WriterPID         uint32 // on the writer's host (display only)
	HeartbeatPeriodUs uint32
	State             uint64 // StateActive or StateRetired
	Generation        uint64 // differs between two runs of the replica id
	HeartbeatSeq      uint64 // +1 on every write
	HeartbeatMonoNs   uint64 // CLOCK_MONOTONIC of the writer's host at the write
	TTLMs             uint32 // the PX the key was written with
	Engines           []EngineReservations
}

// Encode is the value's bytes (what a writer SETs).
func (v *RouterValue) Encode() []byte {
	le := binary.LittleEndian
	b := make([]byte, RouterValueHeaderSize+ReservationSlotSize*len(v.Engines))
	le.PutUint64(b[0:], RouterMagic)
	le.PutUint32(b[8:], RouterLayoutVersion)
	le.PutUint16(b[12:], RouterValueHeaderSize)
	le.PutUint16(b[14:], ReservationSlotSize)
	le.PutUint32(b[16:], v.WriterPID)
	le.PutUint32(b[20:], v.HeartbeatPeriodUs)
	le.PutUint64(b[24:], v.State)
	le.PutUint64(b[32:], v.Generation)
	le.PutUint64(b[40:], v.HeartbeatSeq)
	le.PutUint64(b[48:], v.HeartbeatMonoNs)
	le.PutUint32(b[56:], v.TTLMs)
	le.PutUint32(b[60:], uint32(len(v.Engines)))
	for i, e := range v.Engines {
		slot := b[RouterValueHeaderSize+ReservationSlotSize*i:]
		copy(slot[:EngineIDFieldSize], e.EngineID)
		for j, w := range e.Reservations.Words() {
			le.PutUint64(slot[slotCountersOffset+8*j:], w)
		}
	}
	return b
}

// IsRetired: the writer closed (readers treat the replica as gone).
func (v *RouterValue) IsRetired() bool { return v.State == StateRetired }

// DecodeRouterValue parses the value of key. A value that is not a router
// value (no magic, sizes or a length its header does not explain) is a
// ForeignValue error, another layout version UnknownVersion, and a router
// value whose contents break the rules (a state neither ACTIVE nor RETIRED,
// more than MaxRouterEngines slots, an invalid or duplicate engine id,
// nonzero padding) CorruptRouter; each a *RouterError naming the key.
func DecodeRouterValue(key string, b []byte) (RouterValue, error) {
	le := binary.LittleEndian
	foreign := func(what string) error { return &RouterError{Class: ForeignValue, Name: key, What: what} }
	if len(b) < 16 || le.Uint64(b) != RouterMagic {
		return RouterValue{}, foreign(fmt.Sprintf("%d bytes without the ESROUTER magic", len(b)))
	}
	if v := le.Uint32(b[8:]); v != RouterLayoutVersion {
		return RouterValue{}, &RouterError{Class: UnknownVersion, Name: key, Found: v}
	}
	if len(b) < RouterValueHeaderSize || le.Uint16(b[12:]) != RouterValueHeaderSize ||
		le.Uint16(b[14:]) != ReservationSlotSize {
		return RouterValue{}, foreign(fmt.Sprintf("%d bytes with header size %d and slot size %d, expected at "+
			"least %d bytes, %d and %d", len(b), le.Uint16(b[12:]), le.Uint16(b[14:]), RouterValueHeaderSize,
			RouterValueHeaderSize, ReservationSlotSize))
	}
	count := int(le.Uint32(b[60:]))
	if count > MaxRouterEngines {
		return RouterValue{}, corruptRouter(key, fmt.Sprintf("count %d is more than MAX_ROUTER_ENGINES (%d)",
			count, MaxRouterEngines))
	}
	if expected := RouterValueHeaderSize + count*ReservationSlotSize; len(b) != expected {
		return RouterValue{}, foreign(fmt.Sprintf("%d bytes, but its count %d makes %d (%d + %d × %d)",
			len(b), count, expected, RouterValueHeaderSize, ReservationSlotSize, count))
	}
	state := le.Uint64(b[24:])
	if state != StateActive && state != StateRetired {
		return RouterValue{}, corruptRouter(key, fmt.Sprintf("state %d is neither 1 nor 2", state))
	}
	words := make([]uint64, count*slotWords)
	for i := range words {
		words[i] = le.Uint64(b[RouterValueHeaderSize+8*i:])
	}
	engines, err := decodeSlots(key, words, nil)
	if err != nil {
		return RouterValue{}, err
	}
	return RouterValue{
		WriterPID:         le.Uint32(b[16:]),
		HeartbeatPeriodUs: le.Uint32(b[20:]),
		State:             state,
		Generation:        le.Uint64(b[32:]),
		HeartbeatSeq:      le.Uint64(b[40:]),
		HeartbeatMonoNs:   le.Uint64(b[48:]),
		TTLMs:             le.Uint32(b[56:]),
		Engines:           engines,
	}, nil
}

// DecodeFetchedRouter is DecodeRouterValue of a GETRANGE key 0
// MaxRouterValueSize reply plus the expiry check of the key's PTTL: a value
// longer than the largest is ForeignValue; PTTL -1 (no expiry) or above the
// value's ttl_ms is NoExpiry (its age could not be told).
func DecodeFetchedRouter(key string, b []byte, pttlMs int64) (RouterValue, error) {
	if len(b) > MaxRouterValueSize {
		return RouterValue{}, &RouterError{Class: ForeignValue, Name: key, What: fmt.Sprintf(
			"a value larger than the largest router value (%d bytes)", MaxRouterValueSize)}
	}
	v, err := DecodeRouterValue(key, b)
	if err != nil {
		return RouterValue{}, err
	}
	if what := expiryProblem(pttlMs, v.TTLMs, "value"); what != "" {
		return RouterValue{}, &RouterError{Class: NoExpiry, Name: key, What: what}
	}
	return v, nil
}

// HeartbeatAgeAtFetch is the time from the value's write to the fetch that
// returned it with pttlMs (ttl_ms - PTTL, by the server's clock: the writer
// stamps its heartbeat as it sends the value).
func (v *RouterValue) HeartbeatAgeAtFetch(pttlMs int64) time.Duration {
	return sinceWrite(v.TTLMs, pttlMs)
}

// ReplicaAtFetch judges one fetch of a replica's key (the GETRANGE key 0
// MaxRouterValueSize reply and the PTTL reply) by the engines' rule: PTTL
// -2 (no such key: expired on the server's clock, or deleted by its
// writer's close) is a dead replica with no reservations; a value is aged
// by HeartbeatAgeAtFetch (whether the writer lives cannot be known from
// here). A polling caller should keep the instant of a heartbeat from the
// first fetch that showed its (Generation, HeartbeatSeq) and age it on its
// own clock, as for engine records.
func ReplicaAtFetch(replicaID, key string, value []byte, pttlMs int64, f Freshness, readMonoNs uint64) (ReplicaState, error) {
	if pttlMs == -2 {
		return ReplicaState{ReplicaID: replicaID, Status: Dead, HeartbeatAge: f.StaleAfter,
			ReadMonoNs: readMonoNs}, nil
	}
	v, err := DecodeFetchedRouter(key, value, pttlMs)
	if err != nil {
		return ReplicaState{}, err
	}
	heartbeatAge := v.HeartbeatAgeAtFetch(pttlMs)
	return ReplicaState{
		ReplicaID:    replicaID,
		Status:       replicaStatus(f, false, v.IsRetired(), Unknown, heartbeatAge, false),
		HeartbeatAge: heartbeatAge,
		Generation:   v.Generation,
		ReadMonoNs:   readMonoNs,
		WriterPID:    v.WriterPID,
		Engines:      v.Engines,
	}, nil
}
