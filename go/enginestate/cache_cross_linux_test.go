package enginestate

import (
	"testing"

	"example.invalid/engine-state/go/internal/rustbin"
)

// A Rust writer (espublish --cache-blocks 5: the router block hashes of
// token ids 0..5*512) publishes a digest; this reader finds exactly those
// hashes, and a prompt of those tokens hits all 5 blocks.
func TestCrossLanguageDigestIsTheRustWritersBlockHashes(t *testing.T) {
	espublish := rustbin.Binary(t, "espublish")
	dir := t.TempDir()
	rustbin.Start(t, espublish, "--cache-blocks", "5", "--engine-id", "cached", "--period-ms", "20", "--uri", "file://"+dir)
	opts := DefaultOptions()
	opts.CacheDigests = true
	d, err := OpenDir(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tokens := make([]uint32, 5*512+100) // a partial block after the five
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	want := BlockHashes(tokens)
	if len(want) != 5 {
		t.Fatalf("BlockHashes: %d blocks", len(want))
	}
	// rustbin.Start returned on espublish's first line, printed once its
	// first snapshot is published, and it publishes the digest before that
	// snapshot: one read finds both.
	var e EngineState
	if !d.ReadEngine("cached", &e) {
		t.Fatal("the engine is not found")
	}
	if e.Status != Fresh || e.Snapshot.CacheBlocks != 5 || e.Cache.Len() != 5 {
		t.Fatalf("%+v", e)
	}
	for i, h := range want {
		if !e.Cache.Contains(h) {
			t.Errorf("block %d (%#016x) not in the digest", i, h)
		}
	}
	if got := e.Cache.LeadingBlocks(want); got != 5 {
		t.Errorf("LeadingBlocks: %d, want 5", got)
	}
	other := BlockHashes(make([]uint32, 1024)) // token 0 throughout
	if got := e.Cache.LeadingBlocks(other); got != 0 {
		t.Errorf("LeadingBlocks of another prompt: %d, want 0", got)
	}
}
