package enginestate

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// activeFile is the golden "active" file with its engine id field set to id.
func activeFile(t testing.TB, id string) []byte {
	t.Helper()
	b := vectorFile(t, "shm/active.bin")
	field := b[EngineIDOffset : EngineIDOffset+EngineIDFieldSize]
	for i := range field {
		field[i] = 0
	}
	copy(field, id)
	return b
}

// stampedNow is b with its heartbeat and capture stamped now, for a test
// that reads with the real clock: the vector's stamps (2000 s) are ahead of
// the clock of a host up for less than that, where the reader reports them
// (ClockAhead) besides what the test looks for.
func stampedNow(b []byte) []byte {
	now := MonotonicNs()
	binary.LittleEndian.PutUint64(b[HeartbeatOffset:], now)
	binary.LittleEndian.PutUint64(b[PayloadOffset:], now)
	return b
}

func mustWrite(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// within runs f, failing the test if it takes longer than limit (a reader
// that blocks on a FIFO would otherwise hang the test run).
func within(t *testing.T, limit time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("still blocked after %v", limit)
	}
}

func TestBadEntriesAreRefusedWithoutBlockingAndTheOthersAreRead(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "e0"), stampedNow(activeFile(t, "e0")))
	mustWrite(t, filepath.Join(dir, ".e1.tmp.123"), activeFile(t, "e1")) // a writer's temporary file: skipped
	mustWrite(t, filepath.Join(dir, "bad\xffname"), activeFile(t, "e2"))
	for _, fifo := range []string{"fifo", ".dotfifo"} {
		if err := syscall.Mkfifo(filepath.Join(dir, fifo), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "e0"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	sock, err := net.Listen("unix", filepath.Join(dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()

	var r Reading
	within(t, 10*time.Second, func() {
		d, err := OpenDir(dir, DefaultOptions())
		if err != nil {
			t.Error(err)
			return
		}
		defer d.Close()
		r, err = d.Read()
		if err != nil {
			t.Error(err)
		}
	})
	if len(r.Engines) != 1 || r.Engines[0].EngineID != "e0" {
		t.Errorf("engines: %+v", r.Engines)
	}
	want := map[string]string{
		".dotfifo": "a FIFO", "bad\xffname": "not UTF-8", "fifo": "a FIFO", "link": "symbolic link",
		"sock": "a socket", "sub": "a directory",
	}
	for _, e := range r.Errors {
		var err *Error
		if !errors.As(e.Err, &err) || err.Class != RefusedEntry || !strings.Contains(e.Error(), want[e.Name]) {
			t.Errorf("%q: %v", e.Name, e.Err)
		}
		if !strings.Contains(e.Error(), "remove it from the engine-state directory") {
			t.Errorf("%q: the message does not say what to do: %v", e.Name, e.Err)
		}
		delete(want, e.Name)
	}
	if len(want) != 0 {
		t.Errorf("not reported: %v", want)
	}
}

// OpenFile itself (what a listing without d_type, or a race, comes to)
// neither blocks on a FIFO nor follows a link.
func TestOpenFileRefusesFIFOsAndLinksWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "e0"), activeFile(t, "e0"))
	link := filepath.Join(dir, "link")
	if err := os.Symlink("e0", link); err != nil {
		t.Fatal(err)
	}
	within(t, 10*time.Second, func() {
		for path, says := range map[string]string{fifo: "not a regular file (a FIFO)", link: "symbolic link, not followed"} {
			_, err := OpenFile(path)
			var e *Error
			if !errors.As(err, &e) || e.Class != RefusedEntry || e.What != says {
				t.Errorf("%s: %v", path, err)
			}
		}
	})
}

// A file truncated under the mapping must not crash the process: the read
// that faults reads torn, and the next listing reports the file's size.
func TestAFileTruncatedUnderTheMappingReadsTornThenWrongSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "e0")
	mustWrite(t, path, activeFile(t, "e0"))
	mustWrite(t, filepath.Join(dir, "e1"), activeFile(t, "e1"))
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	now := loadManifest(t).NowMonoNs
	var r Reading
	if err := d.ReadAt(&r, now); err != nil || len(r.Engines) != 2 || r.Engines[0].Status != Fresh {
		t.Fatalf("before: %+v %v", r, err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // faults once, then does not touch the mapping again
		if err := d.ReadAt(&r, now); err != nil {
			t.Fatal(err)
		}
		if e := r.Engines[0]; e.EngineID != "e0" || e.Status != Torn || e.Snapshot != (Snapshot{}) {
			t.Fatalf("after truncation: %+v", e)
		}
		if r.Engines[1].Status != Fresh {
			t.Fatalf("the other engine: %+v", r.Engines[1])
		}
	}
	if err := d.Rescan(); err != nil {
		t.Fatal(err)
	}
	if err := d.ReadAt(&r, now); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if len(r.Engines) != 1 || len(r.Errors) != 1 || !errors.As(r.Errors[0].Err, &e) || e.Class != WrongSize || e.Size != 0 {
		t.Fatalf("after a listing: %+v", r)
	}
}

