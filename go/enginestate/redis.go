package enginestate

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Redis: the key schema and the record of docs/FORMAT.md ("Redis"). The
// caller fetches with its own client, in one round trip per read:
//
//	SMEMBERS <prefix>engines                  (the engine ids; at most every rescan interval)
//	GETRANGE <prefix>engine:<id> 0 192        (per id: the record, at most one byte more)
//	PTTL <prefix>engine:<id>
//
// and hands each value and PTTL to StateAtFetch.

const (
	// DefaultPrefix is the key prefix when the URI has none.
	DefaultPrefix = "engine_state:"
	// RecordHeaderSize is the bytes before the snapshot.
	RecordHeaderSize = 64
	// RecordSize is the bytes of a whole record.
	RecordSize = RecordHeaderSize + PayloadSize
)

// RegistryKey is the key of the set of engine ids.
func RegistryKey(prefix string) string { return prefix + "engines" }

// EngineKey is the key of one engine's record.
func EngineKey(prefix, engineID string) string { return prefix + "engine:" + engineID }

// Record is one engine's value in Redis.
type Record struct {
	WriterPID       uint32 // on the writer's host
	PublishPeriodUs uint32
	State           uint64 // StateActive or StateRetired
	Generation      uint64 // differs between two runs of the same engine id
	HeartbeatSeq    uint64 // +1 on every publish and heartbeat
	HeartbeatMonoNs uint64 // CLOCK_MONOTONIC of the writer's host
	TTLMs           uint32 // the PX the key was written with
	WriteDelayUs    uint32 // heartbeat stamp -> SET, on the writer's clock
	Snapshot        Snapshot
}

// IsRetired: the writer closed (readers report the engine dead).
func (r *Record) IsRetired() bool { return r.State == StateRetired }

// Encode is the record's bytes (what a writer SETs).
func (r *Record) Encode() []byte {
	b := make([]byte, RecordSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:], Magic)
	le.PutUint32(b[8:], LayoutVersion)
	le.PutUint16(b[12:], RecordHeaderSize)
	le.PutUint16(b[14:], PayloadSize)
	le.PutUint32(b[16:], r.WriterPID)
	le.PutUint32(b[20:], r.PublishPeriodUs)
	le.PutUint64(b[24:], r.State)
	le.PutUint64(b[32:], r.Generation)
	le.PutUint64(b[40:], r.HeartbeatSeq)
	le.PutUint64(b[48:], r.HeartbeatMonoNs)
	le.PutUint32(b[56:], r.TTLMs)
	le.PutUint32(b[60:], r.WriteDelayUs)
	words := r.Snapshot.Words()
	for i, w := range words {
		le.PutUint64(b[RecordHeaderSize+8*i:], w)
	}
	return b
}

// DecodeRecord parses the value of key. A value that is not a version-1
// record is a ForeignValue error, another layout version an UnknownVersion
// error, each naming the key and what to do.
func DecodeRecord(key string, b []byte) (Record, error) {
	le := binary.LittleEndian
	foreign := func(what string) error { return &Error{Class: ForeignValue, Name: key, What: what} }
	if len(b) < 16 || le.Uint64(b) != Magic {
		return Record{}, foreign(fmt.Sprintf("%d bytes without the ENGSTATE magic", len(b)))
	}
	if version := le.Uint32(b[8:]); version != LayoutVersion {
		return Record{}, &Error{Class: UnknownVersion, Name: key, Found: version, Supported: LayoutVersion, What: "redis"}
	}
	if len(b) != RecordSize || le.Uint16(b[12:]) != RecordHeaderSize || le.Uint16(b[14:]) != PayloadSize {
		return Record{}, foreign(fmt.Sprintf("%d bytes with header size %d and payload size %d, expected %d, %d and %d",
			len(b), le.Uint16(b[12:]), le.Uint16(b[14:]), RecordSize, RecordHeaderSize, PayloadSize))
	}
	state := le.Uint64(b[24:])
	if state != StateActive && state != StateRetired {
		return Record{}, foreign(fmt.Sprintf("state %d is neither 1 nor 2", state))
	}
	var words [SnapshotWords]uint64
	for i := range words {
		words[i] = le.Uint64(b[RecordHeaderSize+8*i:])
	}
	return Record{
		WriterPID:       le.Uint32(b[16:]),
		PublishPeriodUs: le.Uint32(b[20:]),
		State:           state,
		Generation:      le.Uint64(b[32:]),
		HeartbeatSeq:    le.Uint64(b[40:]),
		HeartbeatMonoNs: le.Uint64(b[48:]),
		TTLMs:           le.Uint32(b[56:]),
		WriteDelayUs:    le.Uint32(b[60:]),
		Snapshot:        SnapshotFromWords(&words),
	}, nil
}

