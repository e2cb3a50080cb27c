package enginestate

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Benchmarks (docs: BENCHMARKS.md, issue 15): one engine read and a
// 1,024-engine scan, each against parsing a Prometheus text page with the
// same fields (the /metrics path Go routers use today) in the same run:
//
//	go test ./enginestate -run '^$' -bench . -benchtime 2s
//
// Each reports ns/op (mean) and median-ns/op: the median over batches of
// the per-operation time, which a noisy host disturbs less.

// benchFreshness keeps the engines of benchDir fresh for an hour.
// (Stamps an hour ahead did that until stamps ahead of the clock were
// refused: those engines read stale, ClockAhead, and the benchmarks failed.)
var benchFreshness = Freshness{StaleAfter: time.Hour, MaxCaptureAge: time.Hour}

// benchDir is a directory of n engine files (the golden "active" file with
// the heartbeat and capture stamped now, read with benchFreshness, so every
// engine reads fresh), in
// /dev/shm when there is one (where engines publish).
func benchDir(b *testing.B, n int) string {
	b.Helper()
	parent := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		parent = "/dev/shm"
	}
	dir, err := os.MkdirTemp(parent, "enginestate-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	now := MonotonicNs()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("engine-%04d", i)
		f := activeFile(b, id)
		binary.LittleEndian.PutUint64(f[HeartbeatOffset:], now)
		binary.LittleEndian.PutUint64(f[PayloadOffset:], now)
		mustWrite(b, filepath.Join(dir, id), f)
	}
	return dir
}

// measure runs op b.N times in batches and reports the median batch's
// time per op as median-ns/op.
func measure(b *testing.B, op func()) {
	const batch = 64
	var perOp []float64
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := batch
		if b.N-done < n {
			n = b.N - done
		}
		start := time.Now()
		for i := 0; i < n; i++ {
			op()
		}
		perOp = append(perOp, float64(time.Since(start).Nanoseconds())/float64(n))
		done += n
	}
	b.StopTimer()
	sort.Float64s(perOp)
	b.ReportMetric(perOp[len(perOp)/2], "median-ns/op")
}

