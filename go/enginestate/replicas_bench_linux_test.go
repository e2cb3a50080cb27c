package enginestate

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkReadReplicas: one read of 16 peer replicas of 3 engines each
// (the "active" vector under 16 replica ids), what a router does before a
// pick; the per-read allocations are the listing's only (none between
// listings).
func BenchmarkReadReplicas(b *testing.B) {
	state := filepath.Join(b.TempDir(), "state")
	dir := RoutersDir(state)
	if err := os.Mkdir(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	active := vectorFile(b, "routers/active.bin")
	for i := 0; i < 16; i++ {
		id := fmt.Sprintf("r%02d", i)
		file := append([]byte(nil), active...)
		copy(file[replicaIDOffset:replicaIDOffset+EngineIDFieldSize], make([]byte, EngineIDFieldSize))
		copy(file[replicaIDOffset:], id)
		mustWrite(b, filepath.Join(dir, id), file)
	}
	opts := DefaultOptions()
	opts.RescanInterval = 1 << 62
	r, err := OpenReplicas(state, "", opts)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var reading ReplicaReading
	now := uint64(1_999_500_000_000)
	if err := r.ReadAt(&reading, now); err != nil || len(reading.Replicas) != 16 || len(reading.Errors) != 0 {
		b.Fatalf("%+v, %v", reading, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := r.ReadAt(&reading, now); err != nil {
			b.Fatal(err)
		}
	}
}