// openRetired opens a directory (no listings but the first) holding the
// golden retired file as "retired", read once (Dead) at the manifest's now.
func openRetired(t *testing.T) (dir, path string, d *Dir, now uint64) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "retired")
	mustWrite(t, path, vectorFile(t, "shm/retired.bin"))
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	now = loadManifest(t).NowMonoNs
	var r Reading
	if d.ReadAt(&r, now); len(r.Engines) != 1 || r.Engines[0].Status != Dead {
		t.Fatalf("before: %+v", r)
	}
	return dir, path, d, now
}

// A retired file replaced by a restarted engine's new file is read from
// the new file at once, without waiting for a listing.
func TestAReplacementOfARetiredFileIsPickedUp(t *testing.T) {
	_, path, d, now := openRetired(t)
	var r Reading
	next := activeFile(t, "retired")
	binary.LittleEndian.PutUint64(next[48:], 2) // generation 2
	mustWrite(t, path+".new", next)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if d.ReadAt(&r, now+uint64(time.Second)); len(r.Engines) != 1 || r.Engines[0].Status != Fresh ||
		r.Engines[0].Generation != 2 {
		t.Fatalf("after: %+v", r)
	}
}

// A retired file replaced by a FIFO (standing in for a device node, whose
// open can have effects of its own): the reader's reopen refuses it from an
// lstat without opening it (a FIFO's non-blocking open would succeed).
func TestAReplacementThatIsNoRegularFileIsNotOpened(t *testing.T) {
	dir, path, d, now := openRetired(t)
	var r Reading
	if err := syscall.Mkfifo(path+".new", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	watch, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(watch)
	if _, err := syscall.InotifyAddWatch(watch, dir, syscall.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	within(t, 10*time.Second, func() {
		d.ReadAt(&r, now+uint64(time.Second))
	})
	var buf [4096]byte
	n, _ := syscall.Read(watch, buf[:])
	for at := 0; at+syscall.SizeofInotifyEvent <= n; {
		ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[at]))
		name := buf[at+syscall.SizeofInotifyEvent : at+syscall.SizeofInotifyEvent+int(ev.Len)]
		if strings.TrimRight(string(name), "\x00") == "retired" {
			t.Fatalf("the FIFO was opened")
		}
		at += syscall.SizeofInotifyEvent + int(ev.Len)
	}
	// Socket: refused as what it is, not as an open's ENXIO.
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = OpenFile(sock)
	var e *Error
	if !errors.As(err, &e) || e.Class != RefusedEntry || e.What != "not a regular file (a socket)" {
		t.Errorf("socket: %v", err)
	}
}

// The pid check: a writer that exists in our pid namespace is alive, one
// that does not is dead (the golden dead_writer vector), one in another
// namespace is unknown (the heartbeat decides).
func TestWriterLiveness(t *testing.T) {
	h := Header{WriterPID: uint32(os.Getpid()), WriterPIDNs: PIDNamespace()}
	if PIDNamespace() == 0 || writerAlive(&h, true) != Alive {
		t.Errorf("this process: %v (namespace %d)", writerAlive(&h, true), PIDNamespace())
	}
	h.WriterPID = 1<<31 - 1
	if writerAlive(&h, true) != Gone {
		t.Errorf("no such pid: %v", writerAlive(&h, true))
	}
	h.WriterPIDNs++
	if writerAlive(&h, true) != Unknown {
		t.Errorf("another namespace: %v", writerAlive(&h, true))
	}
}

func TestDirectoryErrorsSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	_, err := OpenDir(filepath.Join(dir, "missing"), DefaultOptions())
	if err == nil || !strings.Contains(err.Error(), "create it, or point AGENTIC_ENGINE_STATE_URI") {
		t.Errorf("missing directory: %v", err)
	}
	file := filepath.Join(dir, "file")
	mustWrite(t, file, nil)
	if _, err := OpenDir(file, DefaultOptions()); err == nil || !strings.Contains(err.Error(), "use as a directory") {
		t.Errorf("a file: %v", err)
	}
}

// MonotonicNs is clock_gettime(CLOCK_MONOTONIC), the writers' clock.
func TestMonotonicNsIsClockMonotonic(t *testing.T) {
	var ts syscall.Timespec
	before := MonotonicNs()
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		t.Fatal(errno)
	}
	after := MonotonicNs()
	if clock := uint64(ts.Nano()); clock < before || clock > after {
		t.Errorf("CLOCK_MONOTONIC %d outside [%d, %d]", clock, before, after)
	}
}
