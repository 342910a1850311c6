//go:build unix && !linux

package testbed

import (
	"errors"
	"os"
	"syscall"
)

// sysProcAttr: outside Linux there is no parent-death signal, so a server of
// a test run killed with SIGKILL outlives it; Main still stops its bed on
// SIGINT and SIGTERM.
func sysProcAttr(detach bool) *syscall.SysProcAttr {
	if detach {
		return &syscall.SysProcAttr{Setsid: true}
	}
	return &syscall.SysProcAttr{Setpgid: true}
}

func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// pidNamespace: without /proc every process counts as one namespace's.
func pidNamespace() string { return "unknown" }

// isServerOf cannot read another process's arguments portably; it trusts
// the PID.
func isServerOf(pid int, dataDir string) bool { return pidAlive(pid) }

func allocate(f *os.File, size int64) {}

// isStopped cannot be told without /proc; Suspend does not wait.
func isStopped(pid int) bool { return true }

// closeInheritedOnExec marks descriptors 3–255 close-on-exec (see the Linux
// version, which reads the open ones from /proc).
func closeInheritedOnExec() {
	for fd := 3; fd < 256; fd++ {
		syscall.CloseOnExec(fd)
	}
}
