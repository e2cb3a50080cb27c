package enginestate

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
)

// The cache residency vectors (the section "Cache residency vectors" of
// format/vectors/README.md): every case of the manifest's cache_cases, and
// the router block hashes.

type cacheCase struct {
	Name         string
	Kind         string
	What         string
	File         string
	EngineID     string `json:"engine_id"`
	Generation   uint64
	Expect       string
	Error        string
	FoundVersion uint32 `json:"found_version"`
}

func loadCacheCases(t *testing.T) []cacheCase {
	t.Helper()
	var m struct {
		CacheCases []cacheCase `json:"cache_cases"`
	}
	if err := json.Unmarshal(vectorFile(t, "manifest.json"), &m); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(m.CacheCases) == 0 {
		t.Fatal("manifest.json has no cache_cases")
	}
	return m.CacheCases
}

// digestJSON is a record as the vectors' JSON has it: every field by its
// name, numbers as their decimal text (u64 values above 2^53 included).
func digestJSON(r *DigestRecord) map[string]interface{} {
	num := func(v uint64) interface{} { return json.Number(strconv.FormatUint(v, 10)) }
	state := map[uint64]string{StateActive: "active", StateRetired: "retired"}[r.State]
	blocks := make([]interface{}, len(r.Digest.Blocks))
	for i, b := range r.Digest.Blocks {
		blocks[i] = num(b)
	}
	return map[string]interface{}{
		"blocks":           blocks,
		"capacity":         num(uint64(r.Capacity)),
		"captured_mono_ns": num(r.Digest.CapturedMonoNs),
		"captured_unix_ns": num(r.CapturedUnixNs),
		"count":            num(uint64(r.Digest.Len())),
		"created_unix_ns":  num(r.CreatedUnixNs),
		"generation":       num(r.Generation),
		"held":             num(r.Held),
		"kv_block_size":    num(uint64(r.KVBlockSize)),
		"state":            state,
		"version":          num(r.Digest.Version),
		"writer_pid":       num(uint64(r.WriterPID)),
	}
}

func decodeJSONNumbers(t *testing.T, b []byte) map[string]interface{} {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out map[string]interface{}
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// readCacheCase opens a cache_file case as <dir>.cache/<id> and reads it
// once, or decodes a cache_value case.
func readCacheCase(t *testing.T, c cacheCase) (DigestRecord, error) {
	t.Helper()
	b := vectorFile(t, c.File)
	switch c.Kind {
	case "cache_file":
		cacheDir := CacheDir(filepath.Join(t.TempDir(), "state"))
		if err := os.Mkdir(cacheDir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(cacheDir, c.EngineID)
		mustWrite(t, path, b)
		f, err := OpenDigestFile(path)
		if err != nil {
			return DigestRecord{}, err
		}
		defer f.Close()
		return f.Read()
	case "cache_value":
		return DecodeDigestValue(CacheKey(DefaultPrefix, c.EngineID), b)
	}
	t.Fatalf("unknown kind %q", c.Kind)
	return DigestRecord{}, nil
}

func TestCacheGoldenVectors(t *testing.T) {
	classes := map[string]bool{}
	for _, c := range loadCacheCases(t) {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			r, err := readCacheCase(t, c)
			switch {
			case c.Expect != "" && err == nil:
				want := decodeJSONNumbers(t, vectorFile(t, c.Expect))
				if got := digestJSON(&r); !reflect.DeepEqual(got, want) {
					t.Errorf("%s (%s):\n got %v\nwant %v", c.Name, c.What, got, want)
				}
				if r.Generation != c.Generation {
					t.Errorf("generation %d, the manifest says %d", r.Generation, c.Generation)
				}
			case c.Error != "" && err != nil:
				var e *DigestError
				if !errors.As(err, &e) {
					t.Fatalf("%s: error %v is not a *DigestError", c.Name, err)
				}
				if string(e.Class) != c.Error {
					t.Errorf("%s (%s): class %s, want %s (%v)", c.Name, c.What, e.Class, c.Error, err)
				}
				if e.Class == UnknownVersion && e.Found != c.FoundVersion {
					t.Errorf("%s: found version %d, want %d", c.Name, e.Found, c.FoundVersion)
				}
				if want := filepath.Base(e.Name); want != c.EngineID && e.Name != CacheKey(DefaultPrefix, c.EngineID) {
					t.Errorf("%s: the error names %q", c.Name, e.Name)
				}
				classes[c.Kind+"/"+c.Error] = true
			default:
				t.Errorf("%s (%s): expected %q%q, got %+v, error %v", c.Name, c.What, c.Expect, c.Error, r, err)
			}
		})
	}
	for _, class := range []string{"cache_file/not_digest", "cache_file/unknown_version", "cache_file/wrong_size",
		"cache_file/corrupt_cache", "cache_file/torn", "cache_value/not_digest", "cache_value/unknown_version",
		"cache_value/wrong_size", "cache_value/corrupt_cache"} {
		if !classes[class] {
			t.Errorf("no vector of class %s passed", class)
		}
	}
}

func TestBlockHashesMatchTheGoldenVector(t *testing.T) {
	var v struct {
		BlockTokens int    `json:"block_tokens"`
		ChainSeed   uint64 `json:"chain_seed"`
		Cases       []struct {
			Name   string
			Tokens []uint32
			Hashes []uint64
		}
	}
	if err := json.Unmarshal(vectorFile(t, "cache/block_hashes.json"), &v); err != nil {
		t.Fatal(err)
	}
	if v.BlockTokens != BlockTokens || v.ChainSeed != ChainSeed || len(v.Cases) == 0 {
		t.Fatalf("block_tokens %d, chain_seed %d, %d cases; this package has %d, %d",
			v.BlockTokens, v.ChainSeed, len(v.Cases), BlockTokens, ChainSeed)
	}
	for _, c := range v.Cases {
		got := BlockHashes(c.Tokens)
		if len(got) != len(c.Hashes) || (len(got) > 0 && !reflect.DeepEqual(got, c.Hashes)) {
			t.Errorf("%s: BlockHashes = %v, want %v", c.Name, got, c.Hashes)
		}
	}
}
