package cmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/alecthomas/kong"
	"github.com/willabides/kongplete"
)

// completing answers a shell's completion request, if this invocation is
// one: bash (and zsh through bashcompinit) runs the program with
// COMP_LINE and COMP_POINT set, and prints what it writes one a line as
// the candidates. It exits (through the parser's exit) once it answered.
func completing(parser *kong.Kong) {
	if os.Getenv("COMP_LINE") == "" {
		return
	}
	kongplete.Complete(parser)
}

// CompletionCmd prints the shell code that makes the shell complete the
// program's commands and flags.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh" help:"The shell: bash or zsh."`
}

// Run implements the completion command.
func (c *CompletionCmd) Run(env *Env) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("completion: find this program's path: %w", err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return fmt.Errorf("completion: find this program's path: %w", err)
	}
	fmt.Fprint(env.Stdout, completionScript(c.Shell, env.Name, bin))
	return nil
}

// completionScript is the shell code completing name by asking bin.
func completionScript(shell, name, bin string) string {
	line := "complete -C " + shellQuote(bin) + " " + shellQuote(name) + "\n"
	if shell == "zsh" {
		return "autoload -U +X bashcompinit && bashcompinit\n" + line
	}
	return line
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\n'\"\\$`;&|<>()*?[]#~!{}") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
