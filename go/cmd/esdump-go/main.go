// Command esdump-go prints every engine of an engine-state shared-memory
// directory as JSON, exactly as `esdump --json` does: a small example of the
// Go package enginestate (no cgo). Engines whose files cannot be read are
// reported on standard error, one line each; the others are still printed.
//
//	esdump-go [--uri file:///dev/shm/agentic_engine_state] [--stale-after 2000]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"example.invalid/engine-state/go/enginestate"
)

const (
	defaultURI = "file:///dev/shm/agentic_engine_state"
	uriEnv     = "AGENTIC_ENGINE_STATE_URI"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "esdump-go: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("esdump-go", flag.ContinueOnError)
	flags.SetOutput(stderr)
	uri := flags.String("uri", "", "where the engines publish: file:///dir (default $"+uriEnv+", else "+defaultURI+")")
	staleAfter := flags.Uint64("stale-after", 2000, "a heartbeat older than this (ms) makes an engine stale")
	flags.Bool("json", true, "print JSON (the only output of esdump-go; accepted for esdump's flags)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *staleAfter == 0 {
		return fmt.Errorf("--stale-after must be at least 1 ms")
	}
	dir, err := directory(*uri)
	if err != nil {
		return err
	}
	opts := enginestate.DefaultOptions()
	opts.Freshness.StaleAfter = time.Duration(*staleAfter) * time.Millisecond
	source, err := enginestate.OpenDir(dir, opts)
	if err != nil {
		return err
	}
	defer source.Close()
	reading, err := source.Read()
	if err != nil {
		return err
	}
	if _, err := stdout.Write(enginestate.FormatJSON(reading.Engines)); err != nil {
		return err
	}
	for _, bad := range reading.Errors {
		fmt.Fprintf(stderr, "esdump-go: %s\n", printable(bad.Error()))
	}
	return nil
}

// directory is the directory a URI names: --uri wins over the environment.
func directory(uri string) (string, error) {
	if uri == "" {
		uri = strings.TrimSpace(os.Getenv(uriEnv))
	}
	if uri == "" {
		uri = defaultURI
	}
	switch {
	case strings.HasPrefix(uri, "file://"):
		path := strings.TrimPrefix(strings.TrimPrefix(uri, "file://"), "localhost")
		if !strings.HasPrefix(path, "/") {
			return "", fmt.Errorf("bad engine-state URI %q: a file URI needs an absolute path, as in %s", uri, defaultURI)
		}
		return path, nil
	case strings.HasPrefix(uri, "/"):
		return uri, nil
	case strings.HasPrefix(uri, "redis://") || strings.HasPrefix(uri, "rediss://"):
		return "", fmt.Errorf("esdump-go reads shared memory only; for Redis, fetch the records with your " +
			"Redis client and judge them with enginestate.StateAtFetch (or use esdump)")
	}
	return "", fmt.Errorf("bad engine-state URI: use file:///dir (shared memory)")
}

// printable escapes control characters (a hostile file name must not reach
// the terminal raw), as esdump does.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			fmt.Fprintf(&b, "\\u{%x}", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}
