package cmd

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

var ansiCode = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestColouredRunsTableLinesUp: with colours on (CLICOLOR_FORCE, as on a
// terminal) the runs table's columns start where their headers do, once
// the escape codes (which take no room on the screen) are left out.
func TestColouredRunsTableLinesUp(t *testing.T) {
	t.Setenv("CLICOLOR_FORCE", "1")
	t.Setenv("NO_COLOR", "")
	db, side := testFiles(t)
	var out, errb syncBuffer
	if code := Execute(context.Background(), testRegistry(), crashyArgs(db, "k", side, "steps=1"), &out, &errb); code != ExitOK {
		t.Fatalf("run: exit %d: %s", code, errb.String())
	}
	out, errb = syncBuffer{}, syncBuffer{}
	if code := Execute(context.Background(), testRegistry(), []string{"--db", db, "runs"}, &out, &errb); code != ExitOK {
		t.Fatalf("runs: exit %d: %s", code, errb.String())
	}
	if !ansiCode.MatchString(out.String()) {
		t.Fatalf("runs printed no colours with CLICOLOR_FORCE=1:\n%q", out.String())
	}
	lines := strings.Split(strings.TrimRight(ansiCode.ReplaceAllString(out.String(), ""), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("runs printed %d lines; want the header and one run:\n%s", len(lines), out.String())
	}
	head, row := lines[0], lines[1]
	for _, col := range []string{"UPDATED"} {
		i := strings.Index(head, col)
		if i < 0 || i >= len(row) || row[i-1] != ' ' || row[i] == ' ' {
			t.Errorf("column %s starts at %d in the header, not in the row:\n%s\n%s", col, i, head, row)
		}
	}
	t.Setenv("NO_COLOR", "1")
	out = syncBuffer{}
	Execute(context.Background(), testRegistry(), []string{"--db", db, "runs"}, &out, &errb)
	if ansiCode.MatchString(out.String()) {
		t.Errorf("NO_COLOR=1 still colours:\n%q", out.String())
	}
}
