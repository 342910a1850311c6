package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// launch starts inst's server and waits until it answers on its socket. With
// pickPort it takes a fresh free port, and another if the server finds it
// taken; otherwise it keeps inst.Port and retries while that port is busy.
func (b *Bed) launch(ctx context.Context, inst *Instance, pickPort bool) error {
	for attempt := 1; ; attempt++ {
		if pickPort {
			port, err := freePort()
			if err != nil {
				return err
			}
			inst.Port = port
		}
		logStart := fileSize(inst.ErrorLog)
		p, err := b.spawn(inst)
		if err != nil {
			return err
		}
		err = b.waitReady(ctx, inst, p, logStart)
		if err == nil || !errors.Is(err, errPortInUse) || attempt >= maxPortAttempts {
			return err
		}
		b.log.Debug("port in use, retrying", "name", inst.Name, "port", inst.Port, "attempt", attempt)
		if !pickPort {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(10 * pollInterval):
			}
		}
	}
}

// serverArgs are mariadbd's flags for inst. --no-defaults comes first so no
// option file (/etc/mysql/…) interferes; character set and collation are
// then set to what Debian's own configuration would have given.
func (b *Bed) serverArgs(inst *Instance) []string {
	args := []string{
		"--no-defaults",
		"--datadir=" + inst.DataDir,
		"--socket=" + inst.Socket,
		"--port=" + strconv.Itoa(inst.Port),
		"--bind-address=" + inst.Host,
		"--pid-file=" + inst.PIDFile,
		"--log-error=" + inst.ErrorLog,
		"--log-bin=mysql-bin",
		"--relay-log=relay-bin",
		"--binlog-format=ROW",
		"--server-id=" + strconv.Itoa(inst.ServerID),
		"--gtid-strict-mode=1",
		"--innodb-flush-log-at-trx-commit=1",
		"--sync-binlog=1",
		"--skip-name-resolve",
		"--log-slave-updates",
		"--slave-parallel-threads=4",
		"--slave-parallel-mode=optimistic",
		"--character-set-server=utf8mb4",
		"--collation-server=utf8mb4_general_ci",
	}
	args = append(args, b.spec.Server.args()...)
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	if inst.readOnly {
		args = append(args, "--read-only=1")
	}
	return append(args, b.spec.ServerArgs...)
}

// process is a mariadbd this process started.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // cmd.Wait's result; read it after done
}

func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// terminate shuts the server down with SIGTERM and waits; after
// shutdownGrace it sends SIGKILL.
func (p *process) terminate(inst *Instance, log *slog.Logger) error {
	if !p.running() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a Suspended server handles SIGTERM only once continued
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(shutdownGrace):
	}
	log.Warn("instance did not shut down in time; killing it", "name", inst.Name, "grace", shutdownGrace)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("testbed: %s (pid %d) still running after SIGKILL", inst.Name, p.cmd.Process.Pid)
	}
}

func (b *Bed) spawn(inst *Instance) (*process, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return nil, ErrStopped
	}
	out, err := os.OpenFile(filepath.Join(inst.dir(), "mariadbd.out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	defer out.Close() // the child has its own copy
	cmd := exec.Command(b.bins.mariadbd, b.serverArgs(inst)...)
	if inst.netns != "" {
		// ip execs mariadbd after entering the namespace: the PID is the
		// server's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", inst.netns, b.bins.mariadbd}, b.serverArgs(inst)...)...)
	}
	cmd.Dir = inst.dir()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr(b.spec.Detach)
	closeInheritedOnExec()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: start %s: %w", inst.Name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	inst.proc, inst.PID = p, cmd.Process.Pid
	return p, nil
}

var errPortInUse = errors.New("port in use")

// waitReady polls inst's socket until the server answers, it exits, or ctx
// ends. Errors carry the tail of the server's error log.
func (b *Bed) waitReady(ctx context.Context, inst *Instance, p *process, logStart int64) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		if ping(ctx, inst) == nil {
			return nil
		}
		select {
		case <-p.done:
			// The server's log is the only account of why it stopped.
			if strings.Contains(readFrom(inst.ErrorLog, logStart), "Address already in use") {
				return fmt.Errorf("testbed: %s: %w: %d", inst.Name, errPortInUse, inst.Port)
			}
			return fmt.Errorf("testbed: %s exited during start-up (%v)\n%s", inst.Name, p.err, tail(inst.ErrorLog))
		case <-ctx.Done():
			return fmt.Errorf("testbed: %s did not answer on %s: %w\n%s", inst.Name, inst.Socket, ctx.Err(), tail(inst.ErrorLog))
		case <-ticker.C:
		}
	}
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before mariadbd binds it; launch then retries with another.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testbed: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(b)
}

// reapStaleDirs removes the temporary directories of beds whose owner died
// without stopping them (a test binary killed by its timeout, say): their
// servers died with the owner, but 100 MB of data per instance stayed. A
// directory is removed only if its owner is gone and none of its servers
// runs.
//
// /tmp may be shared by processes that cannot see each other's PIDs (a CI
// run in a container on the machine where a developer runs tests): there a
// live owner looks dead. So a directory whose owner lives in another PID
// namespace is never judged, and one where any server still answers on its
// socket is kept whatever its owner file says.
func reapStaleDirs(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	ns := pidNamespace()
	for _, dir := range dirs {
		owner, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // still being created, or detached
		}
		pid, ownerNS, ok := parseOwner(string(owner))
		if !ok || pidAlive(pid) || ownerNS != ns {
			continue
		}
		if anyServerRuns(dir) || anySocketAnswers(dir) {
			continue
		}
		log.Debug("removing stale test bed directory", "dir", dir)
		os.RemoveAll(dir)
	}
}

// ownerLine is what a bed writes to its owner file: the owner's PID and the
// PID namespace that PID means something in.
func ownerLine(pid int) string {
	return strconv.Itoa(pid) + " " + pidNamespace()
}

// parseOwner reads an owner line. A file written before the namespace was
// recorded holds the PID alone; it counts as this namespace's, as it was
// then judged.
func parseOwner(line string) (pid int, ns string, ok bool) {
	f := strings.Fields(line)
	if len(f) == 0 || len(f) > 2 {
		return 0, "", false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, "", false
	}
	ns = pidNamespace()
	if len(f) == 2 {
		ns = f[1]
	}
	return pid, ns, true
}

// anySocketAnswers reports whether a server of dir accepts a connection on
// its Unix socket, which works across PID namespaces where /proc does not.
func anySocketAnswers(dir string) bool {
	socks, _ := filepath.Glob(filepath.Join(dir, "*", "mysqld.sock"))
	for _, s := range socks {
		if c, err := net.DialTimeout("unix", s, 500*time.Millisecond); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

func anyServerRuns(dir string) bool {
	pidFiles, _ := filepath.Glob(filepath.Join(dir, "*", "mysqld.pid"))
	for _, pf := range pidFiles {
		if pid := readPIDFile(pf); pid > 0 && isServerOf(pid, filepath.Join(filepath.Dir(pf), "data")) {
			return true
		}
	}
	return false
}

func readPIDFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}
