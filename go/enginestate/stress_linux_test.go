package enginestate

import (
	"testing"
	"time"

	"example.invalid/engine-state/go/internal/rustbin"
)

// A Rust writer (espublish --stress: word i of snapshot v is v*(i+1))
// publishes as fast as it can while this reader checks a million reads:
// no torn copy may ever be accepted.
func TestCrossLanguageStressAcceptsNoTornSnapshot(t *testing.T) {
	espublish := rustbin.Binary(t, "espublish")
	dir := t.TempDir()
	rustbin.Start(t, espublish, "--stress", "--engine-id", "stress", "--duration", "300", "--uri", "file://"+dir)
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const wantAccepted = 1_000_000
	var reads, accepted, torn, changes, last uint64
	started := time.Now()
	// A million accepted reads, and on until the writer has published 1,000+
	// snapshots during them (bounded): on a loaded 2-core host the writer
	// may get little CPU while the reads run.
	for accepted < wantAccepted || changes <= 1000 {
		if time.Since(started) > 120*time.Second {
			t.Fatalf("after %v: %d reads, %d accepted, %d torn, %d distinct snapshots", time.Since(started), reads, accepted, torn, changes)
		}
		reads++
		var e EngineState
		if !d.ReadEngine("stress", &e) {
			t.Fatal("the stress writer's engine is gone")
		}
		if e.Status == Torn {
			torn++
			continue
		}
		w := e.Snapshot.Words()
		for i := range w {
			if w[i] != w[0]*uint64(i+1) {
				t.Fatalf("torn snapshot accepted (word %d): %v", i, w)
			}
		}
		accepted++
		if w[0] != last {
			if w[0] < last {
				t.Fatalf("went back: %d after %d", w[0], last)
			}
			last = w[0]
			changes++
		}
	}
	t.Logf("%d reads in %v: %d accepted, %d torn, %d distinct snapshots", reads, time.Since(started), accepted, torn, changes)
}
