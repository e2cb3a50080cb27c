package enginestate

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The shared reservations vectors (format/vectors/routers/, the manifest's
// router_cases): every case read as a reader does, the file written as
// <dir>.routers/<replica id>, opened and read once with RouterFile; the
// reading field by field as its JSON, or the error class.

type routerCase struct {
	Name         string
	Kind         string
	What         string
	File         string
	ReplicaID    string `json:"replica_id"`
	Expect       string
	Error        string
	FoundVersion uint32 `json:"found_version"`
}

func loadRouterCases(t *testing.T) []routerCase {
	t.Helper()
	var m struct {
		RouterCases []routerCase `json:"router_cases"`
	}
	if err := json.Unmarshal(vectorFile(t, "manifest.json"), &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(m.RouterCases) == 0 {
		t.Fatal("manifest.json has no router_cases")
	}
	return m.RouterCases
}

// routerJSON is a reading as the vectors' JSON has it.
func routerJSON(f *RouterFile, r *RouterRecord) map[string]interface{} {
	num := func(v uint64) interface{} { return json.Number(strconv.FormatUint(v, 10)) }
	h := f.Header()
	state := map[uint64]string{StateActive: "active", StateRetired: "retired"}[r.State]
	engines := make([]interface{}, len(r.Engines))
	for i, e := range r.Engines {
		entry := map[string]interface{}{"engine_id": e.EngineID}
		for j, w := range e.Reservations.Words() {
			entry[ReservationFieldNames[j]] = num(w)
		}
		engines[i] = entry
	}
	return map[string]interface{}{
		"replica_id":          r.ReplicaID,
		"state":               state,
		"writer_pid":          num(uint64(h.WriterPID)),
		"writer_pid_ns":       num(h.WriterPIDNs),
		"generation":          num(r.Generation),
		"created_unix_ns":     num(h.CreatedUnixNs),
		"heartbeat_period_us": num(uint64(h.HeartbeatPeriodUs)),
		"capacity":            num(uint64(h.Capacity)),
		"seq":                 num(r.Seq),
		"heartbeat_mono_ns":   num(r.HeartbeatMonoNs),
		"changed_mono_ns":     num(r.ChangedMonoNs),
		"count":               num(uint64(len(r.Engines))),
		"engines":             engines,
	}
}

func writeRouterCase(t *testing.T, dir string, c routerCase) string {
	t.Helper()
	path := filepath.Join(dir, c.ReplicaID)
	mustWrite(t, path, vectorFile(t, c.File))
	return path
}

func TestRouterGoldenVectors(t *testing.T) {
	classes := map[string]bool{}
	for _, c := range loadRouterCases(t) {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			if c.Kind != "router_file" {
				t.Fatalf("unknown kind %q", c.Kind)
			}
			dir := RoutersDir(filepath.Join(t.TempDir(), "state"))
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := writeRouterCase(t, dir, c)
			f, err := OpenRouterFile(path)
			var r RouterRecord
			if err == nil {
				defer f.Close()
				r, err = f.Read()
			}
			switch {
			case c.Expect != "" && err == nil:
				want := decodeJSONNumbers(t, vectorFile(t, c.Expect))
				if got := routerJSON(f, &r); !reflect.DeepEqual(got, want) {
					t.Errorf("%s (%s):\n got %v\nwant %v", c.Name, c.What, got, want)
				}
			case c.Error != "" && err != nil:
				var e *RouterError
				if !errors.As(err, &e) {
					t.Fatalf("%s: error %v is not a *RouterError", c.Name, err)
				}
				if string(e.Class) != c.Error {
					t.Errorf("%s (%s): class %s, want %s (%v)", c.Name, c.What, e.Class, c.Error, err)
				}
				if e.Class == UnknownVersion && e.Found != c.FoundVersion {
					t.Errorf("%s: found version %d, want %d", c.Name, e.Found, c.FoundVersion)
				}
				if e.Name != path {
					t.Errorf("%s: the error names %q", c.Name, e.Name)
				}
				classes[c.Error] = true
			default:
				t.Errorf("%s (%s): expected %q%q, got %+v, error %v", c.Name, c.What, c.Expect, c.Error, r, err)
			}
		})
	}
	for _, class := range []Class{NotRouter, UnknownVersion, WrongSize, CorruptRouter, TornRouter} {
		if !classes[string(class)] {
			t.Errorf("no vector of class %s passed", class)
		}
	}
}

