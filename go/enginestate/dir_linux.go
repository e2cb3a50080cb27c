package enginestate

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// Options are a Dir's settings.
type Options struct {
	// Freshness holds the staleness thresholds.
	Freshness Freshness
	// RescanInterval: how often the directory is listed again to find new,
	// removed and replaced engines (default 250 ms).
	RescanInterval time.Duration
	// CacheDigests: read each engine's cache digest (docs/FORMAT.md, "Cache
	// residency") into EngineState.Cache (default off: a reader that does
	// not route by cache pays nothing for it). See Dir.
	CacheDigests bool
}

// DefaultOptions are the Rust reader's defaults.
func DefaultOptions() Options {
	return Options{Freshness: DefaultFreshness(), RescanInterval: 250 * time.Millisecond}
}

const (
	// pidCheckInterval: least time between two pid checks of one writer.
	pidCheckInterval = 10 * time.Millisecond
	// zombieCheckInterval: least time between two /proc lookups (is it a
	// zombie?) of one writer whose heartbeat is late: three system calls,
	// so not at every pid check (the Rust reader's ZOMBIE_CHECK_INTERVAL_NS).
	zombieCheckInterval = 100 * time.Millisecond
	// reopenBackoff: how long a retired mapping waits before the path is
	// looked at again for a replacement.
	reopenBackoff = 20 * time.Millisecond
)

// Dir is every engine file in one directory, mapped read-only (the
// shared-memory source of docs/FORMAT.md, "Reading a directory").
//
// The directory is listed at most every RescanInterval (the listing's inode
// per name tells new, removed and replaced files apart without a stat per
// file); between listings a read touches only the mappings: per engine
// three loads plus the seqlock read, no system call. A retired file is
// looked at again at once (at most every 20 ms), so a restarted engine's
// new file is picked up without waiting for the listing. A file truncated
// under its mapping reads torn until the next listing, which opens it again
// and reports it in Reading.Errors. Not safe for concurrent use.
//
// With Options.CacheDigests each read also hands out the engine's cache
// digest (EngineState.Cache) while the engine is Fresh: the file
// <dir>.cache/<id> (CacheDir) is mapped at the first snapshot that names a
// digest, read again only when the snapshot's cache_version moves past the
// version held (a compare per engine otherwise), and opened again when its
// writer replaced it (retired it), or it is of another generation. A digest
// that cannot be used is that engine's error (the engine's state is still
// read, with Cache nil): a damaged one (class CorruptCache) at every read
// while the snapshot names it; one not there for the snapshot (class
// MissingCache: no file, of another generation, older than named) once per
// version. A torn digest read is no error: it is read again once its
// sequence word changes.
type Dir struct {
	path     string
	opts     Options
	engines  []*entry
	bad      []badEntry
	lastScan uint64 // MonotonicNs of the last listing; 0 never
}

type entry struct {
	id     string
	file   *File
	cache  cacheSlot
	writer Liveness
	// lateAfter: a heartbeat older than this makes the reader check the pid.
	lateAfter time.Duration
	// maxAhead: a stamp further ahead of the reader's clock (ns) is not
	// believed (MaxAhead of the file's period).
	maxAhead uint64
	// aheadStamp, aheadBy: what the last read found too far ahead, if any.
	aheadStamp   Stamp
	aheadBy      uint64
	nextPidCheck uint64
	// nextZombieCheck: a late writer is not looked up in /proc before this.
	nextZombieCheck uint64
	nextReopen      uint64
}

type badEntry struct {
	inode uint64
	err   EngineError
}

