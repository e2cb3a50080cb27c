// Package enginestate reads engine-state, the real-time scheduler state that
// vLLM engines publish for LLM routers, without cgo: shared-memory files
// through syscall.Mmap and sync/atomic, and Redis records from bytes the
// caller fetched with its own client. The format is docs/FORMAT.md of the
// engine-state repository; this package passes its golden vectors
// (format/vectors/).
//
// Main types:
//
//   - Dir: every engine of one shared-memory directory. OpenDir, then
//     Read (or ReadInto with a reused Reading) as often as you like: each
//     read is a lock-free seqlock read per engine plus one clock read;
//     the directory is listed again at most every Options.RescanInterval.
//   - EngineState: one engine's Snapshot, HeartbeatAge, CaptureAge and
//     Status (fresh, stale, dead, torn). Only fresh state should enter a
//     router's max(shadow, real) merge.
//   - Reading: the engines of one read, sorted by id, and per-engine errors
//     (a bad file never stops the others from being read; an engine whose
//     stamp is too far ahead of this host's clock is both read, stale, and
//     an error of class ClockAhead).
//   - StateAtFetch, DecodeRecord: one Redis record, judged the way the
//     Rust reader does (ages from the key's PTTL, no cross-host clocks).
//   - FormatJSON: the output of `esdump --json`, byte for byte.
//   - CacheDigest: which 512-token prompt blocks an engine's KV cache
//     holds (docs/FORMAT.md, "Cache residency"). Options.CacheDigests
//     makes a Dir hand out each fresh engine's digest (EngineState.Cache);
//     BlockHashes turns a prompt's token ids into block keys and
//     CacheDigest.LeadingBlocks finds its hit. DigestFile reads one digest
//     file; DecodeDigestValue and DecodeFetchedCache judge a Redis value.
//   - Replicas: router replicas' shared reservations (docs/FORMAT.md,
//     "Shared reservations"), every replica's file in RoutersDir but the
//     reader's own, read like a Dir into a ReplicaReading (ReplicaState:
//     status by the engines' rule, the six Reservations counters per
//     engine; per-replica errors). RouterFile reads one file;
//     DecodeRouterValue and ReplicaAtFetch judge a Redis value.
//
// Example:
//
//	dir, err := enginestate.OpenDir("/dev/shm/agentic_engine_state", enginestate.DefaultOptions())
//	if err != nil {
//		log.Fatal(err) // the directory cannot be listed; the message says what to do
//	}
//	defer dir.Close()
//	reading, err := dir.Read()
//	for _, e := range reading.Engines {
//		if e.Status == enginestate.Fresh {
//			fmt.Println(e.EngineID, e.Snapshot.NumRunning, e.Snapshot.PendingPrefillTokens)
//		}
//	}
//	for _, bad := range reading.Errors {
//		log.Print(bad) // e.g. a file with another layout version
//	}
//
// A Dir is not safe for concurrent use: give each goroutine its own (they
// are cheap: one mapping per engine), or guard one with a mutex.
//
// The shared-memory part is Linux-only (files in /dev/shm, pid namespaces);
// the Redis part and the JSON encoding build everywhere.
package enginestate
