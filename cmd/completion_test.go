package cmd

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestShellCompletion: `completion bash|zsh` prints the shell code that
// has the shell ask this program (complete -C), and the program, run as
// the shell runs it (COMP_LINE, COMP_POINT; a real process), answers with
// the commands and flags that fit.
func TestShellCompletion(t *testing.T) {
	var out, errb syncBuffer
	if code := Execute(context.Background(), testRegistry(), []string{"completion", "bash"}, &out, &errb); code != ExitOK ||
		!strings.HasPrefix(out.String(), "complete -C ") || !strings.HasSuffix(out.String(), " stepwise\n") {
		t.Errorf("completion bash: exit %d, %q %s", code, out.String(), errb.String())
	}
	out = syncBuffer{}
	if code := Execute(context.Background(), testRegistry(), []string{"completion", "zsh"}, &out, &errb); code != ExitOK ||
		!strings.HasPrefix(out.String(), "autoload -U +X bashcompinit && bashcompinit\ncomplete -C ") {
		t.Errorf("completion zsh: exit %d, %q", code, out.String())
	}
	errb = syncBuffer{}
	if code := Execute(context.Background(), testRegistry(), []string{"completion", "fish"}, &out, &errb); code != ExitUsage ||
		!strings.Contains(errb.String(), `"bash","zsh"`) {
		t.Errorf("completion fish: exit %d, %q; want a usage error naming bash and zsh", code, errb.String())
	}

	for _, c := range []struct {
		line string
		want []string
		not  string
	}{
		{"stepwise ru", []string{"run", "runs"}, "show"},
		{"stepwise runs --st", []string{"--status"}, "--job"},
		{"stepwise sho", []string{"show"}, "run"},
	} {
		// As bash runs it: the command, the word completed, the word before.
		words := strings.Fields(c.line)
		child, exit := runChild(t, []string{"COMP_LINE=" + c.line, "COMP_POINT=" + strconv.Itoa(len(c.line))},
			"stepwise", words[len(words)-1], words[len(words)-2])
		got := strings.Fields(child.Stdout())
		if exit.Code != 0 || !containsAll(got, c.want) || slices.Contains(got, c.not) {
			t.Errorf("COMP_LINE=%q: exit %v, candidates %q; want %q and not %q\n%s", c.line, exit, got, c.want, c.not, child.Stderr())
		}
	}

}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