func BenchmarkReadOneEngine(b *testing.B) {
	d, err := OpenDir(benchDir(b, 1), Options{Freshness: benchFreshness, RescanInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var e EngineState
	measure(b, func() {
		if !d.ReadEngine("engine-0000", &e) || e.Status != Fresh {
			b.Fatalf("%+v", e)
		}
	})
}

func BenchmarkScan1024Engines(b *testing.B) {
	d, err := OpenDir(benchDir(b, 1024), Options{Freshness: benchFreshness, RescanInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var r Reading
	measure(b, func() {
		if err := d.ReadInto(&r); err != nil || len(r.Engines) != 1024 || r.Engines[1023].Status != Fresh {
			b.Fatalf("%v %d", err, len(r.Engines))
		}
	})
}

// promPage is a Prometheus text page with the fields of n engines, as
// esagent's /metrics serves them: a gauge per snapshot field, the KV used
// fraction, both ages and the status, each with HELP and TYPE lines.
func promPage(n int) string {
	var s strings.Builder
	snap := Snapshot{CapturedMonoNs: 1999750000000, CapturedUnixNs: 1767225612345678901, Step: 123457,
		NumRunning: 12, NumWaiting: 3, GPUBlocksTotal: 30000, GPUBlocksFree: 10001, PendingPrefillTokens: 40961,
		OngoingDecodeTokens: 90113, NumPrefilling: 2, MaxPrefillRemaining: 31007, NumPreempted: 1}
	words := snap.Words()
	family := func(name, help string, value func(i int) string) {
		fmt.Fprintf(&s, "# HELP engine_state_%s %s\n# TYPE engine_state_%s gauge\n", name, help, name)
		for i := 0; i < n; i++ {
			fmt.Fprintf(&s, "engine_state_%s{engine=\"engine-%04d\"} %s\n", name, i, value(i))
		}
	}
	for w, name := range FieldNames {
		w := w
		family(name, "snapshot field "+name, func(int) string { return strconv.FormatUint(words[w], 10) })
	}
	family("gpu_kv_used_frac", "KV cache used fraction", func(int) string { return "0.6666333333333334" })
	family("heartbeat_age_seconds", "time since the last heartbeat", func(int) string { return "0.001234" })
	family("capture_age_seconds", "time since the capture", func(int) string { return "0.25" })
	fmt.Fprintf(&s, "# HELP engine_state_status 1 for the current status\n# TYPE engine_state_status gauge\n")
	for i := 0; i < n; i++ {
		for _, st := range []string{"fresh", "stale", "dead", "torn"} {
			v := "0"
			if st == "fresh" {
				v = "1"
			}
			fmt.Fprintf(&s, "engine_state_status{engine=\"engine-%04d\",status=\"%s\"} %s\n", i, st, v)
		}
	}
	return s.String()
}

// promEngine is what a router keeps per engine from a scrape.
type promEngine struct {
	words        [SnapshotWords]uint64
	kvUsedFrac   float64
	heartbeatAge float64
	captureAge   float64
	status       string
}

// parseProm parses a Prometheus text page into engines by label: a minimal
// parser (no escapes in label values beyond \" and \\, no timestamps), so a
// lower bound on what a full text-format parser such as expfmt costs.
func parseProm(page string, out map[string]*promEngine) error {
	fieldIndex := map[string]int{}
	for i, n := range FieldNames {
		fieldIndex["engine_state_"+n] = i
	}
	for len(page) > 0 {
		nl := strings.IndexByte(page, '\n')
		if nl < 0 {
			nl = len(page)
		}
		line := page[:nl]
		page = page[min(nl+1, len(page)):]
		if line == "" || line[0] == '#' {
			continue
		}
		brace := strings.IndexByte(line, '{')
		end := strings.LastIndexByte(line, '}')
		if brace < 0 || end < brace {
			return fmt.Errorf("no labels: %q", line)
		}
		name := line[:brace]
		var engine, status string
		for labels := line[brace+1 : end]; labels != ""; {
			eq := strings.IndexByte(labels, '=')
			if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
				return fmt.Errorf("bad labels: %q", line)
			}
			key := labels[:eq]
			rest := labels[eq+2:]
			var value strings.Builder
			i := 0
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				value.WriteByte(rest[i])
			}
			switch key {
			case "engine":
				engine = value.String()
			case "status":
				status = value.String()
			}
			labels = strings.TrimPrefix(rest[min(i+1, len(rest)):], ",")
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			return err
		}
		e := out[engine]
		if e == nil {
			e = &promEngine{}
			out[engine] = e
		}
		switch name {
		case "engine_state_gpu_kv_used_frac":
			e.kvUsedFrac = v
		case "engine_state_heartbeat_age_seconds":
			e.heartbeatAge = v
		case "engine_state_capture_age_seconds":
			e.captureAge = v
		case "engine_state_status":
			if v == 1 {
				e.status = status
			}
		default:
			i, ok := fieldIndex[name]
			if !ok {
				return fmt.Errorf("unknown metric %q", name)
			}
			e.words[i] = uint64(v)
		}
	}
	return nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func benchmarkProm(b *testing.B, engines int) {
	page := promPage(engines)
	out := map[string]*promEngine{}
	measure(b, func() {
		if err := parseProm(page, out); err != nil || len(out) != engines || out["engine-0000"].status != "fresh" {
			b.Fatalf("%v %d", err, len(out))
		}
	})
	b.ReportMetric(float64(len(page)), "page-bytes")
}

func BenchmarkPrometheusParseOneEngine(b *testing.B) { benchmarkProm(b, 1) }

func BenchmarkPrometheusParse1024Engines(b *testing.B) { benchmarkProm(b, 1024) }

func TestPrometheusParserReadsThePage(t *testing.T) {
	out := map[string]*promEngine{}
	if err := parseProm(promPage(3), out); err != nil {
		t.Fatal(err)
	}
	e := out["engine-0002"]
	if len(out) != 3 || e.words[3] != 12 || e.words[7] != 40961 || e.status != "fresh" || e.captureAge != 0.25 {
		t.Fatalf("%d engines, %+v", len(out), e)
	}
}

// One engine read with Options.CacheDigests, its digest held (the version
// the snapshot names has not moved): what a router that routes by cache
// pays per read over BenchmarkReadOneEngine.
func BenchmarkReadOneEngineWithCacheDigest(b *testing.B) {
	dir := benchDir(b, 1)
	engine := vectorFile(b, "shm/active.bin")
	digest := vectorFile(b, "cache/file_active.bin")
	copy(digest[32:40], engine[48:56])                                  // the engine's generation
	copy(digest[digestControlOffset:], engine[PayloadOffset+8*14:][:8]) // the version its snapshot names
	if err := os.Mkdir(CacheDir(dir), 0o700); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(CacheDir(dir)) })
	mustWrite(b, filepath.Join(CacheDir(dir), "engine-0000"), digest)
	d, err := OpenDir(dir, Options{Freshness: benchFreshness, RescanInterval: time.Hour, CacheDigests: true})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var e EngineState
	measure(b, func() {
		if !d.ReadEngine("engine-0000", &e) || e.Status != Fresh || e.Cache.Len() != 5 {
			b.Fatalf("%+v", e)
		}
	})
}
