package enginestate

import (
	"errors"
	"path/filepath"
	"sort"
	"syscall"
	"time"
	"unicode/utf8"
)

// Replicas is every router replica's reservations file in <dir>.routers
// (RoutersDir) but the reader's own, mapped read-only: the Rust reader's
// ShmReplicas (reader/src/replicas/shm.rs). Listed at most every
// Options.RescanInterval like an engine Dir: new files are mapped, removed
// ones dropped, replaced ones (another inode under the name, or truncated
// under the mapping) opened again, and what cannot be read is a
// per-replica error until its inode changes. A replica is judged by the
// engines' rule (Freshness.Classify: torn, dead — retired, or its writer
// gone in this pid namespace — stale heartbeat, fresh) with no capture
// age; a retired file reads dead until the next listing drops it or maps
// its replacement. A missing directory is no replica yet, not an error.
// Not safe for concurrent use.
type Replicas struct {
	path     string
	own      string
	opts     Options
	entries  []*replicaEntry
	bad      []badEntry
	lastScan uint64
}

type replicaEntry struct {
	id              string
	file            *RouterFile
	writer          Liveness
	lateAfter       time.Duration
	maxAhead        uint64
	nextPidCheck    uint64
	nextZombieCheck uint64
	record          RouterRecord
}

// OpenReplicas opens the replicas of the engines' directory stateDir (their
// files are in RoutersDir(stateDir)), leaving out own (the reading router's
// own replica id; "" leaves none out).
func OpenReplicas(stateDir, own string, opts Options) (*Replicas, error) {
	if !hostLittleEndian {
		return nil, errors.New("engine-state layout version 1 stores little-endian words; big-endian hosts are not supported")
	}
	r := &Replicas{path: RoutersDir(stateDir), own: own, opts: opts}
	if err := r.Rescan(); err != nil {
		return nil, err
	}
	return r, nil
}

// Path is the replicas' directory.
func (r *Replicas) Path() string { return r.path }

// Close unmaps every file. The Replicas must not be used afterwards.
func (r *Replicas) Close() error {
	for _, e := range r.entries {
		e.file.Close()
	}
	r.entries = nil
	return nil
}

// Read reads every replica but the reader's own now.
func (r *Replicas) Read() (ReplicaReading, error) {
	var out ReplicaReading
	err := r.ReadInto(&out)
	return out, err
}

// ReadInto reads every replica into out (emptied first, its slices reused).
// Each ReplicaState's Engines is the entry's own slice, reused by the next
// read: copy what must outlive it.
func (r *Replicas) ReadInto(out *ReplicaReading) error {
	return r.ReadAt(out, MonotonicNs())
}

// ReadAt is ReadInto with the ages measured from nowMonoNs (CLOCK_MONOTONIC).
func (r *Replicas) ReadAt(out *ReplicaReading, nowMonoNs uint64) error {
	out.Replicas = out.Replicas[:0]
	out.Errors = out.Errors[:0]
	if r.lastScan == 0 || time.Duration(MonotonicNs()-r.lastScan) >= r.opts.RescanInterval {
		if err := r.Rescan(); err != nil {
			return err
		}
	}
	for _, e := range r.entries {
		out.Replicas = append(out.Replicas, ReplicaState{})
		if err := e.read(nowMonoNs, r.opts.Freshness, &out.Replicas[len(out.Replicas)-1]); err != nil {
			out.Errors = append(out.Errors, EngineError{e.id, err})
		}
	}
	for _, b := range r.bad {
		out.Errors = append(out.Errors, b.err)
	}
	return nil
}

