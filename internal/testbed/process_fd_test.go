//go:build linux

package testbed

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func fdFlags(t *testing.T, fd int) uintptr {
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	return flags
}

// A descriptor inherited without close-on-exec (as `flock LOCK cmd` hands
// its lock down) must not reach the servers the bed starts.
func TestInheritedDescriptorsCloseOnExec(t *testing.T) {
	fd, err := syscall.Open(filepath.Join(t.TempDir(), "lock"), os.O_CREATE|os.O_RDWR, 0o600) // no O_CLOEXEC
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if fdFlags(t, fd)&syscall.FD_CLOEXEC != 0 {
		t.Fatal("setup: the descriptor is already close-on-exec")
	}
	closeInheritedOnExec()
	if fdFlags(t, fd)&syscall.FD_CLOEXEC == 0 {
		t.Fatalf("descriptor %d would still pass to the servers", fd)
	}
}
