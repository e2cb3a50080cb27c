package enginestate

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"
)

// The snapshot's field names are owned by the Rust side (shm-format's
// snapshot_fields!, Snapshot::FIELD_NAMES); Go must spell them. The golden
// vector shm/active.json is esdump --json output, made by the Rust
// Serialize that iterates that list (reader/tests/golden_vectors checks the
// file is what Rust makes): its keys after engine_id are the owner's names,
// in word order.
func TestFieldNamesAreTheRustOwnersNames(t *testing.T) {
	names := objectKeys(t, vectorFile(t, "shm/active.json"))
	if len(names) < 1+len(FieldNames) || names[0] != "engine_id" {
		t.Fatalf("shm/active.json keys: %v", names)
	}
	if got := names[1 : 1+len(FieldNames)]; !reflect.DeepEqual(got, FieldNames[:]) {
		t.Errorf("FieldNames %v, the Rust owner's (shm/active.json) %v", FieldNames, got)
	}
}

// objectKeys is the keys of the first object of a JSON array, in order.
func objectKeys(t *testing.T, doc []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(doc))
	for _, want := range []json.Delim{'[', '{'} {
		if tok, err := dec.Token(); err != nil || tok != want {
			t.Fatalf("expected %v, got %v (%v)", want, tok, err)
		}
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// snakeCase is a Go field name as the snapshot names it: GPUBlocksTotal ->
// gpu_blocks_total.
func snakeCase(name string) string {
	var b strings.Builder
	runes := []rune(name)
	for i, r := range runes {
		if unicode.IsUpper(r) {
			nextLower := i+1 < len(runes) && unicode.IsLower(runes[i+1])
			if i > 0 && (unicode.IsLower(runes[i-1]) || nextLower) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// The Snapshot struct's fields are FieldNames in word order, and
// SnapshotFromWords and Words put each word in the field of its name.
func TestSnapshotStructFollowsFieldNames(t *testing.T) {
	var words [SnapshotWords]uint64
	for i := range words {
		words[i] = 100 + uint64(i)
	}
	s := SnapshotFromWords(&words)
	v := reflect.ValueOf(s)
	for i, name := range FieldNames {
		f := v.Type().Field(i)
		if got := snakeCase(f.Name); got != name {
			t.Errorf("Snapshot field %d is %s (%s), want %s", i, f.Name, got, name)
		}
		if got := v.Field(i).Uint(); got != words[i] {
			t.Errorf("%s = %d, want word %d", f.Name, got, words[i])
		}
	}
	if f := v.Type().Field(len(FieldNames)); f.Name != "Reserved" {
		t.Errorf("field %d is %s, want Reserved", len(FieldNames), f.Name)
	}
	if s.Words() != words {
		t.Errorf("Words() %v, want %v", s.Words(), words)
	}
}
