package loadtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/internal/testbed"
)

// Fault is something a run can break mid-phase and repair: a sandbox
// primary or the router.
type Fault interface {
	// Name says what it is, e.g. "c1-primary" or "router".
	Name() string
	// Kill stops it as a crash would (SIGKILL) and returns once it is gone.
	Kill(ctx context.Context) error
	// Restart brings it back and returns once it answers.
	Restart(ctx context.Context) error
}

// BedFault kills and restarts an instance of a bed this process started
// (tests), through the bed's own Kill and Restart.
type BedFault struct {
	Bed  *testbed.Bed
	Inst *testbed.Instance
}

var _ Fault = BedFault{}

func (f BedFault) Name() string                      { return f.Inst.Name }
func (f BedFault) Kill(context.Context) error        { return f.Bed.Kill(f.Inst) }
func (f BedFault) Restart(ctx context.Context) error { return f.Bed.Restart(ctx, f.Inst) }

// InstanceFault kills and restarts a server of a detached sandbox (`make
// run`), which belongs to no running process: Kill reads the server's own
// command line from /proc, checks that it serves the instance's data
// directory and sends SIGKILL; Restart runs the same command line again in
// a session of its own (the server outlives the load test, as the
// sandbox's servers do) and waits until it answers SQL. Linux only.
type InstanceFault struct {
	Inst *testbed.Instance

	mu   sync.Mutex
	argv []string
	dir  string
}

var _ Fault = (*InstanceFault)(nil)

// NewInstanceFault finds the instance named name ("c1-primary") in bed.
func NewInstanceFault(bed *testbed.Bed, name string) (*InstanceFault, error) {
	for _, inst := range bed.Instances() {
		if inst.Name == name {
			return &InstanceFault{Inst: inst}, nil
		}
	}
	var names []string
	for _, inst := range bed.Instances() {
		names = append(names, inst.Name)
	}
	return nil, fmt.Errorf("fault: no instance %q in the sandbox (it has %v, or use router)", name, names)
}

func (f *InstanceFault) Name() string { return f.Inst.Name }

// serverPID returns the live mariadbd serving the instance's data
// directory and its command line (to start it again the same way).
func (f *InstanceFault) serverPID() (int, []string, error) {
	for _, pid := range testbed.ServerPIDs(f.Inst) {
		if argv, err := cmdline(pid); err == nil {
			return pid, argv, nil
		}
	}
	return 0, nil, fmt.Errorf("fault: no running server for %s (data directory %s)", f.Inst.Name, f.Inst.DataDir)
}

// Kill implements Fault.
func (f *InstanceFault) Kill(ctx context.Context) error {
	pid, argv, err := f.serverPID()
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.argv, f.dir = argv, filepath.Dir(f.Inst.DataDir)
	f.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("fault: kill %s (pid %d): %w", f.Inst.Name, pid, err)
	}
	return waitGone(ctx, pid)
}

