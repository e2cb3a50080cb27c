package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"example.invalid/engine-state/go/internal/formatdoc"
	"example.invalid/engine-state/go/internal/rustbin"
)

// esdump-go prints what esdump --json prints, for a live directory: Rust
// espublish engines (busy, idle, shutting down), one whose writer was killed
// (dead: its pid is gone), and golden vectors copied in (retired, torn, and
// bad files, which both report on stderr). The ages differ between the two
// runs (they are taken moments apart); everything else must be the same
// bytes.
func TestPrintsWhatEsdumpPrints(t *testing.T) {
	espublish := rustbin.Binary(t, "espublish")
	esdump := rustbin.Binary(t, "esdump")
	dir := t.TempDir()
	uri := "file://" + dir
	// A 60 s period: no engine publishes again while the test runs, so the
	// snapshots stay put between the two dumps.
	engine := func(id string, fields ...string) *rustbin.Child {
		args := []string{"--uri", uri, "--engine-id", id, "--period-ms", "60000", "--duration", "120"}
		for _, f := range fields {
			args = append(args, "--set", f)
		}
		return rustbin.Start(t, espublish, args...)
	}
	engine("busy", "num_running=12", "num_waiting=3", "gpu_blocks_total=30000", "gpu_blocks_free=10001",
		"pending_prefill_tokens=40961", "ongoing_decode_tokens=90113", "num_prefilling=2",
		"max_prefill_remaining=31007", "num_preempted=1", "step=7")
	engine("idle", "gpu_blocks_total=100", "gpu_blocks_free=100")
	engine("leaving", "num_running=1", "flags=2")
	engine("killed", "num_running=5").Kill()
	for vector, name := range map[string]string{
		"retired": "retired", "mid_write": "mid_write", "bad_magic": "bad_magic",
		"version_2_larger": "version_2_larger", "truncated": "truncated",
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "format", "vectors", "shm", vector+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--uri", uri, "--json", "--stale-after", "600000"}
	var rustOut, rustErr bytes.Buffer
	cmd := exec.Command(esdump, args...)
	cmd.Stdout, cmd.Stderr = &rustOut, &rustErr
	if err := cmd.Run(); err != nil {
		t.Fatalf("esdump: %v\n%s", err, rustErr.String())
	}
	var goOut, goErr bytes.Buffer
	if err := run(args, &goOut, &goErr); err != nil {
		t.Fatalf("esdump-go: %v", err)
	}

	ages := regexp.MustCompile(`("(?:heartbeat|capture)_age_ms": )([0-9.e+-]+)`)
	mask := func(b []byte) string { return ages.ReplaceAllString(string(b), "${1}AGE") }
	if mask(goOut.Bytes()) != mask(rustOut.Bytes()) {
		t.Errorf("stdout differs (ages masked):\nesdump-go:\n%s\nesdump:\n%s", goOut.String(), rustOut.String())
	}
	for _, m := range ages.FindAllStringSubmatch(goOut.String(), -1) {
		if v, err := strconv.ParseFloat(m[2], 64); err != nil || v < 0 {
			t.Errorf("age %q", m[2])
		}
	}
	for _, status := range []string{"fresh", "dead", "torn"} {
		if !strings.Contains(goOut.String(), `"status": "`+status+`"`) {
			t.Errorf("no %s engine in the comparison:\n%s", status, goOut.String())
		}
	}
	// The golden vectors carry fixed monotonic stamps: on a host up for
	// less time than they say (a fresh CI machine), they are ahead of its
	// clock and both tools add a clock_ahead line for each, naming how far
	// ahead at the moment of reading (which differs between the runs).
	ahead := regexp.MustCompile(`is [0-9]+ ms ahead of this reader's CLOCK_MONOTONIC`)
	maskErr := func(b []byte, prefix string) string {
		return ahead.ReplaceAllString(strings.ReplaceAll(string(b), prefix, ""), "is N ms ahead of this reader's CLOCK_MONOTONIC")
	}
	goLines := maskErr(goErr.Bytes(), "esdump-go: ")
	rustLines := maskErr(rustErr.Bytes(), "esdump: ")
	aheadLines := strings.Count(goLines, "is N ms ahead")
	if goLines != rustLines || strings.Count(goLines, "\n")-aheadLines != 3 {
		t.Errorf("stderr differs:\nesdump-go:\n%s\nesdump:\n%s", goErr.String(), rustErr.String())
	}
}

func TestURIs(t *testing.T) {
	for uri, want := range map[string]string{
		"file:///dev/shm/x": "/dev/shm/x", "file://localhost/a": "/a", "/b": "/b",
	} {
		if got, err := directory(uri); err != nil || got != want {
			t.Errorf("%s: %q %v", uri, got, err)
		}
	}
	for uri, says := range map[string]string{
		"redis://127.0.0.1:6379/0": "StateAtFetch", "file://relative": "absolute path", "http://x": "file:///dir",
		"file:///d?password=pw": "a query is not allowed in a file URI", "/d?token=pw": "rename a directory",
		"file://pw@localhost/d": "absolute path", "http://u:pw@x/?k=pw": "file:///dir",
	} {
		_, err := directory(uri)
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v", uri, err)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: the secret is shown: %v", uri, err)
		}
	}
}

