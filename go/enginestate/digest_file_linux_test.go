package enginestate

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func writeAt(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func le64(v uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return b[:]
}

func TestOpenDigestFileRefusesFIFOsAndLinksWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real")
	mustWrite(t, target, vectorFile(t, "cache/file_active.bin"))
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, what := range map[string]string{"link": "symbolic link, not followed",
		"fifo": "not a regular file (a FIFO)", "sub": "not a regular file (a directory)"} {
		var err error
		within(t, 10*time.Second, func() { _, err = OpenDigestFile(filepath.Join(dir, name)) })
		var e *Error
		if !errors.As(err, &e) || e.Class != RefusedEntry || e.What != what {
			t.Errorf("%s: %v, want refused_entry %q", name, err, what)
		}
	}
	f, err := OpenDigestFile(target)
	if err != nil {
		t.Fatalf("the regular file: %v", err)
	}
	f.Close()
}

// A digest file truncated under its mapping reads torn (the fault is
// recovered, the process lives); opened again it is what it is now.
func TestADigestTruncatedUnderTheMappingReadsTornNotACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "e0")
	mustWrite(t, path, vectorFile(t, "cache/file_active.bin"))
	f, err := OpenDigestFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if r, err := f.Read(); err != nil || r.Digest.Len() != 5 || f.Seq() == 0 {
		t.Fatalf("before: %+v %v", r, err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		_, err := f.Read()
		var e *DigestError
		if !errors.As(err, &e) || e.Class != TornDigest {
			t.Fatalf("after truncation: %v", err)
		}
		if !f.Truncated() || f.IsRetired() || f.Seq() != 0 {
			t.Fatalf("truncated %v, retired %v, seq %d", f.Truncated(), f.IsRetired(), f.Seq())
		}
	}
	_, err = OpenDigestFile(path)
	var e *DigestError
	if !errors.As(err, &e) || e.Class != NotDigest {
		t.Fatalf("opened again: %v", err)
	}
}

// stressDigest is what the stress writer publishes as version v: every
// field and entry a function of v, so a reader can tell a mixed copy.
func stressDigest(v uint64, capacity int) (count, held uint64) {
	count = v % uint64(capacity+1)
	return count, count + v%3
}

// A writer goroutine rewrites a digest file through the seqlock protocol as
// fast as it can (every control word and entry a function of the version,
// the count changing at every write) while readers read it through their
// own mappings: no read may ever return a mixed copy.
func TestDigestStressAcceptsNoTornCopy(t *testing.T) {
	const capacity = 64
	path := filepath.Join(t.TempDir(), "stress")
	mustWrite(t, path, vectorFile(t, "cache/file_empty.bin"))
	if err := os.Truncate(path, digestSize(capacity)); err != nil {
		t.Fatal(err)
	}
	writeAt(t, path, 16, le64(uint64(capacity)<<32|4242)) // writer_pid, capacity
	fd, err := syscall.Open(path, syscall.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(fd, 0, int(digestSize(capacity)), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	syscall.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	// The test's writer: every word stored atomically (FORMAT.md, "The
	// orderings in each language", Go column). mem is an mmap, 8-aligned.
	word := func(off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
	seq := atomic.LoadUint64(word(digestSeqOffset))
	publish := func(v uint64) {
		atomic.StoreUint64(word(digestSeqOffset), seq+1)
		count, held := stressDigest(v, capacity)
		atomic.StoreUint64(word(digestControlOffset+8*controlVersion), v)
		atomic.StoreUint64(word(digestControlOffset+8*controlCapturedMonoNs), 3*v)
		atomic.StoreUint64(word(digestControlOffset+8*controlCapturedUnixNs), 5*v)
		atomic.StoreUint64(word(digestControlOffset+8*controlCount), count)
		atomic.StoreUint64(word(digestControlOffset+8*controlHeld), held)
		for i := uint64(0); i < count; i++ {
			atomic.StoreUint64(word(digestEntriesOffset+8*int(i)), v<<20|i)
		}
		seq += 2
		atomic.StoreUint64(word(digestSeqOffset), seq)
	}
	publish(1)

	var stop atomic.Bool
	var published atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := uint64(2); !stop.Load(); v++ {
			publish(v)
			published.Store(v)
		}
	}()
	const readers, wantAccepted = 2, 100_000
	type result struct{ reads, accepted, torn, versions int }
	results := make([]result, readers)
	failures := make(chan string, readers)
	deadline := time.Now().Add(120 * time.Second)
	var rwg sync.WaitGroup
	for n := 0; n < readers; n++ {
		rwg.Add(1)
		go func(res *result) {
			defer rwg.Done()
			f, err := OpenDigestFile(path)
			if err != nil {
				failures <- err.Error()
				return
			}
			defer f.Close()
			var last uint64
			// Until the writer has published 100+ versions during the reads
			// (on a loaded host the three goroutines share few cores, and
			// a reader mostly reads the version of the last time slice).
			for res.accepted < wantAccepted || res.versions < 100 {
				if time.Now().After(deadline) {
					failures <- "deadline"
					return
				}
				res.reads++
				r, err := f.Read()
				var e *DigestError
				if errors.As(err, &e) && e.Class == TornDigest {
					res.torn++
					continue
				}
				if err != nil {
					failures <- "a consistent copy refused: " + err.Error()
					return
				}
				v := r.Digest.Version
				count, held := stressDigest(v, capacity)
				ok := r.Digest.CapturedMonoNs == 3*v && r.CapturedUnixNs == 5*v &&
					uint64(r.Digest.Len()) == count && r.Held == held && v >= last
				for i, b := range r.Digest.Blocks {
					ok = ok && b == v<<20|uint64(i)
				}
				if !ok {
					failures <- "a mixed copy accepted"
					return
				}
				res.accepted++
				if v != last {
					last = v
					res.versions++
				}
			}
		}(&results[n])
	}
	rwg.Wait()
	stop.Store(true)
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
	t.Logf("writer published %d versions; readers (reads, accepted, torn, versions seen): %v", published.Load(), results)
}
