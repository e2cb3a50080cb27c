// Command esdump-go prints every engine of an engine-state shared-memory
// directory as JSON, exactly as `esdump --json` does: a small example of the
// Go package enginestate (no cgo). Engines whose files cannot be read are
// reported on standard error, one line each; the others are still printed.
// With -cache ENGINE it prints that engine's cache digest instead
// (docs/FORMAT.md, "Cache residency"): one header line, then one entry per
// line as 16 hex digits, ascending. With -replicas it prints the router
// replicas' shared reservations instead (docs/FORMAT.md, "Shared
// reservations"), exactly as `esdump --replicas --json` does.
//
//	esdump-go [--uri file:///dev/shm/agentic_engine_state] [--stale-after 2000]
//	esdump-go [--uri ...] -cache ENGINE
//	esdump-go [--uri ...] -replicas
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
		// Escaped as every stderr line is: the message may quote a URI or
		// a directory name holding control characters.
		fmt.Fprintf(os.Stderr, "esdump-go: %s\n", printable(err.Error()))
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("esdump-go", flag.ContinueOnError)
	flags.SetOutput(stderr)
	uri := flags.String("uri", "", "where the engines publish: file:///dir (default $"+uriEnv+", else "+defaultURI+")")
	staleAfter := flags.Uint64("stale-after", 2000, "a heartbeat older than this (ms) makes an engine stale")
	flags.Bool("json", true, "print JSON (the only output of esdump-go; accepted for esdump's flags)")
	cache := flags.String("cache", "", "print this engine's cache digest (<dir>.cache/ENGINE): a header line, then one 16-hex entry per line")
	replicas := flags.Bool("replicas", false, "print the router replicas' reservations (<dir>.routers) as "+
		"esdump --replicas --json does")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("unexpected argument %q; esdump-go takes flags only (-h lists them)", flags.Arg(0))
	}
	if *staleAfter == 0 {
		return fmt.Errorf("--stale-after must be at least 1 ms")
	}
	dir, err := directory(*uri)
	if err != nil {
		return err
	}
	if *cache != "" {
		return printDigest(dir, *cache, stdout)
	}
	opts := enginestate.DefaultOptions()
	opts.Freshness.StaleAfter = time.Duration(*staleAfter) * time.Millisecond
	if *replicas {
		return printReplicas(dir, opts, stdout, stderr)
	}
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

// printDigest prints engine id's digest file: a header line of its fields
// (name=value), then its entries, one per line, as 16 hex digits.
func printDigest(dir, id string, stdout io.Writer) error {
	if ok, reason := enginestate.ValidEngineID(id); !ok {
		return fmt.Errorf("-cache %q is not an engine id (%s): give the id of an engine publishing into %s", id, reason, dir)
	}
	file, err := enginestate.OpenDigestFile(filepath.Join(enginestate.CacheDir(dir), id))
	if err != nil {
		return err
	}
	defer file.Close()
	r, err := file.Read()
	if err != nil {
		return err
	}
	state := "active"
	if r.State == enginestate.StateRetired {
		state = "retired"
	}
	out := bufio.NewWriter(stdout)
	fmt.Fprintf(out, "engine_id=%s state=%s version=%d count=%d held=%d capacity=%d generation=%d writer_pid=%d "+
		"kv_block_size=%d captured_mono_ns=%d captured_unix_ns=%d created_unix_ns=%d\n",
		id, state, r.Digest.Version, r.Digest.Len(), r.Held, r.Capacity, r.Generation, r.WriterPID,
		r.KVBlockSize, r.Digest.CapturedMonoNs, r.CapturedUnixNs, r.CreatedUnixNs)
	for _, block := range r.Digest.Blocks {
		fmt.Fprintf(out, "%016x\n", block)
	}
	return out.Flush()
}

// printReplicas prints every replica of dir's routers directory as JSON;
// the per-replica errors go to stderr.
func printReplicas(dir string, opts enginestate.Options, stdout, stderr io.Writer) error {
	source, err := enginestate.OpenReplicas(dir, "", opts)
	if err != nil {
		return err
	}
	defer source.Close()
	reading, err := source.Read()
	if err != nil {
		return err
	}
	if _, err := stdout.Write(enginestate.FormatReplicasJSON(reading.Replicas)); err != nil {
		return err
	}
	for _, bad := range reading.Errors {
		fmt.Fprintf(stderr, "esdump-go: %s\n", printable(bad.Error()))
	}
	return nil
}

