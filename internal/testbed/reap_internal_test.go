package testbed

import (
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// Only a bed whose owner is dead in this PID namespace and whose servers
// neither run nor answer is removed: a CI run in a container beside a
// developer's tests keeps its bed though its owner's PID means nothing here.
func TestReapSparesBedsItCannotJudge(t *testing.T) {
	// No t.Parallel: TMPDIR is this test's for its duration.
	tmp, err := os.MkdirTemp("", "reap") // short: Unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)

	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := gone.Process.Pid
	if pidAlive(dead) {
		t.Skipf("pid %d was reused already", dead)
	}
	for i, tc := range []struct {
		name    string
		owner   string
		socket  bool // a server answers on c1-primary/mysqld.sock
		removed bool
	}{
		{"dead owner", ownerLine(dead), false, true},
		{"dead owner, written before namespaces", strconv.Itoa(dead), false, true},
		{"live owner", ownerLine(os.Getpid()), false, false},
		{"owner of another namespace", strconv.Itoa(dead) + " pid:[1]", false, false},
		{"dead owner, a server answers", ownerLine(dead), true, false},
		{"unreadable owner", "not a pid", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(tmp, tempPrefix+strconv.Itoa(i))
			inst := filepath.Join(dir, "c1-primary")
			if err := os.MkdirAll(inst, 0o755); err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(tc.owner), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.socket {
				ln, err := net.Listen("unix", filepath.Join(inst, "mysqld.sock"))
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						c.Close()
					}
				}()
			}
			reapStaleDirs(slog.New(slog.DiscardHandler))
			_, err := os.Stat(dir)
			if removed := os.IsNotExist(err); removed != tc.removed {
				t.Fatalf("removed %v, want %v (stat: %v)", removed, tc.removed, err)
			}
		})
	}
}
