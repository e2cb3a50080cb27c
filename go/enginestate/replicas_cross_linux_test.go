package enginestate

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"example.invalid/engine-state/go/internal/rustbin"
)

// Router replicas written by real Rust processes (tests/src/bin/esreplica.rs:
// a Router whose ReplicaPublisher writes its file, driven on stdin), read
// by Replicas: every replica's reservations as it holds them, its own id
// left out, back to zero after completion, a killed one dead, a closed one
// gone.

type replicaProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startReplica(t *testing.T, uri, id string) *replicaProcess {
	t.Helper()
	cmd := exec.Command(rustbin.Binary(t, "esreplica"), "--uri", uri, "--replica-id", id, "--engines", "e0,e1",
		"--rescan-ms", "10")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &replicaProcess{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	if line := p.say(t, ""); !strings.Contains(line, "ready") {
		t.Fatalf("esreplica %s: %q", id, line)
	}
	return p
}

// say sends a command (none: only reads) and returns the reply line.
func (p *replicaProcess) say(t *testing.T, command string) string {
	t.Helper()
	if command != "" {
		if _, err := fmt.Fprintln(p.stdin, command); err != nil {
			t.Fatal(err)
		}
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		t.Fatalf("%q: %v", command, err)
	}
	return line
}

func totalRequests(s *ReplicaState) uint64 {
	var n uint64
	for _, e := range s.Engines {
		n += e.NumRequests
	}
	return n
}

// eventually polls r until ok holds for its reading, failing after 10 s.
func eventually(t *testing.T, r *Replicas, what string, ok func(*ReplicaReading) bool) {
	t.Helper()
	var reading ReplicaReading
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := r.ReadInto(&reading); err != nil {
			t.Fatal(err)
		}
		if ok(&reading) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s; last reading %+v", what, reading)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestReplicasOfRustProcesses(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	uri := "file://" + state
	r1 := startReplica(t, uri, "r1")
	r2 := startReplica(t, uri, "r2")
	if line := r1.say(t, "pick 3 100"); !strings.Contains(line, `"held":3`) {
		t.Fatalf("r1 pick: %q", line)
	}
	if line := r2.say(t, "pick 2 100"); !strings.Contains(line, `"held":2`) {
		t.Fatalf("r2 pick: %q", line)
	}
	opts := DefaultOptions()
	opts.RescanInterval = 10 * time.Millisecond
	asR2, err := OpenReplicas(state, "r2", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer asR2.Close()
	all, err := OpenReplicas(state, "", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	eventually(t, asR2, "r2 sees r1's 3 requests, not its own", func(r *ReplicaReading) bool {
		s, ok := r.Get("r1")
		_, own := r.Get("r2")
		return ok && !own && len(r.Replicas) == 1 && s.IsFresh() && totalRequests(s) == 3 && len(r.Errors) == 0
	})
	eventually(t, all, "both replicas", func(r *ReplicaReading) bool {
		s1, ok1 := r.Get("r1")
		s2, ok2 := r.Get("r2")
		return ok1 && ok2 && totalRequests(s1) == 3 && totalRequests(s2) == 2 && s2.IsFresh() &&
			s1.WriterPID == uint32(r1.cmd.Process.Pid)
	})
	r1.say(t, "complete")
	eventually(t, asR2, "r1 back to zero", func(r *ReplicaReading) bool {
		s, ok := r.Get("r1")
		return ok && s.IsFresh() && totalRequests(s) == 0
	})
	r1.say(t, "pick 1 100")
	// Killed: its file stays ACTIVE, but its pid is gone (same namespace).
	_ = r1.cmd.Process.Signal(syscall.SIGKILL)
	_ = r1.cmd.Wait()
	eventually(t, asR2, "killed r1 dead", func(r *ReplicaReading) bool {
		s, ok := r.Get("r1")
		return ok && s.Status == Dead
	})
	// Closed: its file is removed.
	fmt.Fprintln(r2.stdin, "exit")
	_ = r2.cmd.Wait()
	eventually(t, all, "closed r2 gone", func(r *ReplicaReading) bool {
		_, ok := r.Get("r2")
		return !ok
	})
}

// Every reading of a replica a Rust router changes as fast as it can is
// one of its writes, never a mix: with every request of 100 tokens, each
// engine's counters keep ongoing_tokens = 100 × num_requests,
// pending_prefill_tokens = 100 × num_prefilling and ongoing_decode_tokens
// = 100 × (num_requests - num_prefilling), which words of two writes break.
func TestReplicaReadingsAreNeverTorn(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	r1 := startReplica(t, "file://"+state, "r1")
	const rounds = 1500
	go func() {
		w := bufio.NewWriter(r1.stdin)
		for i := 0; i < rounds; i++ {
			fmt.Fprintf(w, "pick %d 100\nprefill\ncomplete\n", 1+i%4)
		}
		w.Flush()
	}()
	replies := make(chan error, 1)
	go func() {
		for i := 0; i < 3*rounds; i++ {
			if _, err := r1.out.ReadString('\n'); err != nil {
				replies <- err
				return
			}
		}
		replies <- nil
	}()
	opts := DefaultOptions()
	opts.RescanInterval = time.Hour
	r, err := OpenReplicas(state, "", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var reading ReplicaReading
	reads, busy := 0, 0
	deadline := time.After(60 * time.Second)
	for done := false; !done; {
		select {
		case err := <-replies:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		case <-deadline:
			t.Fatal("esreplica did not finish its rounds within 60 s")
		default:
		}
		if err := r.ReadInto(&reading); err != nil {
			t.Fatal(err)
		}
		if len(reading.Errors) != 0 || len(reading.Replicas) != 1 {
			t.Fatalf("%+v", reading)
		}
		reads++
		for _, e := range reading.Replicas[0].Engines {
			c := e.Reservations
			if c.NumPrefilling > c.NumRequests || c.OngoingTokens != 100*c.NumRequests ||
				c.PendingPrefillTokens != 100*c.NumPrefilling ||
				c.OngoingDecodeTokens != 100*(c.NumRequests-c.NumPrefilling) {
				t.Fatalf("read %d of %s: a mixed reading %+v", reads, e.EngineID, c)
			}
			if c.NumRequests > 0 {
				busy++
			}
		}
	}
	if busy == 0 {
		t.Errorf("%d reads, none while a request was held", reads)
	}
	t.Logf("%d reads, %d engine readings with requests", reads, busy)
}
