package enginestate

import (
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"example.invalid/engine-state/go/internal/rustbin"
)

func TestStatStateIsAfterTheLastParenthesis(t *testing.T) {
	for stat, want := range map[string]byte{
		"42 (vllm) S 1 42 42 0": 'S',
		"42 (a) Z (b) R 1 2 3":  'R',
		"42 (x) y) Z 1 42":      'Z',
		"42 ( ) ) X 0":          'X',
		"42 (no close":          0,
		"42 (x)":                0,
	} {
		if got := statState([]byte(stat)); got != want {
			t.Errorf("%q: %q, want %q", stat, got, want)
		}
	}
}

func procState(t *testing.T, pid int) byte {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatalf("the killed writer was reaped: %v", err)
	}
	return statState(stat)
}

// A writer (espublish) killed with SIGKILL by a parent that does not reap
// it yet is a zombie: kill(pid, 0) still succeeds, but the reader reports
// it dead, long before its heartbeat would make it stale (stale_after is an
// hour here), while it is still a zombie.
func TestZombieWriterIsDead(t *testing.T) {
	espublish := rustbin.Binary(t, "espublish")
	dir := t.TempDir()
	writer := rustbin.Start(t, espublish, "--engine-id", "zombie", "--period-ms", "20", "--uri", "file://"+dir)
	opts := DefaultOptions()
	opts.Freshness.StaleAfter = time.Hour
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var e EngineState
	if !d.ReadEngine("zombie", &e) || e.Status != Fresh {
		t.Fatalf("before the kill: %+v", e)
	}
	pid := writer.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); procState(t, pid) != 'Z'; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed writer never became a zombie")
		}
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("kill(pid, 0) on a zombie: %v (the case this test is about)", err)
	}
	// Dead once the heartbeat is late (two periods); 10 s is only a bound
	// for a loaded host.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if !d.ReadEngine("zombie", &e) {
			t.Fatal("the engine is gone")
		}
		if e.Status == Dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a zombie writer reads %v", e.Status)
		}
	}
	if procState(t, pid) != 'Z' {
		t.Fatal("the writer was reaped before the reader called it dead")
	}
	// A listing asks again (with the heartbeat late): still dead.
	if err := d.Rescan(); err != nil {
		t.Fatal(err)
	}
	if d.ReadEngine("zombie", &e); e.Status != Dead {
		t.Fatalf("after a listing: %v", e.Status)
	}
}
