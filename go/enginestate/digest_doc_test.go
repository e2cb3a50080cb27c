package enginestate

import (
	"strconv"
	"strings"
	"testing"

	"example.invalid/engine-state/go/internal/formatdoc"
)

// The digest constants and offsets this package spells are docs/FORMAT.md's
// (the constants table and the digest table, which the Rust owner's test
// checks against shm-format/src/digest_layout.rs): Go cannot drift from them.
func TestDigestConstantsAndOffsetsAreFormatMds(t *testing.T) {
	constants := map[string]string{}
	for _, row := range formatdoc.Table(t, "constants") {
		constants[row[0]] = row[1]
	}
	for name, want := range map[string]string{
		"DIGEST_MAGIC":          "ESDIGEST",
		"DIGEST_LAYOUT_VERSION": strconv.Itoa(int(DigestLayoutVersion)),
		"DIGEST_HEADER_SIZE":    strconv.Itoa(DigestHeaderSize),
		"DIGEST_ENTRY_SIZE":     strconv.Itoa(DigestEntrySize),
		"MAX_DIGEST_ENTRIES":    strconv.Itoa(MaxDigestEntries),
		"BLOCK_TOKENS":          strconv.Itoa(BlockTokens),
		"CACHE_DIR_SUFFIX":      CacheDirSuffix,
	} {
		if got := constants[name]; got != want {
			t.Errorf("FORMAT.md %s = %q, this package %q", name, got, want)
		}
	}
	var magic [8]byte
	for i := range magic {
		magic[i] = byte(DigestMagic >> (8 * i))
	}
	if string(magic[:]) != "ESDIGEST" {
		t.Errorf("DigestMagic spells %q", magic)
	}
	offsets := map[string]int{}
	for _, row := range formatdoc.Table(t, "digest") {
		offset, err := strconv.Atoi(row[0])
		if err != nil {
			t.Fatalf("digest table row %v: %v", row, err)
		}
		offsets[strings.Fields(row[2])[0]] = offset
	}
	for field, want := range map[string]int{
		"state":            digestStateWord * 8,
		"generation":       32,
		"seq":              digestSeqOffset,
		"version":          digestControlOffset + 8*controlVersion,
		"captured_mono_ns": digestControlOffset + 8*controlCapturedMonoNs,
		"captured_unix_ns": digestControlOffset + 8*controlCapturedUnixNs,
		"count":            digestControlOffset + 8*controlCount,
		"held":             digestControlOffset + 8*controlHeld,
		"entries":          digestEntriesOffset,
	} {
		if got, ok := offsets[field]; !ok || got != want {
			t.Errorf("FORMAT.md puts %s at %d (listed: %v), this package at %d", field, got, ok, want)
		}
	}
}
