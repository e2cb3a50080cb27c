// Package formatdoc reads the tables of docs/FORMAT.md (each after a
// `<!-- table: NAME -->` marker), as reader/tests/format_doc.rs does: the Go
// tests check the same cases as the Rust ones, so the two cannot drift.
package formatdoc

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Table is the rows of the table called name, header and separator
// skipped, each cell trimmed of spaces and backticks.
func Table(t testing.TB, name string) [][]string {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	doc, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "docs", "FORMAT.md"))
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- table: " + name + " -->"
	_, rest, found := strings.Cut(string(doc), marker)
	if !found {
		t.Fatalf("docs/FORMAT.md has no %s", marker)
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimLeft(rest, "\n"), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			break
		}
		var cells []string
		for _, cell := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.ReplaceAll(strings.TrimSpace(cell), "`", ""))
		}
		rows = append(rows, cells)
	}
	if len(rows) <= 2 {
		t.Fatalf("table %s is empty", name)
	}
	return rows[2:]
}