// docs/FORMAT.md's redaction cases (table uri_redact), which the Rust side
// checks against redact: esdump-go hides the same parts.
func TestRedactsAsFormatMdSays(t *testing.T) {
	for _, row := range formatdoc.Table(t, "uri_redact") {
		if got := redact(row[0]); got != row[1] {
			t.Errorf("%s: got %s, FORMAT.md says %s", row[0], got, row[1])
		}
	}
}

// docs/FORMAT.md's escaping cases (table printable), which the Rust side
// checks against printable: esdump-go escapes each the same way.
func TestEscapesAsFormatMdSays(t *testing.T) {
	for _, row := range formatdoc.Table(t, "printable") {
		code, err := strconv.ParseUint(strings.TrimPrefix(row[0], "U+"), 16, 32)
		if err != nil {
			t.Fatalf("%q: %v", row, err)
		}
		if got, want := printable("a"+string(rune(code))+"b"), "a"+row[1]+"b"; got != want {
			t.Errorf("%s: got %q, FORMAT.md says %q", row[0], got, want)
		}
	}
}

// -cache ENGINE prints the engine's digest file: the golden file_active
// (docs/FORMAT.md, "Cache residency"; its fields in cache/file_active.json).
func TestCachePrintsTheDigestHeaderAndOneEntryPerLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	for _, d := range []string{dir, dir + ".cache"} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	vectors := filepath.Join("..", "..", "..", "format", "vectors", "cache")
	for name, vector := range map[string]string{"e0": "file_active.bin", "bad": "file_unsorted.bin"} {
		b, err := os.ReadFile(filepath.Join(vectors, vector))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir+".cache", name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run([]string{"--uri", "file://" + dir, "-cache", "e0"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	want := "engine_id=e0 state=active version=3 count=5 held=5 capacity=8 generation=7 writer_pid=4242 " +
		"kv_block_size=16 captured_mono_ns=1999750000000 captured_unix_ns=1767225612345678901 " +
		"created_unix_ns=1767225600000000000\n"
	for _, block := range []uint64{529658768147133005, 1021543921847717352, 9578594885378884609,
		11424523811686388455, 15138529336586489370} {
		want += leftPad(strconv.FormatUint(block, 16)) + "\n"
	}
	if stdout.String() != want {
		t.Errorf("got\n%s\nwant\n%s", stdout.String(), want)
	}
	for args, message := range map[string]string{
		"bad":    "entries 1 and 2 are not strictly ascending",
		"absent": "no such file or directory",
		"../e0":  "is not an engine id",
	} {
		err := run([]string{"--uri", "file://" + dir, "-cache", args}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), message) {
			t.Errorf("-cache %s: %v, want %q", args, err, message)
		}
	}
}

func leftPad(hex string) string { return strings.Repeat("0", 16-len(hex)) + hex }

// -replicas: the router vectors in <dir>.routers, read as replicas, the
// bad files on stderr; with the Rust binaries, exactly what esdump
// --replicas --json prints (the ages masked: they are taken moments apart).
func TestReplicasPrintsWhatEsdumpPrints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	routers := dir + ".routers"
	if err := os.MkdirAll(routers, 0o700); err != nil {
		t.Fatal(err)
	}
	vectors := filepath.Join("..", "..", "..", "format", "vectors", "routers")
	for _, name := range []string{"active", "empty", "retired", "full", "bad_magic"} {
		b, err := os.ReadFile(filepath.Join(vectors, name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(routers, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run([]string{"--uri", "file://" + dir, "-replicas"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var replicas []struct {
		ReplicaID string `json:"replica_id"`
		Status    string
		Engines   map[string]map[string]uint64
	}
	if err := json.Unmarshal(stdout.Bytes(), &replicas); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(replicas) != 4 || replicas[0].ReplicaID != "active" || replicas[1].ReplicaID != "empty" ||
		replicas[3].ReplicaID != "retired" || replicas[3].Status != "dead" || len(replicas[1].Engines) != 0 ||
		len(replicas[2].Engines) != 256 || replicas[0].Engines["e-b"]["num_requests"] != 5 {
		t.Errorf("%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "bad_magic: not a router reservations file") {
		t.Errorf("stderr: %s", stderr.String())
	}
	esdump := rustbin.Binary(t, "esdump")
	out, err := exec.Command(esdump, "--uri", "file://"+dir, "--replicas", "--json").Output()
	if err != nil {
		t.Fatalf("esdump --replicas --json: %v", err)
	}
	ages := regexp.MustCompile(`"(heartbeat|changed)_age_ms": [0-9.e+-]+`)
	mask := func(b []byte) string { return ages.ReplaceAllString(string(b), `"${1}_age_ms": AGE`) }
	if got, want := mask(stdout.Bytes()), mask(out); got != want {
		t.Errorf("esdump-go -replicas:\n%s\nesdump --replicas --json:\n%s", got, want)
	}
}
