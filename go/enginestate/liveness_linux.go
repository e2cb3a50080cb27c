package enginestate

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// writerAlive: whether the writer process still exists, when that can be
// known: only in the writer's own pid namespace (engines and routers often
// run in separate containers that share /dev/shm; there the heartbeat
// alone decides), and only for a pid a process can have (docs/FORMAT.md,
// "Liveness and staleness"; the Rust reader's reader/src/liveness.rs).
//
// heartbeatLate: the writer's heartbeat is late, so it may be a zombie (a
// killed writer its parent has not reaped yet still answers kill): then
// /proc/<pid>/stat is read too, and a zombie is gone. A writer whose
// heartbeat is on time costs one system call (this runs for every engine
// at every listing).
func writerAlive(h *Header, heartbeatLate bool) Liveness {
	ns := pidNamespace()
	if h.WriterPIDNs == 0 || h.WriterPIDNs != ns || h.WriterPID == 0 || h.WriterPID > 1<<31-1 {
		return Unknown
	}
	switch err := syscall.Kill(int(h.WriterPID), 0); err {
	case nil, syscall.EPERM:
		if heartbeatLate && isZombie(int(h.WriterPID)) {
			return Gone
		}
		return Alive
	case syscall.ESRCH:
		return Gone
	}
	return Unknown
}

// isZombie: /proc/<pid>/stat says the process exited and waits to be
// reaped (state Z, or X while being reaped). False when that cannot be read
// (/proc mounted with hidepid, or a /proc of another pid namespace, where
// <pid> names another process): kill's answer stands.
func isZombie(pid int) bool {
	if !procIsOurs() {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	state := statState(stat)
	return state == 'Z' || state == 'X'
}

var (
	procOnce sync.Once
	procOurs bool
)

// procIsOurs: /proc numbers processes as this process's pid namespace does
// (its "self" is our pid), checked once.
func procIsOurs() bool {
	procOnce.Do(func() {
		link, err := os.Readlink("/proc/self")
		procOurs = err == nil && link == strconv.Itoa(os.Getpid())
	})
	return procOurs
}

// statState is the state letter of a /proc/<pid>/stat line, "<pid> (<comm>)
// <state> …": the first non-blank byte after the LAST ')', since the
// command name may itself hold ')' and spaces. 0 when there is none.
func statState(stat []byte) byte {
	close := bytes.LastIndexByte(stat, ')')
	if close < 0 {
		return 0
	}
	rest := bytes.TrimLeft(stat[close+1:], " \t\n")
	if len(rest) == 0 {
		return 0
	}
	return rest[0]
}
