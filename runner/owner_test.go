package runner_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/runner"
)

// selfIdentity returns this process's boot ID and PID namespace inode as
// the kernel reports them.
func selfIdentity(t *testing.T) (boot, pidns string) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatalf("read the boot ID: %v", err)
	}
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatalf("read the PID namespace: %v", err)
	}
	return strings.TrimSpace(string(b)), strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
}

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

func TestDefaultOwnerRecordsBootAndPIDNamespace(t *testing.T) {
	boot, pidns := selfIdentity(t)
	host, _ := os.Hostname()
	want := fmt.Sprintf("%s:%d boot=%s pidns=%s", host, os.Getpid(), boot, pidns)
	if got := runner.DefaultOwner(); got != want {
		t.Fatalf("DefaultOwner() = %q, want %q", got, want)
	}
}

func TestOwnerGoneOnlyWhenSurelyGone(t *testing.T) {
	boot, pidns := selfIdentity(t)
	host, _ := os.Hostname()
	dead := deadPID(t)
	owner := func(h string, pid int, boot, pidns string) string {
		return fmt.Sprintf("%s:%d boot=%s pidns=%s", h, pid, boot, pidns)
	}
	cases := []struct {
		name  string
		owner string
		gone  bool
	}{
		{"this boot and namespace, process exited", owner(host, dead, boot, pidns), true},
		{"the same under another host name (the PID is what counts)", owner("renamed", dead, boot, pidns), true},
		{"this process", runner.DefaultOwner(), false},
		{"a live process here", owner(host, 1, boot, pidns), false},
		{"another PID namespace (a container on this host)", owner(host, dead, boot, "4026530000"), false},
		{"another boot (a reboot, or another machine of this name)", owner(host, dead, "00000000-0000-0000-0000-000000000000", pidns), false},
		{"old format without an identity", fmt.Sprintf("%s:%d", host, dead), false},
		{"custom owner", "worker-3", false},
		{"bad PID", fmt.Sprintf("%s:x boot=%s pidns=%s", host, boot, pidns), false},
		{"empty", "", false},
	}
	for _, tc := range cases {
		if got := runner.OwnerGone(tc.owner); got != tc.gone {
			t.Errorf("%s: OwnerGone(%q) = %v, want %v", tc.name, tc.owner, got, tc.gone)
		}
	}
}

// A runner killed with SIGKILL whose parent has not yet reaped it is a
// zombie: kill(pid, 0) still succeeds, yet it is gone and its lease is
// taken over at once.
func TestOwnerGoneForAZombie(t *testing.T) {
	boot, pidns := selfIdentity(t)
	host, _ := os.Hostname()
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	owner := fmt.Sprintf("%s:%d boot=%s pidns=%s", host, pid, boot, pidns)
	if runner.OwnerGone(owner) {
		t.Fatalf("OwnerGone(%q) = true for a running process", owner)
	}
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped: the test waits for the zombie state, not for the child.
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatalf("the unreaped child vanished: %v", err)
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i:]), ") Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed child never became a zombie: %s", b)
		}
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("kill(%d, 0) = %v on the zombie; the test needs it to succeed", pid, err)
	}
	if !runner.OwnerGone(owner) {
		t.Errorf("OwnerGone(%q) = false for a zombie", owner)
	}
	c.Wait() // reap it
	if !runner.OwnerGone(owner) {
		t.Errorf("OwnerGone(%q) = false once reaped", owner)
	}
}
