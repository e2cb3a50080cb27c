package enginestate

import (
	"encoding/binary"
	"testing"
)

// slotWordsOf is the 16 words of one slot.
func slotWordsOf(id string, num uint64) []uint64 {
	b := make([]byte, ReservationSlotSize)
	copy(b, id)
	binary.LittleEndian.PutUint64(b[slotCountersOffset:], num)
	w := make([]uint64, slotWords)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return w
}

// A reused engine list keeps the ids it holds at the same slots and takes
// the new ones where they changed; a bad slot empties it.
func TestDecodeSlotsReusesAndReplacesEngineIDs(t *testing.T) {
	words := append(append(slotWordsOf("e-c", 3), slotWordsOf("e-b", 5)...), slotWordsOf("engine-12345678", 1)...)
	engines, err := decodeSlots("x", words, nil)
	if err != nil || len(engines) != 3 || engines[2].EngineID != "engine-12345678" || engines[1].NumRequests != 5 {
		t.Fatalf("%+v, %v", engines, err)
	}
	words = append(slotWordsOf("e-x", 7), slotWordsOf("e-b", 6)...)
	engines, err = decodeSlots("x", words, engines)
	if err != nil || len(engines) != 2 || engines[0].EngineID != "e-x" || engines[1].EngineID != "e-b" ||
		engines[0].NumRequests != 7 || engines[1].NumRequests != 6 {
		t.Fatalf("%+v, %v", engines, err)
	}
	for name, w := range map[string][]uint64{
		"no NUL":        slotWordsOf("0123456789012345678901234567890123456789012345678901234567890123", 1),
		"after the NUL": func() []uint64 { w := slotWordsOf("e-a", 1); w[2] = 1; return w }(),
		"in its word":   func() []uint64 { w := slotWordsOf("e-a", 1); w[0] |= 1 << 40; return w }(),
		"empty":         slotWordsOf("", 1),
		"dot":           slotWordsOf(".e", 1),
		"padding":       func() []uint64 { w := slotWordsOf("e-a", 1); w[15] = 1; return w }(),
		"twice":         append(slotWordsOf("e-a", 1), slotWordsOf("e-a", 2)...),
	} {
		engines, err = decodeSlots("x", w, engines)
		if e, ok := err.(*RouterError); !ok || e.Class != CorruptRouter || len(engines) != 0 {
			t.Errorf("%s: %v, %+v", name, err, engines)
		}
	}
}
