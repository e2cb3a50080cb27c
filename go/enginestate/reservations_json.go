package enginestate

import (
	"sort"
	"strconv"
)

// The JSON of router replicas: what `esdump --replicas --json` prints (the
// Rust reader's Serialize for ReplicaState), byte for byte: per replica its
// id, status, heartbeat_age_ms, changed_age_ms (null when unknown),
// generation, writer_pid and engines, an object of engine id to the six
// counters, both objects with sorted keys (serde_json's map).

// sortedReservationFields are ReservationFieldNames' indices in key order.
var sortedReservationFields = func() []int {
	order := make([]int, ReservationWords)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		return ReservationFieldNames[order[a]] < ReservationFieldNames[order[b]]
	})
	return order
}()

// FormatReplicasJSON is what `esdump --replicas --json` prints for these
// replicas: a pretty-printed array (two-space indent) and a newline.
func FormatReplicasJSON(replicas []ReplicaState) []byte {
	if len(replicas) == 0 {
		return []byte("[]\n")
	}
	b := []byte("[\n")
	for i := range replicas {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = replicas[i].appendJSON(b)
	}
	return append(b, "\n]\n"...)
}

func (r *ReplicaState) appendJSON(b []byte) []byte {
	key := func(b []byte, indent, name string) []byte {
		b = append(b, indent...)
		b = appendJSONString(b, name)
		return append(b, ": "...)
	}
	const in = "\n    "
	b = append(b, "  {"...)
	b = appendJSONString(key(b, in, "replica_id"), r.ReplicaID)
	b = appendJSONString(key(append(b, ','), in, "status"), r.Status.String())
	b = appendJSONFloat(key(append(b, ','), in, "heartbeat_age_ms"), Millis(r.HeartbeatAge))
	b = key(append(b, ','), in, "changed_age_ms")
	if r.ChangedKnown {
		b = appendJSONFloat(b, Millis(r.ChangedAge))
	} else {
		b = append(b, "null"...)
	}
	b = strconv.AppendUint(key(append(b, ','), in, "generation"), r.Generation, 10)
	b = strconv.AppendUint(key(append(b, ','), in, "writer_pid"), uint64(r.WriterPID), 10)
	b = key(append(b, ','), in, "engines")
	if len(r.Engines) == 0 {
		b = append(b, "{}"...)
	} else {
		engines := make([]int, len(r.Engines))
		for i := range engines {
			engines[i] = i
		}
		sort.Slice(engines, func(x, y int) bool { return r.Engines[engines[x]].EngineID < r.Engines[engines[y]].EngineID })
		b = append(b, '{')
		for n, i := range engines {
			if n > 0 {
				b = append(b, ',')
			}
			e := &r.Engines[i]
			b = append(key(b, "\n      ", e.EngineID), '{')
			words := e.Reservations.Words()
			for m, field := range sortedReservationFields {
				if m > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendUint(key(b, "\n        ", ReservationFieldNames[field]), words[field], 10)
			}
			b = append(b, "\n      }"...)
		}
		b = append(b, "\n    }"...)
	}
	return append(b, "\n  }"...)
}