// The vectors in one routers directory, read by Replicas: every good case
// a replica (retired: dead; the others' heartbeats are vector stamps, so
// judged at the manifest's clock they are fresh, torn ones torn), every
// bad one a per-replica error of its class, and the own id left out.
func TestReplicasReadTheVectorsDirectory(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	dir := RoutersDir(state)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	want := map[string]Status{}
	wantErrors := map[string]Class{}
	for _, c := range loadRouterCases(t) {
		writeRouterCase(t, dir, c)
		switch {
		case c.Name == "retired":
			want[c.ReplicaID] = Dead
		case c.Error == string(TornRouter):
			want[c.ReplicaID] = Torn
		case c.Error != "":
			wantErrors[c.ReplicaID] = Class(c.Error)
		default:
			want[c.ReplicaID] = Fresh
		}
	}
	delete(want, "empty")
	r, err := OpenReplicas(state+"/", "empty", DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// The vectors' heartbeat: 1999000000000 ns (START_MONO_NS), and no pid
	// namespace (0): the heartbeat alone decides.
	var reading ReplicaReading
	if err := r.ReadAt(&reading, 1_999_500_000_000); err != nil {
		t.Fatal(err)
	}
	got := map[string]Status{}
	for i, s := range reading.Replicas {
		got[s.ReplicaID] = s.Status
		if i > 0 && reading.Replicas[i-1].ReplicaID >= s.ReplicaID {
			t.Errorf("not sorted: %s after %s", s.ReplicaID, reading.Replicas[i-1].ReplicaID)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
	gotErrors := map[string]Class{}
	for _, e := range reading.Errors {
		var re *RouterError
		if !errors.As(e.Err, &re) {
			t.Fatalf("%s: %v is not a *RouterError", e.Name, e.Err)
		}
		gotErrors[e.Name] = re.Class
	}
	if !reflect.DeepEqual(gotErrors, wantErrors) {
		t.Errorf("errors %v, want %v", gotErrors, wantErrors)
	}
	active, _ := reading.Get("active")
	if len(active.Engines) != 3 || active.Engines[1].EngineID != "e-b" || active.Engines[1].NumRequests != 5 {
		t.Errorf("active: %+v", active)
	}
	// Past stale_after the heartbeat is stale.
	if err := r.ReadAt(&reading, 1_999_000_000_000+uint64(DefaultStaleAfter)+1); err != nil {
		t.Fatal(err)
	}
	if s, _ := reading.Get("active"); s.Status != Stale {
		t.Errorf("active after stale_after: %s", s.Status)
	}
}

// The Redis value: its bytes pinned (the same as redis/src's golden bytes
// test), decoded back, and malformed values refused by class.
func TestRouterValueGoldenBytes(t *testing.T) {
	counters := func(base uint64) Reservations {
		return ReservationsFromWords([ReservationWords]uint64{base, base + 1, base + 2, base + 3, base + 4, base + 5})
	}
	v := RouterValue{WriterPID: 0x01020304, HeartbeatPeriodUs: 50000, State: StateActive, Generation: 0x1112,
		HeartbeatSeq: 0x2122, HeartbeatMonoNs: 0x31323334, TTLMs: 2000,
		Engines: []EngineReservations{{"e-1", counters(1)}, {"e-2", counters(0x100)}}}
	b := v.Encode()
	header := []byte{
		'E', 'S', 'R', 'O', 'U', 'T', 'E', 'R',
		1, 0, 0, 0, 64, 0, 128, 0,
		0x04, 0x03, 0x02, 0x01, 0x50, 0xc3, 0, 0,
		1, 0, 0, 0, 0, 0, 0, 0,
		0x12, 0x11, 0, 0, 0, 0, 0, 0,
		0x22, 0x21, 0, 0, 0, 0, 0, 0,
		0x34, 0x33, 0x32, 0x31, 0, 0, 0, 0,
		0xd0, 0x07, 0, 0, 2, 0, 0, 0,
	}
	if len(b) != 64+2*128 || !reflect.DeepEqual(b[:64], header) {
		t.Fatalf("header % x", b[:64])
	}
	if string(b[64:68]) != "e-1\x00" || binary.LittleEndian.Uint64(b[64+64:]) != 1 || b[192+65] != 1 {
		t.Fatalf("slots % x", b[64:])
	}
	got, err := DecodeRouterValue("k", b)
	if err != nil || !reflect.DeepEqual(got, v) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	key := RouterKey(DefaultPrefix, "r0")
	if key != "engine_state:router:r0" || RouterRegistryKey("p:") != "p:routers" {
		t.Errorf("keys %q %q", key, RouterRegistryKey("p:"))
	}
	bad := func(change func([]byte) []byte) []byte { return change(append([]byte(nil), b...)) }
	for _, c := range []struct {
		name  string
		value []byte
		class Class
	}{
		{"engine record", (&Record{State: StateActive}).Encode(), ForeignValue},
		{"short", b[:10], ForeignValue},
		{"version 2", bad(func(b []byte) []byte { b[8] = 2; return b }), UnknownVersion},
		{"slot size", bad(func(b []byte) []byte { b[14] = 64; return b }), ForeignValue},
		{"one slot missing", b[:64+128], ForeignValue},
		{"count over max", bad(func(b []byte) []byte { b[61] = 1; return b }), CorruptRouter},
		{"state 3", bad(func(b []byte) []byte { b[24] = 3; return b }), CorruptRouter},
		{"duplicate", bad(func(b []byte) []byte { b[192+2] = '1'; return b }), CorruptRouter},
		{"bad id", bad(func(b []byte) []byte { b[64+1] = '/'; return b }), CorruptRouter},
		{"padding", bad(func(b []byte) []byte { b[64+120] = 1; return b }), CorruptRouter},
	} {
		_, err := DecodeRouterValue(key, c.value)
		var e *RouterError
		if !errors.As(err, &e) || e.Class != c.class || e.Name != key {
			t.Errorf("%s: %v, want class %s", c.name, err, c.class)
		}
	}
	// A fetch: aged by ttl_ms - PTTL; without expiry refused; gone is dead.
	f := DefaultFreshness()
	s, err := ReplicaAtFetch("r0", key, b, 1500, f, 7)
	if err != nil || s.Status != Fresh || s.HeartbeatAge.Milliseconds() != 500 || len(s.Engines) != 2 || s.ReadMonoNs != 7 {
		t.Errorf("fetched %+v, %v", s, err)
	}
	if s, _ := ReplicaAtFetch("r0", key, b, -2, f, 7); s.Status != Dead || len(s.Engines) != 0 {
		t.Errorf("gone: %+v", s)
	}
	for _, pttl := range []int64{-1, 2001} {
		var e *RouterError
		if _, err := ReplicaAtFetch("r0", key, b, pttl, f, 7); !errors.As(err, &e) || e.Class != NoExpiry {
			t.Errorf("PTTL %d: %v", pttl, err)
		}
	}
	v.State = StateRetired
	if s, _ := ReplicaAtFetch("r0", key, v.Encode(), 1500, f, 7); s.Status != Dead {
		t.Errorf("retired: %s", s.Status)
	}
	if _, err := DecodeFetchedRouter(key, make([]byte, MaxRouterValueSize+1), 1); err == nil {
		t.Error("an oversized value was accepted")
	}
}

// A file truncated under the mapping reads torn (SIGBUS absorbed), then is
// opened again at the next listing and reported; a FIFO is refused without
// blocking; a missing routers directory is no replica.
func TestReplicasSurviveTruncationAndRefuseAFIFO(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	r, err := OpenReplicas(state, "", DefaultOptions())
	if err != nil {
		t.Fatalf("no routers directory: %v", err)
	}
	if reading, err := r.Read(); err != nil || len(reading.Replicas)+len(reading.Errors) != 0 {
		t.Fatalf("no routers directory: %+v, %v", reading, err)
	}
	r.Close()
	dir := RoutersDir(state)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	var active routerCase
	for _, c := range loadRouterCases(t) {
		if c.Name == "active" {
			active = c
		}
	}
	path := writeRouterCase(t, dir, active)
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	within(t, 5*time.Second, func() { r, err = OpenReplicas(state, "", opts) })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var reading ReplicaReading
	if err := r.ReadAt(&reading, 1_999_500_000_000); err != nil {
		t.Fatal(err)
	}
	if s, ok := reading.Get("active"); !ok || s.Status != Fresh || len(reading.Errors) != 1 ||
		reading.Errors[0].Name != "fifo" {
		t.Fatalf("before: %+v", reading)
	}
	// To 0 bytes: the first load faults (a shorter cut leaves page 0
	// readable, and the zeros after the cut are a corrupt_router error).
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadAt(&reading, 1_999_500_000_000); err != nil {
		t.Fatal(err)
	}
	if s, ok := reading.Get("active"); !ok || s.Status != Torn || len(s.Engines) != 0 {
		t.Fatalf("truncated: %+v", reading)
	}
	if err := r.Rescan(); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadAt(&reading, 1_999_500_000_000); err != nil {
		t.Fatal(err)
	}
	var e *RouterError
	if _, ok := reading.Get("active"); ok || len(reading.Errors) != 2 || !errors.As(reading.Errors[0].Err, &e) ||
		e.Class != WrongSize {
		t.Fatalf("after the listing: %+v", reading)
	}
}
