package enginestate

import (
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// Class says what kind of bad input an error is about; the classes of the
// golden vectors (format/vectors/README.md) plus IO.
type Class string

const (
	// NotEngineState: a file whose first 8 bytes are not "ENGSTATE".
	NotEngineState Class = "not_engine_state"
	// UnknownVersion: a layout version this package does not read.
	UnknownVersion Class = "unknown_version"
	// WrongSize: a file that is not 4096 bytes.
	WrongSize Class = "wrong_size"
	// CorruptHeader: header or payload size, state, or engine id wrong.
	CorruptHeader Class = "corrupt_header"
	// RefusedEntry: a symbolic link, FIFO, socket, device or directory in
	// the engine directory, or a name that is not UTF-8.
	RefusedEntry Class = "refused_entry"
	// ForeignValue: a Redis value that is not a version-1 record.
	ForeignValue Class = "foreign_value"
	// NoExpiry: a Redis record whose key's expiry does not match its ttl_ms.
	NoExpiry Class = "no_expiry"
	// ClockAhead: an engine whose stamp is too far ahead of the reader's
	// clock to tell its age; the engine is also read, stale.
	ClockAhead Class = "clock_ahead"
	// IO: a system call failed (permission denied, ...).
	IO Class = "io"

	// The classes of a cache digest (docs/FORMAT.md, "Cache residency"),
	// besides UnknownVersion, WrongSize and RefusedEntry.

	// NotDigest: a digest file or value whose first 8 bytes are not "ESDIGEST".
	NotDigest Class = "not_digest"
	// CorruptCache: a digest whose header or contents break the format's
	// rules; as the class of an *Error, an engine's digest that is damaged
	// (no usable digest: refused, of another layout version, not a regular
	// file, unreadable), reported at every read while the snapshot names its
	// version. The engine's state is still read.
	CorruptCache Class = "corrupt_cache"
	// MissingCache: the class of an *Error about an engine whose snapshot
	// (record) names a cache digest that is not there for it: no digest
	// file or Redis value (yet), one of another run of the engine
	// (generation), or one older than the version named. A writer between
	// writes or a restarted engine, not damage: reported once per version.
	// The engine's state is still read.
	MissingCache Class = "missing_cache"
	// TornDigest: no consistent copy of a digest file within the seqlock's
	// retry bound, or sequence 0; read it again later.
	TornDigest Class = "torn"
)

// Error is every error of this package about a file, a directory or a Redis
// key. The message says what to do next.
type Error struct {
	Class Class
	// Name is the path or the Redis key.
	Name string
	// Found and Supported are the versions of an UnknownVersion error.
	Found, Supported uint32
	// Size is the file's size for WrongSize.
	Size int64
	// Stamp, Ahead and Limit describe a ClockAhead error: which stamp, how
	// far ahead of the reader's clock, and the bound (MaxAhead).
	Stamp        Stamp
	Ahead, Limit time.Duration
	// What details the problem (CorruptHeader, RefusedEntry, ForeignValue,
	// NoExpiry) or names the action that failed (IO).
	What string
	// Err is the OS error of an IO error, or the cause of a CorruptCache
	// error (the *DigestError of a refused digest, the *Error of a file
	// that could not be opened).
	Err error
	// Damaged: a cache digest error about a digest that is no usable digest
	// (class CorruptCache, reported at every read while the snapshot names
	// its version); false: none is there yet for that version (class
	// MissingCache: missing, of another generation, older than named;
	// reported once).
	Damaged bool
}

func (e *Error) Error() string {
	redis := e.Class == ForeignValue || e.Class == NoExpiry || (e.Class == UnknownVersion && e.What == "redis")
	switch {
	case e.Class == NotEngineState:
		return fmt.Sprintf("%s is not an engine-state file (bad magic); remove it from the engine-state directory", e.Name)
	case e.Class == UnknownVersion && redis:
		return fmt.Sprintf("Redis key %q has layout version %d, but this build reads version %d; upgrade "+
			"engine-state on this side (or downgrade the writer) so both use the same layout", e.Name, e.Found, e.Supported)
	case e.Class == UnknownVersion:
		return fmt.Sprintf("%s has layout version %d, but this build reads version %d; upgrade engine-state "+
			"on this side (or downgrade the writer) so both use the same layout", e.Name, e.Found, e.Supported)
	case e.Class == WrongSize:
		return fmt.Sprintf("%s is %d bytes, but an engine-state file is %d bytes (truncated, or not an "+
			"engine-state file); remove it (a restarted publisher creates a new one)", e.Name, e.Size, FileSize)
	case e.Class == CorruptHeader:
		return fmt.Sprintf("%s has a corrupt header (%s); remove it (a restarted publisher creates a new one)", e.Name, e.What)
	case e.Class == RefusedEntry:
		return fmt.Sprintf("%s: %s; engine-state opens only regular files named after an engine id, and "+
			"never follows links: remove it from the engine-state directory", e.What, e.Name)
	case e.Class == ClockAhead:
		return fmt.Sprintf("%s: its %s is %d ms ahead of this reader's CLOCK_MONOTONIC, more than the %d ms a "+
			"writer's stamp can be (one publish period plus 1 s), so its age cannot be told and it reads stale; "+
			"the writer runs under another clock (a container in its own time namespace) or the file was written "+
			"by hand: run the engine in this host's time namespace, or remove the file",
			e.Name, e.Stamp, e.Ahead.Milliseconds(), e.Limit.Milliseconds())
	case e.Class == ForeignValue:
		return fmt.Sprintf("Redis key %q does not hold an engine-state record (%s); delete it, or give this "+
			"fleet its own key prefix (?prefix=... in the URI)", e.Name, e.What)
	case e.Class == NoExpiry:
		return fmt.Sprintf("Redis key %q holds an engine-state record whose age cannot be told: %s; it is not "+
			"used. Delete the key (engine-state writers always SET it with PX ttl_ms, and a live writer writes "+
			"it again within a period)", e.Name, e.What)
	case e.Class == CorruptCache:
		return fmt.Sprintf("%s: this engine's cache digest cannot be used (%s); its state is read without it "+
			"(Cache nil). It is read again when the engine publishes its next digest; if this persists, restart "+
			"that engine's publisher (it rewrites its digest), remove the digest so it is recreated, or turn "+
			"digests off in this reader (Options.CacheDigests)", e.Name, e.What)
	case e.Class == MissingCache:
		return fmt.Sprintf("%s: this engine's snapshot names a cache digest that is not there for it (%s); its "+
			"state is read without it (Cache nil). A restarted engine or one between writes puts it in place "+
			"shortly, and the next version named is read again; if this persists, check that the engine's "+
			"publisher still writes its digest (on Redis: that this reader may read the <prefix>cache:* keys)",
			e.Name, e.What)
	}
	return fmt.Sprintf("could not %s %s: %v%s", e.What, e.Name, e.Err, ioHint(e))
}

// Unwrap gives the OS error of an IO error.
func (e *Error) Unwrap() error { return e.Err }

// Actions of IO errors that have a hint.
const (
	actionOpenForReading = "open for reading"
	actionReadDirectory  = "read directory"
)

func ioHint(e *Error) string {
	switch {
	case errors.Is(e.Err, fs.ErrNotExist) && e.What == actionReadDirectory:
		return "; create it, or point AGENTIC_ENGINE_STATE_URI / --uri at the directory the engines publish into"
	case errors.Is(e.Err, fs.ErrNotExist):
		return "; check the path (AGENTIC_ENGINE_STATE_URI / --uri)"
	case errors.Is(e.Err, fs.ErrPermission) && e.What == actionOpenForReading:
		return "; a reader needs read access to the engine files: run it as a user that may read them, or " +
			"have the publishers create them readable by others (AGENTIC_ENGINE_STATE_FILE_MODE=644)"
	case errors.Is(e.Err, fs.ErrPermission):
		return "; run as a user that may read it, or choose another directory (AGENTIC_ENGINE_STATE_URI / --uri)"
	}
	return ""
}

// DigestError is what is wrong with one cache digest file or Redis value
// (docs/FORMAT.md, "Cache residency", validation steps 2 to 9); its Class is
// the golden vectors' class: NotDigest, UnknownVersion, WrongSize,
// CorruptCache or TornDigest.
type DigestError struct {
	Class Class
	// Name is the digest's path or Redis key.
	Name string
	// Found is the version of an UnknownVersion error (this package reads
	// DigestLayoutVersion).
	Found uint32
	// Size and Expected are the size and the size the header implies
	// (WrongSize).
	Size, Expected int64
	// LastSeq is the last sequence a TornDigest read saw.
	LastSeq uint64
	// What details a CorruptCache error.
	What string
}

func (e *DigestError) Error() string { return e.Name + ": " + e.reason() }

// reason is the message without the name.
func (e *DigestError) reason() string {
	switch e.Class {
	case NotDigest:
		return "not a cache digest (bad magic); remove it from the cache directory"
	case UnknownVersion:
		return fmt.Sprintf("digest layout version %d, but this build reads version %d; upgrade engine-state on "+
			"this side (or downgrade the writer) so both use the same layout", e.Found, DigestLayoutVersion)
	case WrongSize:
		return fmt.Sprintf("%d bytes, but its header says %d (truncated, or not a cache digest); remove it "+
			"(a restarted publisher creates a new one)", e.Size, e.Expected)
	case TornDigest:
		return fmt.Sprintf("cache digest torn (a write was in progress, sequence %d); read it again later", e.LastSeq)
	}
	return fmt.Sprintf("corrupt cache digest (%s); remove it (a restarted publisher creates a new one)", e.What)
}

func corruptDigest(name, what string) error {
	return &DigestError{Class: CorruptCache, Name: name, What: what}
}
