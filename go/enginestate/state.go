package enginestate

import "time"

// EngineState is one engine's state as a reader saw it.
type EngineState struct {
	// EngineID is the file name (or Redis key suffix).
	EngineID string
	// Status says whether the state may be used.
	Status Status
	// Snapshot is all zero when the engine is Torn.
	Snapshot Snapshot
	// HeartbeatAge is the time since the writer's last heartbeat.
	HeartbeatAge time.Duration
	// CaptureAge is the time since the snapshot was captured.
	CaptureAge time.Duration
	// Generation of the writer's file or record (a restart makes a new one).
	Generation uint64
	// ReadMonoNs is CLOCK_MONOTONIC when the ages were measured: a consumer
	// that uses the state later ages it from here.
	ReadMonoNs uint64
	// Cache is the engine's cache digest, which 512-token prefix blocks it
	// holds (docs/FORMAT.md, "Cache residency"): set by a Dir with
	// Options.CacheDigests while the engine is Fresh, publishes a digest, and
	// its digest is usable (ACTIVE, of the engine's generation); else nil.
	// Shared between reads until its version moves: do not modify it. Its
	// hit for a prompt: Cache.LeadingBlocks(BlockHashes(tokens)).
	Cache *CacheDigest
}

// GPUKVUsedFrac is 1 - free/total; ok is false when no blocks were reported.
func (e *EngineState) GPUKVUsedFrac() (float64, bool) { return e.Snapshot.GPUKVUsedFrac() }

// IsFresh: only fresh state may enter the max(shadow, real) merge.
func (e *EngineState) IsFresh() bool { return e.Status == Fresh }

// EngineError is one engine (or directory entry, or Redis key) that could not
// be read; the other engines are unaffected.
type EngineError struct {
	// Name is the engine id, file name or key it concerns.
	Name string
	// Err is an *Error: its Class says what kind of bad input it is.
	Err error
}

func (e EngineError) Error() string { return e.Err.Error() }

// Unwrap gives the *Error.
func (e EngineError) Unwrap() error { return e.Err }

// Reading is everything one read produced: the engines, sorted by id, and
// the per-engine errors.
type Reading struct {
	Engines []EngineState
	Errors  []EngineError
}

// Get is the engine with this id, if it was read.
func (r *Reading) Get(engineID string) (*EngineState, bool) {
	lo, hi := 0, len(r.Engines)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.Engines[mid].EngineID < engineID {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(r.Engines) && r.Engines[lo].EngineID == engineID {
		return &r.Engines[lo], true
	}
	return nil, false
}

func (r *Reading) clear() {
	r.Engines = r.Engines[:0]
	r.Errors = r.Errors[:0]
}
