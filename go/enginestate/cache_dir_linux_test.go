package enginestate

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Offsets the tests patch: the engine file's generation and the snapshot's
// cache_version; a digest's version word and its first entries.
const (
	engineGenerationOffset   = 48
	engineCacheVersionOffset = PayloadOffset + 8*14
	digestVersionOffset      = digestControlOffset + 8*controlVersion
)

// cacheFixture is a state directory holding engine id (the golden active
// file, of generation and naming digest version) and, unless digest is "",
// that golden digest file as <dir>.cache/<id>. It returns the directory and
// the two paths.
func cacheFixture(t *testing.T, id string, generation, version uint64, digest string) (dir, enginePath, digestPath string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(CacheDir(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	enginePath, digestPath = filepath.Join(dir, id), filepath.Join(CacheDir(dir), id)
	b := activeFile(t, id)
	copy(b[engineGenerationOffset:], le64(generation))
	copy(b[engineCacheVersionOffset:], le64(version))
	mustWrite(t, enginePath, b)
	if digest != "" {
		mustWrite(t, digestPath, vectorFile(t, digest))
	}
	return dir, enginePath, digestPath
}

func openCacheDir(t *testing.T, dir string, digests bool) *Dir {
	t.Helper()
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	opts.CacheDigests = digests
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// readOne reads the directory at now and returns its one engine and the
// read's errors.
func readOne(t *testing.T, d *Dir, now uint64) (EngineState, []EngineError) {
	t.Helper()
	var r Reading
	if err := d.ReadAt(&r, now); err != nil {
		t.Fatal(err)
	}
	if len(r.Engines) != 1 {
		t.Fatalf("%d engines: %+v", len(r.Engines), r)
	}
	return r.Engines[0], append([]EngineError(nil), r.Errors...)
}

// cacheErrorOf is the one cache digest error of engine id in errs, of
// class (CorruptCache or MissingCache), Damaged exactly when it is
// CorruptCache, its message saying what to do.
func cacheErrorOf(t *testing.T, errs []EngineError, id string, class Class) *Error {
	t.Helper()
	var e *Error
	if len(errs) != 1 || errs[0].Name != id || !errors.As(errs[0].Err, &e) || e.Class != class {
		t.Fatalf("errors %v, want one %s error of %s", errs, class, id)
	}
	if e.Damaged != (class == CorruptCache) {
		t.Errorf("%s error with Damaged %v: %v", class, e.Damaged, e)
	}
	hint := map[Class]string{CorruptCache: "Options.CacheDigests", MissingCache: "still writes its digest"}[class]
	if !strings.Contains(e.Error(), hint) || !strings.Contains(e.Error(), "read without it") {
		t.Errorf("the message does not say what to do: %v", e)
	}
	return e
}

func goldenBlocks(t *testing.T, name string) []uint64 {
	t.Helper()
	var digest struct{ Blocks []uint64 }
	if err := json.Unmarshal(vectorFile(t, name), &digest); err != nil || len(digest.Blocks) == 0 {
		t.Fatalf("%s: %v", name, err)
	}
	return digest.Blocks
}

func TestDirHandsOutAFreshEnginesDigestAndReadsItAgainOnlyWhenItsVersionMoves(t *testing.T) {
	_, enginePath, digestPath := cacheFixture(t, "e0", 7, 3, "cache/file_active.bin")
	d := openCacheDir(t, filepath.Dir(enginePath), true)
	now := loadManifest(t).NowMonoNs
	e, errs := readOne(t, d, now)
	if e.Status != Fresh || len(errs) != 0 || e.Cache == nil {
		t.Fatalf("first read: %+v, errors %v", e, errs)
	}
	want := goldenBlocks(t, "cache/file_active.json")
	if !reflect.DeepEqual(e.Cache.Blocks, want) || e.Cache.Version != 3 {
		t.Fatalf("digest %+v, want version 3 and %v", e.Cache, want)
	}
	first := e.Cache

	// Entries 0 and 1 swapped in place (same version): not read again, so
	// the held digest is handed out, and nothing is reported.
	writeAt(t, digestPath, digestEntriesOffset, append(le64(want[1]), le64(want[0])...))
	for i := 0; i < 2; i++ {
		if e, errs = readOne(t, d, now); e.Cache != first || len(errs) != 0 {
			t.Fatalf("same version: %p (held %p), errors %v", e.Cache, first, errs)
		}
	}

	// The snapshot names version 4 and the digest says 4, still unsorted:
	// read again, refused at every read, the engine still fresh.
	writeAt(t, digestPath, digestVersionOffset, le64(4))
	writeAt(t, enginePath, engineCacheVersionOffset, le64(4))
	for i := 0; i < 2; i++ {
		e, errs = readOne(t, d, now)
		if e.Status != Fresh || e.Cache != nil {
			t.Fatalf("damaged digest: %+v", e)
		}
		if err := cacheErrorOf(t, errs, "e0", CorruptCache); !strings.Contains(err.What, "not strictly ascending") {
			t.Fatalf("read %d: %v", i, err)
		}
	}

	// Mended as version 5: read again.
	writeAt(t, digestPath, digestEntriesOffset, append(le64(want[0]), le64(want[1])...))
	writeAt(t, digestPath, digestVersionOffset, le64(5))
	writeAt(t, enginePath, engineCacheVersionOffset, le64(5))
	if e, errs = readOne(t, d, now); e.Cache == nil || e.Cache.Version != 5 || len(errs) != 0 {
		t.Fatalf("mended: %+v, errors %v", e.Cache, errs)
	}
	if n := e.Cache.LeadingBlocks(want); n != len(want) {
		t.Errorf("LeadingBlocks of the digest's own blocks: %d", n)
	}

	// Stale (read 10 s later): no digest handed out.
	if e, _ = readOne(t, d, now+uint64(10*time.Second)); e.Status != Stale || e.Cache != nil {
		t.Fatalf("stale: %v %+v", e.Status, e.Cache)
	}
}

func TestDirWithoutCacheDigestsReadsNone(t *testing.T) {
	_, enginePath, _ := cacheFixture(t, "e0", 7, 3, "cache/file_unsorted.bin")
	d := openCacheDir(t, filepath.Dir(enginePath), false)
	if e, errs := readOne(t, d, loadManifest(t).NowMonoNs); e.Status != Fresh || e.Cache != nil || len(errs) != 0 {
		t.Fatalf("%+v, errors %v", e, errs)
	}
}

// A digest of another generation, a missing one, one older than the
// snapshot names, one the writer retired: no digest, reported once as
// missing_cache (the retired one not at all); a digest file put in place of
// the retired one by rename is read at the next read.
func TestDirUsesOnlyAnActiveDigestOfTheEnginesGeneration(t *testing.T) {
	now := loadManifest(t).NowMonoNs
	for _, c := range []struct {
		name, digest        string
		generation, version uint64
		what                string
	}{
		{"other_generation", "cache/file_active.bin", 8, 3, "generation 7 of the engine, not to generation 8"},
		{"missing", "", 7, 3, "there is no digest file"},
		{"older", "cache/file_active.bin", 7, 4, "holds version 3, older than the version 4"},
		{"retired", "cache/file_retired.bin", 7, 3, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, enginePath, digestPath := cacheFixture(t, "e0", c.generation, c.version, c.digest)
			d := openCacheDir(t, filepath.Dir(enginePath), true)
			e, errs := readOne(t, d, now)
			if e.Status != Fresh || e.Cache != nil {
				t.Fatalf("%+v", e)
			}
			if c.what != "" {
				if err := cacheErrorOf(t, errs, "e0", MissingCache); !strings.Contains(err.What, c.what) {
					t.Fatalf("%v, want %q", err, c.what)
				}
			} else if len(errs) != 0 {
				t.Fatalf("errors %v", errs)
			}
			if _, errs = readOne(t, d, now); len(errs) != 0 {
				t.Fatalf("reported again: %v", errs)
			}
			if c.name != "retired" {
				return
			}
			tmp := filepath.Join(CacheDir(filepath.Dir(enginePath)), ".e0.tmp.1")
			mustWrite(t, tmp, vectorFile(t, "cache/file_active.bin"))
			if err := os.Rename(tmp, digestPath); err != nil {
				t.Fatal(err)
			}
			if e, errs = readOne(t, d, now); e.Cache == nil || e.Cache.Len() != 5 || len(errs) != 0 {
				t.Fatalf("after the replacement: %+v, errors %v", e.Cache, errs)
			}
		})
	}
}

// What is no regular file in the cache directory is refused without being
// opened or followed: that engine's error, its state still read.
func TestDirRefusesADigestThatIsNoRegularFile(t *testing.T) {
	now := loadManifest(t).NowMonoNs
	for name, make := range map[string]func(path string) error{
		"link": func(path string) error { return os.Symlink("/dev/zero", path) },
		"fifo": func(path string) error { return syscall.Mkfifo(path, 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			_, enginePath, digestPath := cacheFixture(t, "e0", 7, 3, "")
			if err := make(digestPath); err != nil {
				t.Fatal(err)
			}
			d := openCacheDir(t, filepath.Dir(enginePath), true)
			var e EngineState
			var errs []EngineError
			within(t, 10*time.Second, func() { e, errs = readOne(t, d, now) })
			if e.Status != Fresh || e.Cache != nil {
				t.Fatalf("%+v", e)
			}
			err := cacheErrorOf(t, errs, "e0", CorruptCache)
			var refused *Error
			if !errors.As(err.Err, &refused) || refused.Class != RefusedEntry {
				t.Fatalf("%v: its cause %v is no refused_entry", err, err.Err)
			}
		})
	}
}

func TestCacheDirIsASibling(t *testing.T) {
	for dir, want := range map[string]string{
		"/dev/shm/agentic_engine_state":   "/dev/shm/agentic_engine_state.cache",
		"/dev/shm/agentic_engine_state//": "/dev/shm/agentic_engine_state.cache",
		"relative/dir":                    "relative/dir.cache",
	} {
		if got := CacheDir(dir); got != want {
			t.Errorf("CacheDir(%q) = %q, want %q", dir, got, want)
		}
	}
}

// A torn digest (its writer mid-write) is no error: no digest, not read
// again while its sequence word stays put, read once the writer stores it.
func TestDirRetriesATornDigestOnceItsSequenceMoves(t *testing.T) {
	_, enginePath, digestPath := cacheFixture(t, "e0", 7, 3, "cache/file_mid_write.bin")
	d := openCacheDir(t, filepath.Dir(enginePath), true)
	now := loadManifest(t).NowMonoNs
	for i := 0; i < 2; i++ {
		if e, errs := readOne(t, d, now); e.Status != Fresh || e.Cache != nil || len(errs) != 0 {
			t.Fatalf("torn: %+v, errors %v", e, errs)
		}
	}
	seq := vectorFile(t, "cache/file_mid_write.bin")[digestSeqOffset:][:8]
	writeAt(t, digestPath, digestSeqOffset, le64(binary.LittleEndian.Uint64(seq)+1)) // the write completes
	if e, errs := readOne(t, d, now); e.Cache == nil || e.Cache.Len() != 5 || len(errs) != 0 {
		t.Fatalf("after the write: %+v, errors %v", e.Cache, errs)
	}
}