// OpenDir opens dir and maps every engine file in it. An error here means
// the directory itself cannot be listed; a bad file is a per-engine error
// in Reading.Errors.
func OpenDir(dir string, opts Options) (*Dir, error) {
	if !hostLittleEndian {
		return nil, errors.New("engine-state layout version 1 stores little-endian words; big-endian hosts are not supported")
	}
	d := &Dir{path: dir, opts: opts}
	if err := d.Rescan(); err != nil {
		return nil, err
	}
	return d, nil
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// Close unmaps every file. The Dir must not be used afterwards.
func (d *Dir) Close() error {
	for _, e := range d.engines {
		e.close()
	}
	d.engines = nil
	return nil
}

// Read reads every engine now.
func (d *Dir) Read() (Reading, error) {
	var r Reading
	err := d.ReadInto(&r)
	return r, err
}

// ReadInto reads every engine into out (emptied first, its slices reused:
// no allocation per read once they are large enough).
func (d *Dir) ReadInto(out *Reading) error {
	return d.ReadAt(out, MonotonicNs())
}

// ReadAt is ReadInto with the ages measured from nowMonoNs (CLOCK_MONOTONIC).
func (d *Dir) ReadAt(out *Reading, nowMonoNs uint64) error {
	out.clear()
	if err := d.rescanIfDue(nowMonoNs); err != nil {
		return err
	}
	for _, e := range d.engines {
		out.Engines = append(out.Engines, EngineState{})
		state := &out.Engines[len(out.Engines)-1]
		e.read(d.path, nowMonoNs, &d.opts, state)
		if e.aheadStamp != "" {
			out.Errors = append(out.Errors, e.clockAheadError(d.path))
		}
		if d.opts.CacheDigests {
			if err := e.cache.error(state.Snapshot.CacheVersion); err != nil {
				out.Errors = append(out.Errors, EngineError{e.id, err})
			}
		}
	}
	for _, b := range d.bad {
		out.Errors = append(out.Errors, b.err)
	}
	return nil
}

// ReadEngine reads one engine by id into out (no listing unless one is
// due); false when there is no such engine.
func (d *Dir) ReadEngine(engineID string, out *EngineState) bool {
	now := MonotonicNs()
	if d.rescanIfDue(now) != nil {
		return false
	}
	lo, hi := 0, len(d.engines)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if d.engines[mid].id < engineID {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(d.engines) || d.engines[lo].id != engineID {
		return false
	}
	d.engines[lo].read(d.path, now, &d.opts, out)
	return true
}

// Header is the header of an engine's file as it was at open.
func (d *Dir) Header(engineID string) (Header, bool) {
	for _, e := range d.engines {
		if e.id == engineID {
			return e.file.Header(), true
		}
	}
	return Header{}, false
}

func (d *Dir) rescanIfDue(now uint64) error {
	if d.lastScan == 0 || (now > d.lastScan && time.Duration(now-d.lastScan) >= d.opts.RescanInterval) {
		return d.Rescan()
	}
	return nil
}

// Rescan lists the directory now: maps new files, drops removed ones,
// remaps replaced ones (and ones truncated under their mapping), and
// rechecks whether writers are alive.
func (d *Dir) Rescan() error {
	listing, err := readDir(d.path)
	if err != nil {
		return err
	}
	oldEngines := make(map[string]*entry, len(d.engines))
	for _, e := range d.engines {
		oldEngines[e.id] = e
	}
	oldBad := make(map[string]badEntry, len(d.bad))
	for _, b := range d.bad {
		oldBad[b.err.Name] = b
	}
	engines := make([]*entry, 0, len(d.engines))
	var bad []badEntry
	for _, de := range listing {
		path := filepath.Join(d.path, de.name)
		if !utf8.ValidString(de.name) {
			// Never an engine id (those are ASCII): reported, never opened.
			bad = append(bad, badEntry{de.inode, EngineError{de.name,
				&Error{Class: RefusedEntry, Name: path, What: "name is not UTF-8, so no engine id"}}})
			continue
		}
		// Regular dot-files are writers' temporary files (never engine ids).
		if de.name[0] == '.' && de.kind == syscall.DT_REG {
			continue
		}
		if kept, ok := oldEngines[de.name]; ok {
			delete(oldEngines, de.name)
			if kept.file.Inode() == de.inode && !kept.file.Truncated() {
				kept.checkWriter(MonotonicNs())
				engines = append(engines, kept)
				continue
			}
			kept.close()
		}
		if kept, ok := oldBad[de.name]; ok && kept.inode == de.inode {
			bad = append(bad, kept)
			continue
		}
		// Refused from the listing's type where it is known: a device is
		// never even opened. The open below refuses the rest.
		if kind := refusedKind(de.kind); kind != "" {
			bad = append(bad, badEntry{de.inode, EngineError{de.name,
				&Error{Class: RefusedEntry, Name: path, What: kind}}})
			continue
		}
		file, err := OpenFile(path)
		var e *Error
		switch {
		case err == nil:
			engines = append(engines, newEntry(file))
		case errors.As(err, &e) && e.Class == IO && errors.Is(e.Err, syscall.ENOENT):
			// removed meanwhile
		default:
			bad = append(bad, badEntry{de.inode, EngineError{de.name, err}})
		}
	}
	for _, gone := range oldEngines {
		gone.close()
	}
	sort.Slice(engines, func(i, j int) bool { return engines[i].id < engines[j].id })
	sort.Slice(bad, func(i, j int) bool { return bad[i].err.Name < bad[j].err.Name })
	d.engines, d.bad = engines, bad
	d.lastScan = MonotonicNs()
	if d.lastScan == 0 {
		d.lastScan = 1
	}
	return nil
}

func refusedKind(kind uint8) string {
	switch kind {
	case syscall.DT_LNK:
		return "symbolic link, not followed"
	case syscall.DT_FIFO:
		return "not a regular file (a FIFO)"
	case syscall.DT_SOCK:
		return "not a regular file (a socket)"
	case syscall.DT_CHR:
		return "not a regular file (a character device)"
	case syscall.DT_BLK:
		return "not a regular file (a block device)"
	case syscall.DT_DIR:
		return "not a regular file (a directory)"
	}
	return ""
}

func newEntry(f *File) *entry {
	// Two missed heartbeats (at least 10 ms) before suspecting the writer.
	late := 2 * time.Duration(f.Header().PublishPeriodUs) * time.Microsecond
	if late < pidCheckInterval {
		late = pidCheckInterval
	}
	period := time.Duration(f.Header().PublishPeriodUs) * time.Microsecond
	e := &entry{id: f.EngineID(), file: f, lateAfter: late, maxAhead: uint64(MaxAhead(period))}
	e.checkWriter(MonotonicNs())
	return e
}

// checkWriter asks whether the writer lives (at open and at listings); a
// writer whose heartbeat is late is also checked for being a zombie, at
// most every zombieCheckInterval (a listing with many late writers must not
// read /proc for each of them every time). A writer found gone stays gone:
// its file is replaced by a rename (a new entry), never reused.
func (e *entry) checkWriter(now uint64) {
	if e.writer == Gone {
		return
	}
	var heartbeat uint64 // 0 (late) when the mapping faults
	e.file.m.guard(func() { heartbeat = e.file.m.load(HeartbeatOffset) })
	zombieCheck := age(now, heartbeat) > e.lateAfter && now >= e.nextZombieCheck
	e.writer = writerAlive(&e.file.header, zombieCheck)
	if zombieCheck {
		e.nextZombieCheck = now + uint64(zombieCheckInterval)
	}
}

// clockAheadError is the per-engine error of a read that found a stamp too
// far ahead.
func (e *entry) clockAheadError(dir string) EngineError {
	return EngineError{e.id, &Error{Class: ClockAhead, Name: filepath.Join(dir, e.id), Stamp: e.aheadStamp,
		Ahead: age(e.aheadBy, 0), Limit: time.Duration(e.maxAhead)}}
}

// close unmaps the entry's file and digest file.
func (e *entry) close() {
	e.file.Close()
	e.cache.closeFile()
}

func (e *entry) read(dir string, now uint64, opts *Options, out *EngineState) {
	var o observed
	e.file.m.observe(&o, &out.Snapshot)
	if o.state == StateRetired {
		// A restarted engine may have replaced the file: read the new one.
		if e.reopenIfReplaced(dir, now) {
			e.file.m.observe(&o, &out.Snapshot)
		}
	}
	heartbeatAge := age(now, o.heartbeat)
	// A live writer stamps every period, so the pid (a system call) is
	// only checked when the heartbeat is late, and then at most every 10 ms.
	if heartbeatAge > e.lateAfter && e.writer == Alive && now >= e.nextPidCheck {
		zombieCheck := now >= e.nextZombieCheck
		e.writer = writerAlive(&e.file.header, zombieCheck)
		e.nextPidCheck = now + uint64(pidCheckInterval)
		if zombieCheck {
			e.nextZombieCheck = now + uint64(zombieCheckInterval)
		}
	}
	captureAge := age(now, out.Snapshot.CapturedMonoNs)
	e.aheadStamp, e.aheadBy = ahead(now, o.heartbeat, out.Snapshot.CapturedMonoNs, e.maxAhead)
	out.Status = opts.Freshness.Classify(Observation{
		Torn:         o.torn,
		Retired:      o.state == StateRetired,
		Writer:       e.writer,
		HeartbeatAge: heartbeatAge,
		CaptureAge:   captureAge,
		Idle:         out.Snapshot.IsIdle(),
		ClockAhead:   e.aheadStamp != "",
	})
	out.EngineID = e.id
	out.HeartbeatAge = heartbeatAge
	out.CaptureAge = captureAge
	out.Generation = e.file.header.Generation
	out.ReadMonoNs = now
	out.Cache = nil
	if opts.CacheDigests {
		// Read (when its version moved) whatever the status, so a damaged
		// digest is reported as the Rust reader reports it; used only while
		// the engine is fresh (docs/FORMAT.md, "Cache residency").
		if digest := e.cache.digest(dir, e.id, out.Generation, out.Snapshot.CacheVersion); out.Status == Fresh {
			out.Cache = digest
		}
	}
}

// reopenIfReplaced switches to the file now at the entry's path when it is
// another inode of the same engine (never mixing two: each read comes from
// one mapping). True when it switched. What is no regular file is refused
// from OpenFile's lstat, never opened.
func (e *entry) reopenIfReplaced(dir string, now uint64) bool {
	if now < e.nextReopen {
		return false
	}
	e.nextReopen = now + uint64(reopenBackoff)
	path := filepath.Join(dir, e.id)
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil || st.Ino == e.file.Inode() {
		return false
	}
	file, err := OpenFile(path)
	if err != nil || file.EngineID() != e.id {
		if file != nil {
			file.Close()
		}
		return false
	}
	e.file.Close()
	cache := e.cache // it checks the new file's generation against its digest's
	*e = *newEntry(file)
	e.cache = cache
	return true
}

var (
	pidNSOnce  sync.Once
	pidNSInode uint64
)

// pidNamespace is the inode of this process's /proc/self/ns/pid; 0 unknown.
func pidNamespace() uint64 {
	pidNSOnce.Do(func() {
		if info, err := os.Stat("/proc/self/ns/pid"); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				pidNSInode = st.Ino
			}
		}
	})
	return pidNSInode
}

// PIDNamespace is the inode of this process's pid namespace (what writers
// record in Header.WriterPIDNs); 0 when unknown.
func PIDNamespace() uint64 { return pidNamespace() }
