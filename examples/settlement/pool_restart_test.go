package settlement_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The restart campaign is TestPoolCampaign with server restarts among
// its faults: four workers share a pooled settlement while the test
// SIGKILLs and SIGSTOPs them, ends their sessions, and restarts the
// PostgreSQL server under them (pg_ctl restart -m immediate or -m fast,
// or a stop, 1 to 3 seconds down, and a start), on both ledger layouts.
// The suite's server is shared by parallel tests and must not restart,
// so the campaign makes a private server of its own: initdb into a
// temporary directory and pg_ctl start on a free port of 127.0.0.1, as
// the postgres OS user when the test runs as root (PostgreSQL refuses
// root). It needs only the PostgreSQL server binaries, not
// STEPWISE_TEST_PG, and is skipped, saying so, on a machine without them.
// Every case's run must succeed with no operator action and pass the
// pool campaign's audit.
//
//	STEPWISE_CAMPAIGN_RESTARTS=20 go test -run TestPoolCampaignRestarts ./examples/settlement/   # 20 cases
//	STEPWISE_CAMPAIGN_SEED=1234 go test -run TestPoolCampaignRestarts ./examples/settlement/

// restartCasesEnv sets the restart campaign's number of cases.
const restartCasesEnv = "STEPWISE_CAMPAIGN_RESTARTS"

// restartTally counts the restarts of the campaign by kind.
type restartTally struct{ immediate, fast, down atomic.Int64 }

func TestPoolCampaignRestarts(t *testing.T) {
	t.Parallel()
	srv := startPrivateServer(t) // skips, saying why, without PostgreSQL's binaries
	campaignSeed := uint64(time.Now().UnixNano())
	if v := os.Getenv(campaignSeedEnv); v != "" {
		var err error
		if campaignSeed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", campaignSeedEnv, v, err)
		}
	}
	cases := 2
	if v := os.Getenv(restartCasesEnv); v != "" {
		var err error
		if cases, err = strconv.Atoi(v); err != nil || cases < 1 {
			t.Fatalf("%s=%q: want a number of cases", restartCasesEnv, v)
		}
	}
	t.Logf("restart campaign seed %d, %d cases, on a private PostgreSQL at %s (replay with %s=%d)",
		campaignSeed, cases, srv.url("postgres"), campaignSeedEnv, campaignSeed)
	var tally poolTally
	var restarts restartTally
	var trials atomic.Int64 // the cases run (-run may select some)
	began := time.Now()
	t.Cleanup(func() {
		t.Logf("restart campaign seed %d: %d trials in %s; faults: %d server restarts (%d immediate, %d fast, %d stopped and started), "+
			"%d SIGKILLs (%d of the run's owner), %d sessions ended, %d SIGSTOP pauses past the lease; "+
			"operator actions needed %d (a run that needs one fails its case at once), violations %d, longest recovery from the last fault %s",
			campaignSeed, trials.Load(), time.Since(began).Round(time.Second), tally.restarts.Load(), restarts.immediate.Load(), restarts.fast.Load(),
			restarts.down.Load(), tally.kills.Load(), tally.ownerKills.Load(), tally.terminated.Load(), tally.pauses.Load(),
			tally.operator.Load(), tally.violations.Load(), time.Duration(tally.longest.Load()).Round(time.Millisecond))
		if t.Failed() {
			t.Logf("FAILED restart campaign seed %d: replay with %s=%d go test -run TestPoolCampaignRestarts ./examples/settlement/",
				campaignSeed, campaignSeedEnv, campaignSeed)
		}
	})
	faults := poolFaults{admin: srv.url("postgres"), restart: func(rng *rand.Rand) string {
		return srv.restart(t, rng, &restarts)
	}}
	for i := range cases {
		separate := i%2 == 1
		name := "same store"
		if separate {
			name = "separate store"
		}
		caseSeed := campaignSeed ^ uint64(i+1)<<32
		t.Run(fmt.Sprintf("%s/case %d", name, i), func(t *testing.T) {
			trials.Add(1)
			s := store{db: srv.database(t, fmt.Sprintf("ckpt_%d", i))}
			if separate {
				s.ledger = srv.database(t, fmt.Sprintf("ledger_%d", i))
			}
			seed(t, s.ledgerLoc(), poolLedger)
			poolCaseWith(t, s, rand.New(rand.NewPCG(caseSeed, 0x9002)), &tally, campaignSeed, faults)
		})
	}
	if tally.restarts.Load() == 0 && trials.Load() > 0 {
		t.Errorf("%d cases restarted the server not once: the campaign tested no restart", trials.Load())
	}
}

