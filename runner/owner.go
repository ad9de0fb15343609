package runner

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// DefaultOwner returns "host:pid" for this process, the name its leases and
// attempts are recorded under.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// ownerGone reports whether the lease owner "host:pid" is a process on this
// host that no longer exists. A reused PID only makes us wait for the lease
// to expire; the fence keeps the takeover safe either way.
func ownerGone(self string) func(owner string) bool {
	selfHost, _, _ := strings.Cut(self, ":")
	return func(owner string) bool {
		i := strings.LastIndexByte(owner, ':')
		if i < 0 || owner[:i] != selfHost {
			return false
		}
		pid, err := strconv.Atoi(owner[i+1:])
		if err != nil || pid <= 0 {
			return false
		}
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
}