// directory is the directory a URI names: --uri wins over the environment.
// The rules are esdump's (reader/src/uri.rs; docs/FORMAT.md "Naming and
// permissions"): a file URI or path takes no query, and a bad URI is shown
// redacted.
func directory(uri string) (string, error) {
	if uri == "" {
		uri = os.Getenv(uriEnv)
	}
	uri = strings.TrimSpace(uri)
	if uri == "" {
		uri = defaultURI
	}
	bad := func(why string) error {
		return fmt.Errorf("bad engine-state URI %s: %s", redact(uri), why)
	}
	isFile := strings.HasPrefix(uri, "file://") || strings.HasPrefix(uri, "/")
	if isFile && strings.Contains(uri, "?") {
		return "", bad(queryRefused)
	}
	switch {
	case strings.HasPrefix(uri, "file://"):
		path := strings.TrimPrefix(strings.TrimPrefix(uri, "file://"), "localhost")
		if !strings.HasPrefix(path, "/") {
			return "", bad("a file URI needs an absolute path, as in " + defaultURI)
		}
		return path, nil
	case strings.HasPrefix(uri, "/"):
		return uri, nil
	case strings.HasPrefix(uri, "redis://") || strings.HasPrefix(uri, "rediss://"):
		return "", fmt.Errorf("esdump-go reads shared memory only; for Redis, fetch the records with your " +
			"Redis client and judge them with enginestate.StateAtFetch (or use esdump)")
	}
	return "", bad("use file:///dir (shared memory)")
}

// queryRefused is why a file URI with a query is refused (esdump says the same).
const queryRefused = "a query is not allowed in a file URI (a '?' would become part of the " +
	"directory's name): give the directory alone, as in " + defaultURI +
	", and rename a directory whose name has a '?'"

// visibleParameters are the query parameters whose values redact shows
// (the Redis URI parameters, settings/src/redact.rs VISIBLE_PARAMETERS).
var visibleParameters = map[string]bool{"prefix": true, "ttl_ms": true, "timeout_ms": true}

// redact hides a URI's credentials as esdump does (settings/src/redact.rs,
// docs/FORMAT.md table uri_redact): the user part of the authority (up to
// the first '/', '?' or '#' after "scheme://") becomes "user:***@" or
// "***@", and the value of every query parameter but visibleParameters
// becomes "***".
func redact(uri string) string {
	if scheme, rest, ok := strings.Cut(uri, "://"); ok {
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		authority, tail := rest[:end], rest[end:]
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			userinfo, host := authority[:at], authority[at+1:]
			if user, _, ok := strings.Cut(userinfo, ":"); ok {
				uri = scheme + "://" + user + ":***@" + host + tail
			} else {
				uri = scheme + "://***@" + host + tail
			}
		}
	}
	base, rest, ok := strings.Cut(uri, "?")
	if !ok {
		return uri
	}
	query, fragment, hasFragment := strings.Cut(rest, "#")
	pairs := strings.Split(query, "&")
	for i, pair := range pairs {
		if name, _, ok := strings.Cut(pair, "="); ok && !visibleParameters[name] {
			pairs[i] = name + "=***"
		}
	}
	out := base + "?" + strings.Join(pairs, "&")
	if hasFragment {
		out += "#" + fragment
	}
	return out
}

// printable escapes control characters and bidirectional-text overrides (a
// hostile file name must not reach the terminal raw) exactly as esdump does
// (reader/src/printable.rs, docs/FORMAT.md table printable): \t, \r, \n,
// \0, else \u{hex}.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == 0:
			b.WriteString(`\0`)
		case r < 0x20 || (r >= 0x7f && r < 0xa0) || (r >= 0x200b && r <= 0x200f) ||
			(r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069):
			fmt.Fprintf(&b, "\\u{%x}", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
