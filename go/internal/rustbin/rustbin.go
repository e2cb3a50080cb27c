// Package rustbin runs the Rust binaries of this repository (espublish,
// esdump) from Go tests: the cross-language tests of enginestate and
// esdump-go.
package rustbin

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Binary is the path of a Rust binary of this repository (espublish,
// esdump) in $ENGINE_STATE_BIN, which `make test-go` sets. Without it the
// cross-language tests are skipped with that message (plain `go test`).
func Binary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("ENGINE_STATE_BIN")
	if dir == "" {
		t.Skip("cross-language test: set ENGINE_STATE_BIN to the Rust binaries' directory (make test-go does)")
	}
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%v: build the Rust binaries first (cargo build --release --bins; make test-go does)", err)
	}
	return path
}

// Child is a process of a test, stopped when the test ends.
type Child struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
}

// Start starts name with args and waits for its first line of output
// (espublish prints it once its first snapshot is published).
func Start(t testing.TB, name string, args ...string) *Child {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, stdout: bufio.NewReader(out)}
	t.Cleanup(c.Stop)
	if _, err := c.stdout.ReadString('\n'); err != nil {
		t.Fatalf("%s %v printed nothing: %v", name, args, err)
	}
	go io.Copy(io.Discard, c.stdout) // never let it block on a full pipe
	return c
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Kill kills the child with SIGKILL (it leaves its file behind, ACTIVE).
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// Stop asks the child to stop (SIGTERM: a clean close), killing it if it
// has not exited within 10 s.
func (c *Child) Stop() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.Kill()
	}
}
