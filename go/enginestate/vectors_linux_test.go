package enginestate

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The golden vectors of format/vectors/ (see its README.md).

type manifest struct {
	NowMonoNs        uint64 `json:"now_mono_ns"`
	StaleAfterMs     int64  `json:"stale_after_ms"`
	MaxCaptureAgeMs  int64  `json:"max_capture_age_ms"`
	PlaceholderPIDNs uint64 `json:"placeholder_pid_ns"`
	Cases            []vectorCase
}

type vectorCase struct {
	Name             string
	Kind             string
	What             string
	File             string
	EngineID         string `json:"engine_id"`
	Key              string
	PTTLMs           int64 `json:"pttl_ms"`
	SamePIDNamespace bool  `json:"same_pid_namespace"`
	Expect           string
	Error            string
	FoundVersion     uint32 `json:"found_version"`
}

func vectorsDir() string { return filepath.Join("..", "..", "format", "vectors") }

func vectorFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorsDir(), name))
	if err != nil {
		t.Fatalf("golden vector: %v", err)
	}
	return b
}

func loadManifest(t testing.TB) manifest {
	t.Helper()
	var m manifest
	if err := json.Unmarshal(vectorFile(t, "manifest.json"), &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(m.Cases) == 0 {
		t.Fatal("manifest.json has no cases")
	}
	return m
}

func (m *manifest) freshness() Freshness {
	return Freshness{
		StaleAfter:    time.Duration(m.StaleAfterMs) * time.Millisecond,
		MaxCaptureAge: time.Duration(m.MaxCaptureAgeMs) * time.Millisecond,
	}
}

// writeShmVector puts a case's file into dir under its engine id, with this
// process's pid namespace written in where the case asks for it.
func writeShmVector(t testing.TB, m *manifest, c vectorCase, dir string) {
	t.Helper()
	b := vectorFile(t, c.File)
	if c.SamePIDNamespace {
		if got := binary.LittleEndian.Uint64(b[32:40]); got != m.PlaceholderPIDNs {
			t.Fatalf("%s: pid namespace placeholder is %d", c.Name, got)
		}
		binary.LittleEndian.PutUint64(b[32:40], PIDNamespace())
	}
	if err := os.WriteFile(filepath.Join(dir, c.EngineID), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readVectorDir(t testing.TB, m *manifest, dir string) Reading {
	t.Helper()
	opts := DefaultOptions()
	opts.Freshness = m.freshness()
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var r Reading
	if err := d.ReadAt(&r, m.NowMonoNs); err != nil {
		t.Fatal(err)
	}
	return r
}

func checkError(t *testing.T, c vectorCase, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: error %v is not an *Error", c.Name, err)
	}
	if string(e.Class) != c.Error {
		t.Errorf("%s: error class %s, want %s (%v)", c.Name, e.Class, c.Error, err)
	}
	if e.Class == UnknownVersion && (e.Found != c.FoundVersion || e.Supported != LayoutVersion) {
		t.Errorf("%s: versions %d/%d, want %d/%d", c.Name, e.Found, e.Supported, c.FoundVersion, LayoutVersion)
	}
	if err.Error() == "" {
		t.Errorf("%s: empty message", c.Name)
	}
}

func TestGoldenVectors(t *testing.T) {
	m := loadManifest(t)
	classes := map[string]bool{}
	for _, c := range m.Cases {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			var out []byte
			var err error
			switch c.Kind {
			case "shm":
				dir := t.TempDir()
				writeShmVector(t, &m, c, dir)
				r := readVectorDir(t, &m, dir)
				switch len(r.Errors) {
				case 0:
					out = FormatJSON(r.Engines)
				case 1:
					// An engine read besides its error (clock_ahead): its
					// output is checked here, its class below.
					if c.Expect != "" {
						if out, want := FormatJSON(r.Engines), vectorFile(t, c.Expect); !bytes.Equal(out, want) {
							t.Errorf("%s (%s):\n got %s\nwant %s", c.Name, c.What, out, want)
						}
					} else if len(r.Engines) != 0 {
						t.Fatalf("an error and %d engines", len(r.Engines))
					}
					if r.Errors[0].Name != c.EngineID {
						t.Errorf("error names %q, want %q", r.Errors[0].Name, c.EngineID)
					}
					err = r.Errors[0].Err
				default:
					t.Fatalf("%d errors: %v", len(r.Errors), r.Errors)
				}
			case "redis":
				var state EngineState
				state, err = StateAtFetch(c.EngineID, c.Key, vectorFile(t, c.File), c.PTTLMs, m.freshness(), 0)
				if err == nil {
					out = FormatJSON([]EngineState{state})
				}
			default:
				t.Fatalf("unknown kind %q", c.Kind)
			}
			switch {
			case c.Expect != "" && err == nil:
				if want := vectorFile(t, c.Expect); !bytes.Equal(out, want) {
					t.Errorf("%s (%s):\n got %s\nwant %s", c.Name, c.What, out, want)
				}
			case c.Error != "" && err != nil:
				classes[c.Error] = true
				checkError(t, c, err)
			default:
				t.Errorf("%s: expected %q%q, got output %s, error %v", c.Name, c.Expect, c.Error, out, err)
			}
		})
	}
	for _, class := range []Class{ClockAhead, NotEngineState, UnknownVersion, WrongSize, CorruptHeader, ForeignValue, NoExpiry} {
		if !classes[string(class)] {
			t.Errorf("no vector of class %s passed", class)
		}
	}
}

// Every shared-memory vector in one directory, read at once: the bad files
// are per-engine errors and every other engine is still read.
func TestGoldenVectorsAsOneDirectory(t *testing.T) {
	m := loadManifest(t)
	dir := t.TempDir()
	want := map[string]string{}
	for _, c := range m.Cases {
		if c.Kind == "shm" {
			writeShmVector(t, &m, c, dir)
			want[c.EngineID] = c.Error
		}
	}
	r := readVectorDir(t, &m, dir)
	if got, expect := FormatJSON(r.Engines), vectorFile(t, "shm/all.json"); !bytes.Equal(got, expect) {
		t.Errorf("got %s\nwant %s", got, expect)
	}
	failed := 0
	for _, e := range r.Errors {
		var err *Error
		if !errors.As(e.Err, &err) || string(err.Class) != want[e.Name] {
			t.Errorf("%s: %v, want class %q", e.Name, e.Err, want[e.Name])
		}
		failed++
	}
	for _, class := range want {
		if class != "" {
			failed--
		}
	}
	if failed != 0 {
		t.Errorf("%d errors more than bad vectors: %v", failed, r.Errors)
	}
}
