package enginestate

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"example.invalid/engine-state/go/internal/formatdoc"
)

// serde_json's output for these f64 values (printed by serde_json 1.x, the
// encoder of esdump --json).
func TestFloatsAreFormattedAsSerdeJSONDoes(t *testing.T) {
	for _, c := range []struct {
		f    float64
		want string
	}{
		{0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1, "1.0"}, {0.1, "0.1"},
		{1e-4, "0.0001"}, {1e-5, "0.00001"}, {1.5e-5, "0.000015"}, {1e-6, "1e-6"}, {1.5e-6, "1.5e-6"},
		{1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1.5e16, "1.5e+16"},
		{123456789012345680.0, "1.2345678901234568e+17"}, {1e21, "1e+21"}, {1e22, "1e+22"},
		{0.6666333333333334, "0.6666333333333334"}, {2000000.0, "2000000.0"}, {1.234, "1.234"},
		{5e-324, "5e-324"}, {math.MaxFloat64, "1.7976931348623157e+308"},
		{9007199254740993.0, "9007199254740992.0"}, {18446744073709551.615, "1.844674407370955e+16"},
		{1e300, "1e+300"}, {12345.678e10, "123456780000000.0"}, {-2.5, "-2.5"},
		{math.NaN(), "null"}, {math.Inf(1), "null"},
	} {
		if got := string(appendJSONFloat(nil, c.f)); got != c.want {
			t.Errorf("%v: got %s, want %s", c.f, got, c.want)
		}
	}
}

// docs/FORMAT.md's JSON float cases (table json_floats), which the Rust
// side checks against serde_json: esdump-go prints each the same way.
func TestFloatsAreFormattedAsFormatMdSays(t *testing.T) {
	rows := formatdoc.Table(t, "json_floats")
	for _, row := range rows {
		f, err := strconv.ParseFloat(row[0], 64)
		if err != nil {
			t.Fatalf("%q: %v", row, err)
		}
		if got := string(appendJSONFloat(nil, f)); got != row[1] {
			t.Errorf("%s: got %s, FORMAT.md says %s", row[0], got, row[1])
		}
	}
	if len(rows) < 10 {
		t.Errorf("only %d rows in json_floats", len(rows))
	}
}

func TestStringsAreEscapedAsSerdeJSONDoes(t *testing.T) {
	got := string(appendJSONString(nil, "a\"b\\c\n\t\x1b\x7fé<"))
	if want := `"a\"b\\c\n\t\u001b` + "\x7fé<\""; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestCompactJSONHasTheContractKeysInOrder(t *testing.T) {
	e := EngineState{EngineID: "e0", Status: Stale, HeartbeatAge: 1500 * time.Microsecond,
		Snapshot: Snapshot{NumRunning: 4, GPUBlocksTotal: 10, GPUBlocksFree: 4}}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"engine_id":"e0","captured_mono_ns":0,"captured_unix_ns":0,"step":0,"num_running":4,` +
		`"num_waiting":0,"gpu_blocks_total":10,"gpu_blocks_free":4,"pending_prefill_tokens":0,` +
		`"ongoing_decode_tokens":0,"num_prefilling":0,"max_prefill_remaining":0,"num_preempted":0,` +
		`"flags":0,"cache_blocks":0,"cache_version":0,"status":"stale","heartbeat_age_ms":1.5,"capture_age_ms":0.0,"gpu_kv_used_frac":0.6}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	if string(FormatJSON(nil)) != "[]\n" {
		t.Errorf("no engines: %q", FormatJSON(nil))
	}
}

func TestClassifyFollowsTheRule(t *testing.T) {
	f := DefaultFreshness()
	obs := func(hb, capture time.Duration) Observation {
		return Observation{HeartbeatAge: hb, CaptureAge: capture, Writer: Alive}
	}
	for _, c := range []struct {
		o    Observation
		want Status
	}{
		{obs(10*time.Millisecond, 10*time.Millisecond), Fresh},
		{obs(2*time.Second, 0), Fresh},
		{obs(2*time.Second+1, 0), Stale},
		{obs(0, 30*time.Second+1), Stale},
		{Observation{Idle: true, CaptureAge: time.Hour}, Fresh},
		{Observation{Idle: true, HeartbeatAge: 5 * time.Second}, Stale},
		{Observation{Retired: true}, Dead},
		{Observation{Writer: Gone}, Dead},
		{Observation{Torn: true, Retired: true}, Torn},
	} {
		if got := f.Classify(c.o); got != c.want {
			t.Errorf("%+v: %s, want %s", c.o, got, c.want)
		}
	}
}

func TestRedisKeysAndRecordRoundTrip(t *testing.T) {
	if RegistryKey("p:") != "p:engines" || EngineKey("p:", "e0") != "p:engine:e0" {
		t.Error("key schema")
	}
	r := Record{WriterPID: 42, PublishPeriodUs: 50000, State: StateActive, Generation: 7, HeartbeatSeq: 9,
		HeartbeatMonoNs: 123456789, TTLMs: 2000, WriteDelayUs: 15, Snapshot: Snapshot{NumRunning: 3, Flags: 1}}
	got, err := DecodeRecord("k", r.Encode())
	if err != nil || got != r {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	expired, err := StateAtFetch("e0", "k", nil, -2, DefaultFreshness(), 0)
	if err != nil || expired.Status != Dead || expired.HeartbeatAge != DefaultStaleAfter {
		t.Errorf("expired key: %+v, %v", expired, err)
	}
	if _, err := StateAtFetch("e0", "k", append(r.Encode(), 0), 1000, DefaultFreshness(), 0); err == nil {
		t.Error("a value longer than a record was accepted")
	}
}
