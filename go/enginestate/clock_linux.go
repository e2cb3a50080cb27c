package enginestate

import (
	_ "unsafe" // for go:linkname
)

// nanotime is the Go runtime's monotonic clock: on Linux,
// clock_gettime(CLOCK_MONOTONIC) through the vDSO — the clock writers stamp
// heartbeat_mono_ns and captured_mono_ns with (FORMAT.md). The standard
// library exposes it only relative to a time.Time; the alternatives are a
// real clock_gettime system call per read (several times the cost of a
// whole engine read) or a calibrated offset to time.Now (an error of the
// calibration's duration, and time.Now reads two clocks). runtime.nanotime
// is a long-standing link target that Go keeps linkable for this use; a
// test checks it against the clock_gettime system call.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// MonotonicNs is CLOCK_MONOTONIC in nanoseconds: the clock of the ages.
func MonotonicNs() uint64 { return uint64(nanotime()) }