// Rescan lists the directory now.
func (r *Replicas) Rescan() error {
	listing, err := readDir(r.path)
	var e *Error
	if errors.As(err, &e) && errors.Is(e.Err, syscall.ENOENT) {
		listing, err = nil, nil // no replica has shared yet
	}
	if err != nil {
		return err
	}
	old := make(map[string]*replicaEntry, len(r.entries))
	for _, e := range r.entries {
		old[e.id] = e
	}
	oldBad := make(map[string]badEntry, len(r.bad))
	for _, b := range r.bad {
		oldBad[b.err.Name] = b
	}
	entries := make([]*replicaEntry, 0, len(r.entries))
	var bad []badEntry
	now := MonotonicNs()
	for _, de := range listing {
		path := filepath.Join(r.path, de.name)
		if !utf8.ValidString(de.name) {
			bad = append(bad, badEntry{de.inode, EngineError{de.name,
				&Error{Class: RefusedEntry, Name: path, What: "name is not UTF-8, so no replica id"}}})
			continue
		}
		// Writers' temporary files, and the reader's own record.
		if (de.name[0] == '.' && de.kind == syscall.DT_REG) || de.name == r.own {
			continue
		}
		if kept, ok := old[de.name]; ok {
			delete(old, de.name)
			if kept.file.Inode() == de.inode && !kept.file.Truncated() {
				kept.checkWriter(now)
				entries = append(entries, kept)
				continue
			}
			kept.file.Close()
		}
		if kept, ok := oldBad[de.name]; ok && kept.inode == de.inode {
			bad = append(bad, kept)
			continue
		}
		if kind := refusedKind(de.kind); kind != "" {
			bad = append(bad, badEntry{de.inode, EngineError{de.name,
				&Error{Class: RefusedEntry, Name: path, What: kind}}})
			continue
		}
		file, err := OpenRouterFile(path)
		var e *Error
		switch {
		case err == nil:
			entries = append(entries, newReplicaEntry(file, now))
		case errors.As(err, &e) && e.Class == IO && errors.Is(e.Err, syscall.ENOENT):
			// removed meanwhile
		default:
			bad = append(bad, badEntry{de.inode, EngineError{de.name, err}})
		}
	}
	for _, gone := range old {
		gone.file.Close()
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].id < entries[j].id })
	sort.Slice(bad, func(i, j int) bool { return bad[i].err.Name < bad[j].err.Name })
	r.entries, r.bad = entries, bad
	r.lastScan = MonotonicNs()
	if r.lastScan == 0 {
		r.lastScan = 1
	}
	return nil
}

func newReplicaEntry(f *RouterFile, now uint64) *replicaEntry {
	// Two missed heartbeats (at least 10 ms) before suspecting the writer.
	period := time.Duration(f.Header().HeartbeatPeriodUs) * time.Microsecond
	late := 2 * period
	if late < pidCheckInterval {
		late = pidCheckInterval
	}
	e := &replicaEntry{id: f.ReplicaID(), file: f, lateAfter: late, maxAhead: uint64(MaxAhead(period))}
	e.checkWriter(now)
	return e
}

// writerHeader is what writerAlive needs of the file's header.
func (e *replicaEntry) writerHeader() Header {
	h := e.file.Header()
	return Header{WriterPID: h.WriterPID, WriterPIDNs: h.WriterPIDNs}
}

// checkWriter asks whether the writer lives (at open and at listings), as
// an engine Dir does.
func (e *replicaEntry) checkWriter(now uint64) {
	if e.writer == Gone {
		return
	}
	zombieCheck := age(now, e.file.HeartbeatMonoNs()) > e.lateAfter && now >= e.nextZombieCheck
	h := e.writerHeader()
	e.writer = writerAlive(&h, zombieCheck)
	if zombieCheck {
		e.nextZombieCheck = now + uint64(zombieCheckInterval)
	}
}

// read reads the file at now into out and judges it; a malformed record is
// also a per-replica error (the state is then torn, with no engines).
func (e *replicaEntry) read(now uint64, f Freshness, out *ReplicaState) error {
	stateWord, heartbeat, err := e.file.read(&e.record)
	retired := stateWord == StateRetired
	torn := err != nil
	if isTornRouter(err) {
		err = nil
	}
	changed := uint64(0)
	if !torn {
		changed = e.record.ChangedMonoNs
	}
	heartbeatAge := age(now, heartbeat)
	if heartbeatAge > e.lateAfter && e.writer == Alive && now >= e.nextPidCheck {
		zombieCheck := now >= e.nextZombieCheck
		h := e.writerHeader()
		e.writer = writerAlive(&h, zombieCheck)
		e.nextPidCheck = now + uint64(pidCheckInterval)
		if zombieCheck {
			e.nextZombieCheck = now + uint64(zombieCheckInterval)
		}
	}
	stamp, _ := ahead(now, heartbeat, changed, e.maxAhead)
	*out = ReplicaState{
		ReplicaID:    e.id,
		Status:       replicaStatus(f, torn, retired, e.writer, heartbeatAge, stamp != ""),
		HeartbeatAge: heartbeatAge,
		ChangedAge:   age(now, changed),
		ChangedKnown: changed != 0,
		Generation:   e.file.Generation(),
		ReadMonoNs:   now,
		WriterPID:    e.file.Header().WriterPID,
		Engines:      e.record.Engines,
	}
	return err
}