// privateServer is a PostgreSQL server the test made and owns.
type privateServer struct {
	bin, data, sock, log string
	port                 int
	// owner runs the server's programs as another OS user (runuser -u
	// postgres --) when the test runs as root; empty otherwise.
	owner []string
}

// startPrivateServer initdbs a cluster in a temporary directory, starts
// it on a free port of 127.0.0.1 and stops it when t ends. It skips t
// when the machine has no PostgreSQL server binaries.
func startPrivateServer(t *testing.T) *privateServer {
	t.Helper()
	bin := postgresBinDir()
	if bin == "" {
		t.Skip("no PostgreSQL server binaries (initdb, pg_ctl) found with pg_config --bindir or in /usr/lib/postgresql/*/bin: " +
			"the restart campaign needs a private server it can restart")
	}
	dir := t.TempDir()
	p := &privateServer{bin: bin, data: filepath.Join(dir, "data"), sock: filepath.Join(dir, "run"), log: filepath.Join(dir, "run", "server.log")}
	for _, d := range []string{p.data, p.sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 { // initdb and postgres refuse to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the private server needs the postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// It must reach its directories: t.TempDir's parents are 0700.
		for d := dir; d != filepath.Dir(d) && strings.HasPrefix(d, os.TempDir()) && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{p.data, p.sock} {
			if err := os.Chown(d, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		p.owner = []string{"runuser", "-u", "postgres", "--"}
	}
	if out, err := p.cmd("initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	if err := p.ctl("start"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.ctl("stop", "-m", "immediate"); err != nil {
			t.Error(err)
		}
	})
	return p
}

// postgresBinDir is the directory of initdb and pg_ctl, or "".
func postgresBinDir() string {
	var dirs []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(found) - 1; i >= 0; i-- { // the newest first
		dirs = append(dirs, found[i])
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
				return d
			}
		}
	}
	return ""
}

// cmd is the server program name with args, run as the server's owner.
func (p *privateServer) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, p.owner...), filepath.Join(p.bin, name)), args...)
	return exec.Command(argv[0], argv[1:]...)
}

// ctl runs pg_ctl's action (start, stop, restart) on the server, waiting
// for it to complete.
func (p *privateServer) ctl(action string, args ...string) error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", p.port, p.sock)
	all := append([]string{"-D", p.data, "-l", p.log, "-w", "-t", "60", "-o", opts, action}, args...)
	if out, err := p.cmd("pg_ctl", all...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(p.log)
		return fmt.Errorf("pg_ctl %s %s: %v\n%s\nserver log:\n%s", action, strings.Join(args, " "), err, out, tail(string(log), 3000))
	}
	return nil
}

// url is the URL of database db on the server.
func (p *privateServer) url(db string) string {
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), Path: "/" + db}).String()
}

// database creates database name on the server and returns its URL.
func (p *privateServer) database(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, p.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return p.url(name)
}

// restart restarts the server one of three ways chosen by rng, counting
// it in tally, and says how.
func (p *privateServer) restart(t *testing.T, rng *rand.Rand, tally *restartTally) string {
	t.Helper()
	var err error
	var what string
	switch rng.IntN(3) {
	case 0:
		what = "pg_ctl restart -m immediate"
		tally.immediate.Add(1)
		err = p.ctl("restart", "-m", "immediate")
	case 1:
		what = "pg_ctl restart -m fast"
		tally.fast.Add(1)
		err = p.ctl("restart", "-m", "fast")
	default:
		mode := []string{"fast", "immediate"}[rng.IntN(2)]
		down := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
		what = fmt.Sprintf("pg_ctl stop -m %s, down %s, start", mode, down)
		tally.down.Add(1)
		if err = p.ctl("stop", "-m", mode); err == nil {
			time.Sleep(down)
			err = p.ctl("start")
		}
	}
	if err != nil {
		t.Fatal(errors.Join(errors.New("restarting the private server"), err))
	}
	return what
}
