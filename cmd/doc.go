// Package cmd is the stepwise command line. A program that defines its own
// jobs gets the whole CLI with one call:
//
//	func main() { cmd.Main(registry) }
//
// The program calls itself by the base name of os.Args[0] in its usage,
// errors and hints (`mytool resume RUN_ID`); cmd.Name("mytool") fixes the
// name. `--version` prints the module version and VCS revision from the
// build information, `help CMD` a command's help, and every command that
// prints a result takes --json.
//
// Import rule: cmd imports runner, jobs, steps and checkpoint; nothing
// imports cmd but main packages. It holds a checkpoint.Backend; the one
// file that knows the stores (store.go) parses --db and opens the store
// it names: a path opens SQLite (checkpoint/sqlite).
//
// Exit codes, decided in one place (ExitCode):
//
//	0  the run succeeded (or had already succeeded)
//	1  the run failed
//	2  bad usage or input
//	3  interrupted, resumable
//	4  another process holds it: a live runner's lease, a lease lost
//	   mid-run, or the database locked by another process
//	5  needs an operator decision (a changed step or batch item, an outside
//	   call of unknown outcome, an abandoned or pruned run, a refused
//	   manual operation)
package cmd
