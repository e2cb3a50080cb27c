package enginestate

import (
	"strconv"
	"strings"
	"testing"

	"example.invalid/engine-state/go/internal/formatdoc"
)

// The router constants, offsets and counter names this package spells are
// docs/FORMAT.md's (the constants, routers, reservation-slot and
// reservations tables, which the Rust owner's test checks against
// shm-format): Go cannot drift from them.
func TestRouterConstantsAndOffsetsAreFormatMds(t *testing.T) {
	constants := map[string]string{}
	for _, row := range formatdoc.Table(t, "constants") {
		constants[row[0]] = row[1]
	}
	for name, want := range map[string]string{
		"ROUTER_MAGIC":          "ESROUTER",
		"ROUTER_LAYOUT_VERSION": strconv.Itoa(int(RouterLayoutVersion)),
		"ROUTER_HEADER_SIZE":    strconv.Itoa(RouterHeaderSize),
		"RESERVATION_SLOT_SIZE": strconv.Itoa(ReservationSlotSize),
		"MAX_ROUTER_ENGINES":    strconv.Itoa(MaxRouterEngines),
		"ROUTER_FILE_SIZE":      strconv.Itoa(RouterFileSize),
		"ROUTERS_DIR_SUFFIX":    RoutersDirSuffix,
	} {
		if got := constants[name]; got != want {
			t.Errorf("FORMAT.md %s = %q, this package %q", name, got, want)
		}
	}
	var magic [8]byte
	for i := range magic {
		magic[i] = byte(RouterMagic >> (8 * i))
	}
	if string(magic[:]) != "ESROUTER" {
		t.Errorf("RouterMagic spells %q", magic)
	}
	offsets := map[string]int{}
	for _, row := range formatdoc.Table(t, "routers") {
		offset, err := strconv.Atoi(row[0])
		if err != nil {
			t.Fatalf("routers table row %v: %v", row, err)
		}
		if _, seen := offsets[row[2]]; !seen { // the first "reserved"
			offsets[row[2]] = offset
		}
	}
	for field, want := range map[string]int{
		"state":             routerStateWord * 8,
		"seq":               routerSeqOffset,
		"heartbeat_mono_ns": routerHeartbeatOffset,
		"count":             routerCountOffset,
		"changed_mono_ns":   routerChangedOffset,
		"replica_id":        replicaIDOffset,
		"slots":             routerSlotsOffset,
	} {
		if got, ok := offsets[field]; !ok || got != want {
			t.Errorf("FORMAT.md puts %s at %d (listed: %v), this package at %d", field, got, ok, want)
		}
	}
	slot := map[string]string{}
	for _, row := range formatdoc.Table(t, "reservation-slot") {
		slot[row[2]] = row[0] + "+" + row[1]
	}
	if slot["engine_id"] != "0+64" || slot["counters"] != strconv.Itoa(slotCountersOffset)+"+48" ||
		slot["reserved"] != "112+16" {
		t.Errorf("FORMAT.md's slot: %v", slot)
	}
	var names []string
	for _, row := range formatdoc.Table(t, "reservations") {
		names = append(names, row[2])
	}
	if strings.Join(names, ",") != strings.Join(ReservationFieldNames[:], ",") {
		t.Errorf("FORMAT.md's counters %v, this package %v", names, ReservationFieldNames)
	}
}
