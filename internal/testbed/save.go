package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

const savedVersion = 1

// savedBed is the file Save writes and Attach reads.
type savedBed struct {
	Version      int        `json:"version"`
	Dir          string     `json:"dir"`
	OwnerPID     int        `json:"owner_pid"` // the process that started the servers
	Detached     bool       `json:"detached"`
	OwnsDir      bool       `json:"owns_dir"` // the owner removes Dir when it stops the bed
	ReplPassword string     `json:"repl_password"`
	Clusters     []*Cluster `json:"clusters"`
}

// Save writes a JSON description of b to path (atomically), with everything
// another process needs to Attach to it.
func (b *Bed) Save(path string) error {
	b.mu.Lock()
	data, err := json.MarshalIndent(savedBed{
		Version:      savedVersion,
		Dir:          b.Dir,
		OwnerPID:     b.ownerPID,
		Detached:     b.spec.Detach,
		OwnsDir:      b.ownsDir,
		ReplPassword: b.replPassword,
		Clusters:     b.Clusters,
	}, "", "  ")
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("testbed: save: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("testbed: save: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("testbed: save: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("testbed: save: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("testbed: save: %w", err)
	}
	return nil
}

// Attach returns the bed described by a file that Save wrote, usually in
// another process. The attached bed supports everything that goes through
// SQL (DSN, CreateDatabase, WaitReplicated, StopReplication,
// StartReplication, Promote), but its processes belong to the process that
// started them: Stop on it does nothing, and Kill and Restart return
// ErrNotOwner.
func Attach(path string) (*Bed, error) {
	s, err := readSaved(path)
	if err != nil {
		return nil, err
	}
	b := &Bed{
		Dir:          s.Dir,
		Clusters:     s.Clusters,
		log:          slog.New(slog.DiscardHandler),
		attached:     true,
		ownsDir:      s.OwnsDir,
		ownerPID:     s.OwnerPID,
		replPassword: s.ReplPassword,
	}
	b.spec.Detach = s.Detached
	for _, inst := range b.Instances() {
		inst.readOnly = inst.Role == RoleReplica
	}
	return b, nil
}

func readSaved(path string) (*savedBed, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("testbed: attach: %w", err)
	}
	var s savedBed
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("testbed: attach: %s: %w", path, err)
	}
	if s.Version != savedVersion {
		return nil, fmt.Errorf("testbed: attach: %s has version %d, want %d", path, s.Version, savedVersion)
	}
	if len(s.Clusters) == 0 {
		return nil, fmt.Errorf("testbed: attach: %s describes no clusters", path)
	}
	for _, c := range s.Clusters {
		if c.Primary == nil {
			return nil, fmt.Errorf("testbed: attach: %s: cluster %q has no primary", path, c.Name)
		}
	}
	return &s, nil
}

// ServerPIDs returns the live mariadbd processes serving inst's data
// directory: the PID recorded at start and the one in its PID file (which
// differs after a Restart by another process), each checked against the
// process's command line so a reused PID is never signalled. Tools that
// attach to a bed they did not start (the load tester's faults) find its
// servers with it.
func ServerPIDs(inst *Instance) []int {
	var pids []int
	for _, pid := range []int{inst.PID, readPIDFile(inst.PIDFile)} {
		if pid > 0 && (len(pids) == 0 || pids[0] != pid) && isServerOf(pid, inst.DataDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// running reports whether any server of the bed runs.
func (b *Bed) running() bool {
	for _, inst := range b.Instances() {
		if len(ServerPIDs(inst)) > 0 {
			return true
		}
	}
	return false
}

// shutdownForeign stops servers this process did not start (a detached bed
// from `sandbox up`): SIGTERM to their verified PIDs, SIGKILL after
// shutdownGrace. A server whose PID cannot be verified but that answers on
// its socket is asked to shut down with mariadb-admin.
func (b *Bed) shutdownForeign(ctx context.Context) error {
	return parallel(b.Instances(), func(inst *Instance) error {
		pids := ServerPIDs(inst)
		if len(pids) == 0 {
			if ping(ctx, inst) != nil {
				return nil
			}
			admin, err := lookPath("mariadb-admin")
			if err != nil {
				return fmt.Errorf("testbed: %s answers on %s but its PID is unknown, and %w", inst.Name, inst.Socket, err)
			}
			out, err := exec.CommandContext(ctx, admin, "--no-defaults", "--user=root", "--socket="+inst.Socket, "shutdown").CombinedOutput()
			if err != nil {
				return fmt.Errorf("testbed: %s: mariadb-admin shutdown: %w: %s", inst.Name, err, out)
			}
			return nil
		}
		var errs []error
		for _, pid := range pids {
			errs = append(errs, stopPID(inst, pid))
		}
		return errors.Join(errs...)
	})
}

func stopPID(inst *Instance, pid int) error {
	_ = syscall.Kill(pid, syscall.SIGTERM)
	if waitGone(pid, shutdownGrace) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if waitGone(pid, killWait) {
		return nil
	}
	return fmt.Errorf("testbed: %s (pid %d) still running after SIGKILL", inst.Name, pid)
}

// PIDAlive reports whether pid names a live process (a zombie is dead).
func PIDAlive(pid int) bool { return pidAlive(pid) }

func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for pidAlive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollInterval)
	}
	return true
}