// Restart implements Fault.
func (f *InstanceFault) Restart(ctx context.Context) error {
	f.mu.Lock()
	argv, dir := f.argv, f.dir
	f.mu.Unlock()
	if argv == nil {
		return errors.New("fault: restart before kill")
	}
	out, err := os.OpenFile(filepath.Join(dir, "mariadbd.out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("fault: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("fault: restart %s: %w", f.Inst.Name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	dsn := f.Inst.DSN("")
	for {
		if pingSQL(ctx, dsn) == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("fault: %s exited during restart (%v); see %s", f.Inst.Name, err, f.Inst.ErrorLog)
		case <-ctx.Done():
			return fmt.Errorf("fault: %s did not answer after restart: %w", f.Inst.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func pingSQL(ctx context.Context, dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return err
	}
	cfg.Timeout = time.Second
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return db.PingContext(pctx)
}

// cmdline reads a process's argv from /proc.
func cmdline(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(data) == 0 {
		return nil, fmt.Errorf("no command line for pid %d", pid)
	}
	var argv []string
	for _, a := range bytes.Split(bytes.TrimSuffix(data, []byte{0}), []byte{0}) {
		argv = append(argv, string(a))
	}
	return argv, nil
}

func waitGone(ctx context.Context, pid int) error {
	deadline := time.Now().Add(10 * time.Second)
	for testbed.PIDAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("fault: pid %d still running 10s after SIGKILL", pid)
		}
		if err := ctxwait.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// RouterProcess is a router this process runs as a child (bin/router over
// a topology file), so that a run measures the router built from the
// current source without touching one started by `make run`, and so that
// it can be killed and restarted as a fault. The child dies with this
// process (SIGKILL on parent death, Linux).
type RouterProcess struct {
	Bin, Topology, LogPath string
	// Args are extra router flags (e.g. -commit-workers 2).
	Args []string
	// Addr is the listen address; Start picks a free loopback port when
	// it is empty.
	Addr string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  io.WriteCloser
}

var _ Fault = (*RouterProcess)(nil)

// URL is the router's base URL.
func (r *RouterProcess) URL() string { return "http://" + r.Addr }

// Name implements Fault.
func (r *RouterProcess) Name() string { return "router" }

// Start starts the router and waits until /readyz answers.
func (r *RouterProcess) Start(ctx context.Context) error {
	if r.Addr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("router: pick a port: %w", err)
		}
		r.Addr = ln.Addr().String()
		ln.Close()
	}
	if r.LogPath == "" {
		r.LogPath = os.DevNull
	}
	out, err := os.OpenFile(r.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	cmd := exec.Command(r.Bin, append([]string{"-listen", r.Addr, "-topology", r.Topology}, r.Args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("router: start %s: %w", r.Bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done, r.log = cmd, done, out
	r.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ready := make(chan error, 1)
	probe := NewRouter(r.URL(), 1, "")
	defer probe.Close()
	go func() { ready <- probe.Ready(rctx) }()
	select {
	case err := <-ready:
		if err != nil {
			r.Stop()
			return fmt.Errorf("router: %w (log: %s)", err, r.LogPath)
		}
		return nil
	case <-done:
		cancel()
		return fmt.Errorf("router exited during start-up; see %s", r.LogPath)
	}
}

// Kill implements Fault: SIGKILL, and wait until it is gone.
func (r *RouterProcess) Kill(ctx context.Context) error {
	r.mu.Lock()
	cmd, done, out := r.cmd, r.done, r.log
	r.mu.Unlock()
	if cmd == nil {
		return errors.New("router: not running")
	}
	cmd.Process.Kill()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	out.Close()
	return nil
}

// Restart implements Fault: start again on the same address.
func (r *RouterProcess) Restart(ctx context.Context) error { return r.Start(ctx) }

// Stop asks the router to drain and stop (SIGTERM), and kills it after
// 15 s. Safe to call twice.
func (r *RouterProcess) Stop() {
	r.mu.Lock()
	cmd, done, out := r.cmd, r.done, r.log
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	out.Close()
}

// EnsureSandbox returns the sandbox described by dir/testbed.json when its
// primaries answer; otherwise it starts one there, as `make run` does
// (detached: it outlives this process; `make stop` stops it), printing
// where everything is to out.
func EnsureSandbox(ctx context.Context, dir string, clusters, replicas int, out io.Writer) (*testbed.Bed, bool, error) {
	desc := filepath.Join(dir, testbed.DescriptionFile)
	if bed, err := testbed.Attach(desc); err == nil {
		up := true
		for _, c := range bed.Clusters {
			if pingSQL(ctx, c.Primary.DSN("")) != nil {
				up = false
				break
			}
		}
		if up {
			return bed, false, nil
		}
	}
	// A bed whose servers are partly down is started again where it is,
	// its data kept (as `make run` does).
	spec := testbed.Spec{Clusters: clusters, Replicas: replicas, NoReplicas: replicas == 0}
	bed, started, _, err := testbed.SandboxEnsure(ctx, dir, spec, out)
	if err != nil {
		return nil, false, err
	}
	return bed, started, nil
}

// CPU is the router process as a CPUSource (a restarted router is a new
// process).
func (r *RouterProcess) CPU() CPUSource {
	return CPUSource{Name: "router", PIDs: func() []int {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.cmd == nil || r.cmd.Process == nil {
			return nil
		}
		select {
		case <-r.done:
			return nil
		default:
			return []int{r.cmd.Process.Pid}
		}
	}}
}

// SandboxCPU is every server of the sandbox as one CPUSource.
func SandboxCPU(bed *testbed.Bed) CPUSource {
	insts := bed.Instances()
	return CPUSource{Name: "mariadbd", PIDs: func() []int {
		var pids []int
		for _, inst := range insts {
			pids = append(pids, testbed.ServerPIDs(inst)...)
		}
		return pids
	}}
}

// RoutersCPU is every router of a fleet this process runs as one
// CPUSource named "router".
func RoutersCPU(rps []*RouterProcess) CPUSource {
	return CPUSource{Name: "router", PIDs: func() []int {
		var pids []int
		for _, rp := range rps {
			pids = append(pids, rp.CPU().PIDs()...)
		}
		return pids
	}}
}

// SandboxRoleCPU splits the sandbox's servers by the role they were
// started in: "primary" and "replica" (the capacity model needs both; a
// sandbox without replicas has no "replica" source).
func SandboxRoleCPU(bed *testbed.Bed) []CPUSource {
	var out []CPUSource
	for _, role := range []string{testbed.RolePrimary, testbed.RoleReplica} {
		var insts []*testbed.Instance
		for _, inst := range bed.Instances() {
			if inst.Role == role {
				insts = append(insts, inst)
			}
		}
		if len(insts) == 0 {
			continue
		}
		out = append(out, CPUSource{Name: role, PIDs: func() []int {
			var pids []int
			for _, inst := range insts {
				pids = append(pids, testbed.ServerPIDs(inst)...)
			}
			return pids
		}})
	}
	return out
}
