package runner

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// An owner string names the runner holding a lease. DefaultOwner writes it
// as "HOST:PID boot=BOOT_ID pidns=INODE": operators see "HOST:PID" (see
// checkpoint.OwnerName), and the rest says which kernel boot and PID
// namespace the PID belongs to. Only with both can "its process is gone"
// be decided exactly: a PID means nothing in another container, even on a
// host of the same name, nor after a reboot.
const (
	ownerBootKey  = "boot="
	ownerPIDNSKey = "pidns="
)

// identity is this process's kernel boot ID and PID namespace, read once.
// ok is false where either cannot be read (no /proc): such owners carry no
// identity and are never declared gone.
var identity = sync.OnceValues(func() (string, bool) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	boot := strings.TrimSpace(string(b))
	if err != nil || boot == "" || strings.ContainsAny(boot, " \t\n") {
		return "", false
	}
	// "pid:[4026531836]": the namespace's inode, the same for every
	// process in it and different for every other live namespace.
	link, err := os.Readlink("/proc/self/ns/pid")
	ns, ok := strings.CutPrefix(link, "pid:[")
	ns, ok2 := strings.CutSuffix(ns, "]")
	if err != nil || !ok || !ok2 || ns == "" {
		return "", false
	}
	if _, err := strconv.ParseUint(ns, 10, 64); err != nil {
		return "", false
	}
	return ownerBootKey + boot + " " + ownerPIDNSKey + ns, true
})

// DefaultOwner returns this process's owner string, the name its leases
// and attempts are recorded under: "HOST:PID boot=BOOT_ID pidns=INODE", or
// "HOST:PID" where the boot ID or PID namespace cannot be read (a runner
// so named is never taken over before its lease expires).
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	owner := fmt.Sprintf("%s:%d", host, os.Getpid())
	if id, ok := identity(); ok {
		owner += " " + id
	}
	return owner
}

// OwnerGone reports whether the lease owner names a process that surely no
// longer exists: one of this kernel boot and this PID namespace (as
// DefaultOwner records them) whose PID is free or names a zombie (a
// process that exited, kill -9'd say, and whose parent has not reaped it
// yet). Its lease can then be taken
// over at once. Anything less exact is not gone: an owner in another PID
// namespace (another container on this host, whatever its host name), of
// another boot or machine, or recorded without an identity (an older
// Stepwise, a custom Config.Owner) keeps its lease until it expires. A
// reused PID only makes us wait for the lease as well; the fence keeps a
// takeover safe either way.
func OwnerGone(owner string) bool {
	self, ok := identity()
	if !ok {
		return false
	}
	name, id, ok := strings.Cut(owner, " ")
	if !ok || id != self {
		return false
	}
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return false
	}
	pid, err := strconv.Atoi(name[i+1:])
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) || exited(pid)
}

// exited reports whether the process pid has exited and only its zombie
// is left (state Z, or X while being reaped), waiting for its parent to
// collect it: kill(pid, 0) still succeeds on it, yet it runs no code and
// holds no lease. Only asked of a PID of this boot and PID namespace, so
// /proc names the very process.
func exited(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist) // reaped since kill looked
	}
	// "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the
	// state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] == 'Z' || b[i+2] == 'X'
}
