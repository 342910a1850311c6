//go:build linux

package testbed

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// sysProcAttr ties a non-detached server to the process that starts it: the
// kernel sends SIGKILL when the starting thread's process dies, however it
// dies (a test timeout, a panic, kill -9), so no server outlives its test run.
// Setpgid keeps a terminal's Ctrl-C away from the servers, so the owner shuts
// them down in order. A detached server starts its own session instead.
//
// Pdeathsig survives mariadbd because --user=root changes no credentials
// when it already runs as root.
func sysProcAttr(detach bool) *syscall.SysProcAttr {
	if detach {
		return &syscall.SysProcAttr{Setsid: true}
	}
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// pidNamespace names this process's PID namespace ("pid:[4026531836]"), so
// that a PID written to a file is judged only where it means the same
// process.
func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "unknown"
	}
	return ns
}

// pidAlive reports whether pid names a live process (a zombie is dead).
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S …".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// isServerOf reports whether pid is a live mariadbd serving dataDir, so that
// a PID read from a file is never signalled after the kernel reused it.
func isServerOf(pid int, dataDir string) bool {
	if !pidAlive(pid) {
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, arg := range bytes.Split(cmdline, []byte{0}) {
		if string(arg) == "--datadir="+dataDir {
			return true
		}
	}
	return false
}

// allocate gives a sparse copy the disk blocks its source had, as
// mariadb-install-db leaves them, so the first pass over the redo log does
// not allocate blocks under fsync. Filesystems that cannot are left sparse.
func allocate(f *os.File, size int64) {
	if size > 0 {
		_ = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	}
}

// isStopped reports whether pid is stopped by a signal (state T in
// /proc/PID/stat).
func isStopped(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'T'
}

// closeInheritedOnExec marks every descriptor this process inherited (3 and
// up) close-on-exec, so that a server started from here does not keep
// them. Go opens its own files close-on-exec, but a descriptor handed down
// by a parent stays open across exec: a sandbox started under
// `flock LOCK make bench-…` passed the lock's descriptor to its mariadbd,
// which held the lock for as long as the sandbox ran.
func closeInheritedOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
