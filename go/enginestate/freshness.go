package enginestate

import "time"

// The staleness rule of docs/FORMAT.md ("Liveness and staleness"), the one
// place this package decides a status. It mirrors reader/src/freshness.rs.

// Default thresholds.
const (
	DefaultStaleAfter    = 2 * time.Second
	DefaultMaxCaptureAge = 30 * time.Second
)

// ClockAheadSlack is what a writer's stamp may be ahead of a reader's now
// beyond one period (MaxAhead): a reader reads its clock once per read and
// loads the stamps after it, so a writer that stamps meanwhile is ahead by
// up to the read's length (a scan of many engines, a listing, a preempted
// reader). The Rust reader's CLOCK_AHEAD_SLACK.
const ClockAheadSlack = time.Second

// MaxAhead is the most a stamp of a writer with this publish period may be
// ahead of a reader's now: one period, counted as at most ClockAheadSlack
// (the header can be forged), plus ClockAheadSlack. A stamp further ahead
// has no age that can be told: the engine is never fresh (ClockAhead).
func MaxAhead(period time.Duration) time.Duration {
	if period > ClockAheadSlack {
		period = ClockAheadSlack
	}
	if period < 0 {
		period = 0
	}
	return period + ClockAheadSlack
}

// Status says whether an engine's state may be used.
type Status uint8

const (
	// Fresh: alive and recent; may enter the max(shadow, real) merge.
	Fresh Status = iota
	// Stale: heartbeat or capture too old, or a stamp too far ahead of the
	// reader's clock (also a ClockAhead error of the read).
	Stale
	// Dead: the writer is gone, or the file (record) is retired.
	Dead
	// Torn: no consistent copy within the seqlock's retry bound, or the
	// file was truncated under the mapping.
	Torn
)

// String is the lowercase name used in JSON, tables and metrics.
func (s Status) String() string {
	switch s {
	case Fresh:
		return "fresh"
	case Stale:
		return "stale"
	case Dead:
		return "dead"
	case Torn:
		return "torn"
	}
	return "unknown"
}

// Liveness is what a reader knows about the writer process.
type Liveness int8

const (
	// Unknown: another pid namespace or host; the heartbeat alone decides.
	Unknown Liveness = iota
	// Alive: the writer process exists.
	Alive
	// Gone: the writer process is known to be gone.
	Gone
)

// Observation is what a reader observed about one engine.
type Observation struct {
	Torn         bool
	Retired      bool
	Writer       Liveness
	HeartbeatAge time.Duration
	CaptureAge   time.Duration
	Idle         bool
	// ClockAhead: a stamp is more than MaxAhead ahead of the reader's clock.
	ClockAhead bool
}

// Freshness holds the thresholds of the staleness rule.
type Freshness struct {
	// StaleAfter: a heartbeat older than this makes the engine stale.
	StaleAfter time.Duration
	// MaxCaptureAge: a capture older than this makes a busy engine stale.
	MaxCaptureAge time.Duration
}

// DefaultFreshness is the rule with its default thresholds (2 s, 30 s).
func DefaultFreshness() Freshness {
	return Freshness{StaleAfter: DefaultStaleAfter, MaxCaptureAge: DefaultMaxCaptureAge}
}

// Classify is the status of an engine given what was observed; the first
// match wins: torn, dead, stale (a stamp ahead of the clock included),
// fresh. Both bounds are inclusive.
func (f Freshness) Classify(o Observation) Status {
	switch {
	case o.Torn:
		return Torn
	case o.Retired || o.Writer == Gone:
		return Dead
	case o.ClockAhead || o.HeartbeatAge > f.StaleAfter || (o.CaptureAge > f.MaxCaptureAge && !o.Idle):
		return Stale
	}
	return Fresh
}

// age is now - then in nanoseconds, floored at 0 (and capped at the largest
// Duration, which no real age reaches).
func age(now, then uint64) time.Duration {
	if then >= now {
		return 0
	}
	d := now - then
	if d > 1<<63-1 {
		return 1<<63 - 1
	}
	return time.Duration(d)
}

// Stamp names one of a writer's two stamps by its docs/FORMAT.md field.
type Stamp string

const (
	HeartbeatStamp Stamp = "heartbeat_mono_ns"
	CaptureStamp   Stamp = "captured_mono_ns"
)

// ahead is which stamp, if any, is more than maxAhead ns ahead of now (the
// heartbeat's when both are), and by how much.
func ahead(now, heartbeat, captured, maxAhead uint64) (Stamp, uint64) {
	switch {
	case heartbeat > now && heartbeat-now > maxAhead:
		return HeartbeatStamp, heartbeat - now
	case captured > now && captured-now > maxAhead:
		return CaptureStamp, captured - now
	}
	return "", 0
}
