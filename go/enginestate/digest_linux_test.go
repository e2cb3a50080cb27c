package enginestate

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func digestOf(blocks ...uint64) *CacheDigest {
	sorted := append([]uint64(nil), blocks...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	return &CacheDigest{Version: 1, Blocks: sorted}
}

func TestLeadingBlocksIsThePromptsLeadingRunInTheDigest(t *testing.T) {
	tokens := make([]uint32, 6*BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(i % 1000)
	}
	prompt := BlockHashes(tokens)
	if len(prompt) != 6 {
		t.Fatalf("%d blocks", len(prompt))
	}
	for held := 0; held <= len(prompt); held++ {
		d := digestOf(prompt[:held]...)
		if got := d.LeadingBlocks(prompt); got != held {
			t.Errorf("held %d: LeadingBlocks %d", held, got)
		}
		if short := prompt[:2]; d.LeadingBlocks(short) != min(held, 2) {
			t.Errorf("held %d, a 2-block prompt: %d", held, d.LeadingBlocks(short))
		}
	}
	var none *CacheDigest
	if none.LeadingBlocks(prompt) != 0 || none.Contains(prompt[0]) || none.Len() != 0 {
		t.Error("a nil digest holds something")
	}
	if digestOf(prompt...).LeadingBlocks(nil) != 0 {
		t.Error("an empty prompt has a hit")
	}
}

// A digest that is not prefix-closed (a writer's bug) gives a run boundary,
// never a failure: block n-1 listed, block n not (or the prompt's end).
func TestLeadingBlocksOnADigestThatIsNotPrefixClosedIsARunBoundary(t *testing.T) {
	prompt := []uint64{10, 20, 30, 40, 50, 60, 70}
	for _, d := range []*CacheDigest{digestOf(10, 30, 40), digestOf(20, 30, 40, 50, 60, 70), digestOf(10, 20, 40, 60, 70),
		digestOf(70), digestOf(10, 20, 30, 40, 50, 60)} {
		n := d.LeadingBlocks(prompt)
		if n < 0 || n > len(prompt) || (n > 0 && !d.Contains(prompt[n-1])) || (n < len(prompt) && d.Contains(prompt[n])) {
			t.Errorf("%v: %d is no run boundary", d.Blocks, n)
		}
	}
}

func TestDecodeFetchedCacheUsesOnlyADigestOfTheRecordsGenerationAndVersion(t *testing.T) {
	value, err := os.ReadFile(filepath.Join(vectorsDir(), "cache", "value_active.bin")) // generation 7, version 3
	if err != nil {
		t.Fatal(err)
	}
	key := CacheKey(DefaultPrefix, "e0")
	if key != "engine_state:cache:e0" {
		t.Fatalf("key %q", key)
	}
	if d, err := DecodeFetchedCache(key, value, 7, 3); err != nil || d.Version != 3 || d.Len() != 5 {
		t.Fatalf("%+v %v", d, err)
	}
	if d, err := DecodeFetchedCache(key, value, 7, 2); err != nil || d.Version != 3 {
		t.Fatalf("ahead of the record: %+v %v", d, err)
	}
	unsorted, err := os.ReadFile(filepath.Join(vectorsDir(), "cache", "value_unsorted.bin"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		value         []byte
		generation    uint64
		version       uint64
		damaged       bool
		what, refused string
	}{
		{"missing", nil, 7, 3, false, "holds no value", ""},
		{"other generation", value, 8, 3, false, "generation 7 of the engine, not to the record's 8", ""},
		{"older", value, 7, 4, false, "holds version 3, older than the version 4", ""},
		{"too large", make([]byte, CacheFetchEnd+1), 7, 3, true, "larger than the largest digest", ""},
		{"unsorted", unsorted, 7, 3, true, "not strictly ascending", string(CorruptCache)},
		{"foreign", value[:100], 7, 3, true, "bytes, but its header says 128", string(WrongSize)},
	} {
		d, err := DecodeFetchedCache(key, c.value, c.generation, c.version)
		var e *Error
		// Not there for the record is missing_cache; a value that is no
		// usable digest corrupt_cache (Damaged).
		class := MissingCache
		if c.damaged {
			class = CorruptCache
		}
		if d != nil || !errors.As(err, &e) || e.Class != class || e.Name != key || e.Damaged != c.damaged ||
			!strings.Contains(e.What, c.what) {
			t.Errorf("%s: %+v, %v (%+v), want class %s", c.name, d, err, e, class)
			continue
		}
		var refused *DigestError
		if got := errors.As(err, &refused); got != (c.refused != "") || (got && string(refused.Class) != c.refused) {
			t.Errorf("%s: cause %v, want class %q", c.name, e.Err, c.refused)
		}
	}
}

func TestNeedsAndUsableDigestFollowTheFreshnessRule(t *testing.T) {
	held := &CacheDigest{Version: 3}
	e := EngineState{Status: Fresh, Generation: 7}
	e.Snapshot.CacheVersion = 3
	if NeedsDigest(&e, held) || !NeedsDigest(&e, nil) || UsableDigest(&e, held, 7) != held {
		t.Error("a fresh engine naming the held version")
	}
	e.Snapshot.CacheVersion = 4
	if !NeedsDigest(&e, held) {
		t.Error("a version that moved is not fetched")
	}
	if UsableDigest(&e, held, 7) != nil {
		t.Error("a digest older than the version the snapshot names is used")
	}
	e.Snapshot.CacheVersion = 2
	if NeedsDigest(&e, held) || UsableDigest(&e, held, 7) != held {
		t.Error("a held digest newer than the snapshot's version is fetched again or not used")
	}
	e.Snapshot.CacheVersion = 0
	if NeedsDigest(&e, held) || NeedsDigest(&e, nil) || UsableDigest(&e, held, 7) != nil {
		t.Error("an engine that publishes no digest")
	}
	e.Snapshot.CacheVersion = 3
	if UsableDigest(&e, held, 6) != nil {
		t.Error("a digest of another generation is used")
	}
	for _, s := range []Status{Stale, Dead, Torn} {
		e.Status = s
		if UsableDigest(&e, held, 7) != nil {
			t.Errorf("used while %v", s)
		}
	}
}
