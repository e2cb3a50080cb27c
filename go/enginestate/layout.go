package enginestate

// Layout version 1 (docs/FORMAT.md, "Constants" and "The shared-memory
// file"). These values are frozen for version 1; the golden vectors check
// them.
const (
	// Magic is the first word of every file and record: the bytes "ENGSTATE".
	Magic uint64 = 0x4554415453474e45
	// LayoutVersion is the version this package reads.
	LayoutVersion uint32 = 1
	// FileSize is the size of every version-1 file.
	FileSize = 4096
	// HeaderSize is the size of the file header (cache line 0).
	HeaderSize = 64
	// PayloadSize is the size of a snapshot.
	PayloadSize = SnapshotWords * 8
	// SnapshotWords is the number of words of a snapshot.
	SnapshotWords = 16
	// SeqOffset is the offset of the seqlock sequence word.
	SeqOffset = 64
	// HeartbeatOffset is the offset of heartbeat_mono_ns.
	HeartbeatOffset = 72
	// PayloadOffset is the offset of the snapshot words.
	PayloadOffset = 128
	// EngineIDOffset is the offset of the NUL-padded engine id.
	EngineIDOffset = 256
	// EngineIDFieldSize is the size of the engine id field.
	EngineIDFieldSize = 64
	// MaxEngineIDLen is the longest engine id, in bytes.
	MaxEngineIDLen = 63
	// StateActive: the writer publishes into this file or key.
	StateActive uint64 = 1
	// StateRetired: the writer closed it, or a new writer replaced it.
	StateRetired uint64 = 2
	// FlagIdle is bit 0 of Snapshot.Flags: no running and no waiting requests.
	FlagIdle uint64 = 1 << 0
	// FlagShuttingDown is bit 1 of Snapshot.Flags: the engine is shutting down.
	FlagShuttingDown uint64 = 1 << 1

	// stateWord is the index of `state` among the header words.
	stateWord = 3
)

// FieldNames are the names of snapshot words 0 to 14, in word order: the
// same in Rust, Python, JSON and Prometheus labels.
var FieldNames = [15]string{
	"captured_mono_ns",
	"captured_unix_ns",
	"step",
	"num_running",
	"num_waiting",
	"gpu_blocks_total",
	"gpu_blocks_free",
	"pending_prefill_tokens",
	"ongoing_decode_tokens",
	"num_prefilling",
	"max_prefill_remaining",
	"num_preempted",
	"flags",
	"cache_blocks",
	"cache_version",
}

// Header is cache line 0 of a file, as loaded at open.
type Header struct {
	Magic           uint64
	LayoutVersion   uint32
	HeaderSize      uint16
	PayloadSize     uint16
	WriterPID       uint32 // in the writer's pid namespace
	PublishPeriodUs uint32
	State           uint64 // StateActive or StateRetired (may change after open)
	WriterPIDNs     uint64 // inode of the writer's /proc/self/ns/pid; 0 unknown
	CreatedUnixNs   uint64
	Generation      uint64
	Reserved        uint64
}

// headerFromWords takes the u32/u16 fields out of the words that hold them:
// readers load only whole words (docs/FORMAT.md, "Alignment and atomic access").
func headerFromWords(w *[HeaderSize / 8]uint64) Header {
	return Header{
		Magic:           w[0],
		LayoutVersion:   uint32(w[1]),
		HeaderSize:      uint16(w[1] >> 32),
		PayloadSize:     uint16(w[1] >> 48),
		WriterPID:       uint32(w[2]),
		PublishPeriodUs: uint32(w[2] >> 32),
		State:           w[3],
		WriterPIDNs:     w[4],
		CreatedUnixNs:   w[5],
		Generation:      w[6],
		Reserved:        w[7],
	}
}

// Snapshot is one engine's scheduler state at one instant: the 16 payload
// words (docs/FORMAT.md, "Snapshot words").
type Snapshot struct {
	CapturedMonoNs       uint64 // CLOCK_MONOTONIC at capture (same-host ages)
	CapturedUnixNs       uint64 // CLOCK_REALTIME at capture
	Step                 uint64
	NumRunning           uint64
	NumWaiting           uint64
	GPUBlocksTotal       uint64 // usable KV blocks
	GPUBlocksFree        uint64
	PendingPrefillTokens uint64
	OngoingDecodeTokens  uint64
	NumPrefilling        uint64
	MaxPrefillRemaining  uint64
	NumPreempted         uint64
	Flags                uint64 // FlagIdle, FlagShuttingDown; ignore other bits
	CacheBlocks          uint64 // entries in the latest cache digest (docs/FORMAT.md, "Cache residency")
	CacheVersion         uint64 // that digest's version; 0: the engine publishes none
	Reserved             [1]uint64
}

// SnapshotFromWords is the snapshot of 16 words in layout order.
func SnapshotFromWords(w *[SnapshotWords]uint64) Snapshot {
	return Snapshot{
		CapturedMonoNs:       w[0],
		CapturedUnixNs:       w[1],
		Step:                 w[2],
		NumRunning:           w[3],
		NumWaiting:           w[4],
		GPUBlocksTotal:       w[5],
		GPUBlocksFree:        w[6],
		PendingPrefillTokens: w[7],
		OngoingDecodeTokens:  w[8],
		NumPrefilling:        w[9],
		MaxPrefillRemaining:  w[10],
		NumPreempted:         w[11],
		Flags:                w[12],
		CacheBlocks:          w[13],
		CacheVersion:         w[14],
		Reserved:             [1]uint64{w[15]},
	}
}

// Words is the snapshot as its 16 words, in layout order.
func (s *Snapshot) Words() [SnapshotWords]uint64 {
	return [SnapshotWords]uint64{
		s.CapturedMonoNs, s.CapturedUnixNs, s.Step, s.NumRunning, s.NumWaiting,
		s.GPUBlocksTotal, s.GPUBlocksFree, s.PendingPrefillTokens, s.OngoingDecodeTokens,
		s.NumPrefilling, s.MaxPrefillRemaining, s.NumPreempted, s.Flags,
		s.CacheBlocks, s.CacheVersion, s.Reserved[0],
	}
}

// IsIdle reports the idle flag.
func (s *Snapshot) IsIdle() bool { return s.Flags&FlagIdle != 0 }

// IsShuttingDown reports the shutting-down flag.
func (s *Snapshot) IsShuttingDown() bool { return s.Flags&FlagShuttingDown != 0 }

// GPUKVUsedFrac is 1 - free/total, derived by readers (never stored); ok is
// false when the engine reported no blocks. free is clamped to total.
func (s *Snapshot) GPUKVUsedFrac() (frac float64, ok bool) {
	if s.GPUBlocksTotal == 0 {
		return 0, false
	}
	free := s.GPUBlocksFree
	if free > s.GPUBlocksTotal {
		free = s.GPUBlocksTotal
	}
	return 1.0 - float64(free)/float64(s.GPUBlocksTotal), true
}

// ValidEngineID reports whether id is an engine id: 1 to 63 characters of
// [A-Za-z0-9._-], not starting with '.'; else why not.
func ValidEngineID(id string) (ok bool, reason string) {
	switch {
	case id == "":
		return false, "it is empty"
	case len(id) > MaxEngineIDLen:
		return false, "it is longer than 63 characters"
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false, "it has characters outside [A-Za-z0-9._-]"
		}
	}
	if id[0] == '.' {
		return false, "it starts with '.'"
	}
	return true, ""
}
