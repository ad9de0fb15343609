package cmd

import (
	"testing"
)

// Every text flag and argument is valid UTF-8 without control characters
// (newlines allowed in --reason): exit 2 naming the flag, before anything
// is read or changed; and an operator's resume and rerun are recorded
// with their claims.
func TestOperatorTextIsCheckedOnTheCommandLine(t *testing.T) {
	t.Setenv("STEPWISE_OPERATOR", "ops-carol")
	c := newOpsCLI(t)
	c.staleCrashy("k1")
	c.want(ExitOK, nil, "recover", "crashy/k1")
	before := c.run("crashy/k1").info
	for _, args := range [][]string{
		{"resume", "crashy/k1", "--reason", "why\x00not"},
		{"resume", "crashy/k1", "--reason", "\x1b[31mred"},
		{"abandon", "crashy/k1", "--reason", "caf\xe9"},
		{"abandon", "crashy/k1", "--reason", "gone", "--operator", "bob\x07"},
		{"reset", "crashy/k1", "--step", "a\x00", "--reason", "redo"},
		{"rerun", "crashy/k1", "--from-step", "a", "--reason", "redo\u0085"},
		{"resolve", "crashy/k1", "--step", "a", "--as", "done", "--reason", "x\x7f"},
		{"outbox", "requeue", "--run", "crashy/k1", "--reason", "fixed\x00"},
		{"show", "crashy/k1\x00"},
	} {
		c.want(ExitUsage, []string{"without control characters"}, args...)
	}
	c.want(ExitUsage, []string{"--operator is not valid UTF-8"}, "abandon", "crashy/k1", "--reason", "gone", "--operator", "b\xffb")
	c.want(ExitUsage, []string{"--reason: the value holds a NUL"}, "abandon", "crashy/k1", "--reason", "a\x00")
	c.want(ExitUsage, []string{"--step: the value holds a NUL"}, "reset", "crashy/k1", "--step", "a\x00", "--reason", "redo")
	// From the environment as from a flag.
	t.Setenv("STEPWISE_OPERATOR", "ops\x1b")
	c.want(ExitUsage, []string{"--operator"}, "abandon", "crashy/k1", "--reason", "gone")
	// $USER is read by the operation, which checks it with the same rule.
	t.Setenv("STEPWISE_OPERATOR", "")
	t.Setenv("USER", "eve\x1b")
	c.want(ExitUsage, []string{"operator holds the control character"}, "abandon", "crashy/k1", "--reason", "gone")
	after := c.run("crashy/k1").info
	if after.Run.Status != before.Run.Status || after.Run.Fence != before.Run.Fence || len(after.Attempts) != len(before.Attempts) {
		t.Errorf("after the refused commands the run is %+v with %d attempts; want it as it was (%s, fence %d, %d attempts)",
			after.Run, len(after.Attempts), before.Run.Status, before.Run.Fence, len(before.Attempts))
	}
	c.wantAudits("crashy/k1", "recover")

	// A reason may span lines; a resume with one is recorded, with its
	// claim, and so is a rerun.
	t.Setenv("USER", "ops-dave")
	c.want(ExitOK, nil, "resume", "crashy/k1", "--reason", "the host is back\nticket 42")
	c.want(ExitOK, nil, "rerun", "crashy/k1", "--force", "--reason", "check again")
	as := c.wantAudits("crashy/k1", "recover", "resume", "rerun")
	if as[1].Reason != "the host is back\nticket 42" || as[1].Operator != "ops-dave" {
		t.Errorf("the resume's record = %+v; want its reason as given, by ops-dave", as[1])
	}
	// show keeps its table on one line a record.
	c.want(ExitOK, []string{"resume   the host is back / ticket 42  \n"}, "show", "crashy/k1")
}