// DecodeFetched is DecodeRecord plus the expiry check: a record's age is
// ttl_ms - PTTL, which only holds for a key written with SET ... PX ttl_ms.
// PTTL -1 (no expiry) or above the record's ttl_ms is a NoExpiry error: the
// record must not read as "written just now" forever.
func DecodeFetched(key string, b []byte, pttlMs int64) (Record, error) {
	r, err := DecodeRecord(key, b)
	if err != nil {
		return Record{}, err
	}
	if what := expiryProblem(pttlMs, r.TTLMs, "record"); what != "" {
		return Record{}, &Error{Class: NoExpiry, Name: key, What: what}
	}
	return r, nil
}

// expiryProblem is what is wrong with a key's expiry (its PTTL reply
// pttlMs) for a value of kind (a "record", a router "value") written with
// PX ttlMs, or "" when nothing is: no expiry, or one longer than the PX
// (the value must not read as "written just now" forever).
func expiryProblem(pttlMs int64, ttlMs uint32, kind string) string {
	switch {
	case pttlMs < 0:
		return "the key has no expiry (PTTL -1; PERSISTed, copied or written without PX)"
	case uint64(pttlMs) > uint64(ttlMs):
		return fmt.Sprintf("the key expires in %d ms but its %s says it was written with PX %d "+
			"(re-expired or written by hand)", pttlMs, kind, ttlMs)
	}
	return ""
}

// HeartbeatAgeAtFetch is the time from the record's heartbeat to the fetch
// that returned it with pttlMs: (ttl_ms - PTTL) by the server's clock plus
// write_delay_us by the writer's; never a difference of two hosts' clocks.
func (r *Record) HeartbeatAgeAtFetch(pttlMs int64) time.Duration {
	return sinceWrite(r.TTLMs, pttlMs) + time.Duration(r.WriteDelayUs)*time.Microsecond
}

// sinceWrite is ttl_ms - PTTL (never below 0; a negative PTTL counts as 0):
// the time since a key written with SET ... PX ttlMs was written, by the
// server's clock.
func sinceWrite(ttlMs uint32, pttlMs int64) time.Duration {
	if pttlMs < 0 {
		pttlMs = 0
	}
	if uint64(ttlMs) <= uint64(pttlMs) {
		return 0
	}
	return time.Duration(uint64(ttlMs)-uint64(pttlMs)) * time.Millisecond
}

// RecordState is the state of an engine whose latest record is r (nil: none
// was read) and whose heartbeat is heartbeatAge old now; expired: its key
// no longer exists (the writer is gone). The capture age is the heartbeat
// age plus heartbeat_mono_ns - captured_mono_ns (two stamps of the writer's
// clock). A polling caller should keep the instant of a heartbeat from the
// first fetch that showed its (Generation, HeartbeatSeq), and age it on its
// own clock, so that a record rewritten without a new heartbeat turns stale.
func RecordState(engineID string, r *Record, heartbeatAge time.Duration, expired bool, f Freshness, readMonoNs uint64) EngineState {
	var snapshot Snapshot
	captureAge := heartbeatAge
	var generation uint64
	retired := false
	if r != nil {
		snapshot = r.Snapshot
		captureAge += age(r.HeartbeatMonoNs, snapshot.CapturedMonoNs)
		generation = r.Generation
		retired = r.IsRetired()
	}
	writer := Unknown // while the key exists, whether the writer lives cannot be known from here
	if expired {
		writer = Gone // the key expired on the server's clock
	}
	return EngineState{
		EngineID: engineID,
		Status: f.Classify(Observation{
			Retired:      retired,
			Writer:       writer,
			HeartbeatAge: heartbeatAge,
			CaptureAge:   captureAge,
			Idle:         snapshot.IsIdle(),
		}),
		Snapshot:     snapshot,
		HeartbeatAge: heartbeatAge,
		CaptureAge:   captureAge,
		Generation:   generation,
		ReadMonoNs:   readMonoNs,
	}
}

// StateAtFetch judges one fetch of an engine's key: value is the GETRANGE
// (or GET) reply, pttlMs the PTTL reply. PTTL -2 (no such key: it expired
// on the server's clock) is a dead engine with no snapshot. readMonoNs is
// stamped into the state (the caller's clock; 0 if unused).
func StateAtFetch(engineID, key string, value []byte, pttlMs int64, f Freshness, readMonoNs uint64) (EngineState, error) {
	if pttlMs == -2 {
		return RecordState(engineID, nil, f.StaleAfter, true, f, readMonoNs), nil
	}
	if len(value) > RecordSize {
		return EngineState{}, &Error{Class: ForeignValue, Name: key, What: fmt.Sprintf(
			"a value larger than a %d-byte record", RecordSize)}
	}
	r, err := DecodeFetched(key, value, pttlMs)
	if err != nil {
		return EngineState{}, err
	}
	return RecordState(engineID, &r, r.HeartbeatAgeAtFetch(pttlMs), false, f, readMonoNs), nil
}
