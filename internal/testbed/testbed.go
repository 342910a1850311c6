// Package testbed runs real MariaDB servers for shardmq's tests and for
// local runs: N clusters, each a primary with GTID replicas, on free loopback
// ports, every server with its own data directory.
//
// A test package gets one bed per `go test` process from Main; `make test`
// starts one bed for all packages (cmd/sandbox exec) and every package
// attaches to it, so tests that share a bed use their own database or table
// names. Tests that break things (Kill, Restart, StopReplication, Promote)
// start a bed of their own, because the shared one serves other packages at
// the same time.
//
// What the servers are like:
//   - MariaDB only (≥ 10.11): replication is set up with CHANGE MASTER …
//     MASTER_USE_GTID=slave_pos and waited on with MASTER_GTID_WAIT; the
//     binary log is ROW, gtid_strict_mode is on, commits are durable
//     (innodb_flush_log_at_trx_commit=1, sync_binlog=1).
//   - --no-defaults, so /etc/mysql plays no part; character_set_server is
//     utf8mb4 (utf8mb4_general_ci), as Debian's configuration would set it.
//   - root logs in over TCP from 127.0.0.1 with no password (Instance.DSN).
//     On replicas that account lacks READ_ONLY ADMIN, so a write through a
//     replica's DSN fails with error 1290 as it would in production instead
//     of silently diverging the replica. The test bed itself works as
//     root@localhost through each server's unix socket.
//   - Data directories are copies of one made by mariadb-install-db (without
//     the sys schema, whose views need the disabled performance_schema),
//     cached in os.UserCacheDir()/shardmq-testbed; deleting that directory
//     is always safe.
//
// Servers run as children of the starting process and, on Linux, are
// SIGKILLed by the kernel if it dies; a later Start removes the temporary
// directories such deaths leave behind. Spec.Detach lets them outlive it.
package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// Roles of an instance.
const (
	RolePrimary = "primary"
	RoleReplica = "replica"
)

// EnvVar names the environment variable through which Main finds a bed
// started by another process: the path of a file written by Bed.Save.
const EnvVar = "SHARDMQ_TESTBED"

var (
	// ErrNotOwner is returned by Kill and Restart on a bed from Attach: its
	// processes belong to the process that started them.
	ErrNotOwner = errors.New("testbed: the bed's processes belong to another process (attached bed)")
	// ErrStopped is returned by operations on a bed after Stop.
	ErrStopped = errors.New("testbed: bed is stopped")
)

const (
	defaultClusters = 2
	defaultReplicas = 1
	maxReplicas     = 98 // server_id is cluster*100 + member, members 1…99

	defaultStartTimeout   = 2 * time.Minute  // a whole Start without a ctx deadline
	defaultRestartTimeout = time.Minute      // a Restart without a ctx deadline
	defaultWaitTimeout    = 30 * time.Second // replication waits without a ctx deadline
	shutdownGrace         = 30 * time.Second // SIGTERM → SIGKILL
	killWait              = 10 * time.Second // SIGKILL → gone
	pollInterval          = 20 * time.Millisecond
	maxPortAttempts       = 5

	tempPrefix = "shardmq-testbed-"
	ownerFile  = "owner.pid"
	maxSocket  = 100 // sun_path holds 108 bytes
)

// Spec describes the sandbox to start. Zero values mean defaults.
type Spec struct {
	// Clusters is the number of clusters, named c1, c2, …. Defaults to 2.
	Clusters int
	// Replicas is the number of replicas per cluster. Defaults to 1; at most
	// 98. Zero means the default, so a bed of primaries only asks for
	// NoReplicas instead.
	Replicas int
	// NoReplicas starts primaries only. Setting it together with Replicas > 0
	// is an error.
	NoReplicas bool
	// Dir is the base directory for the instances' directories. Defaults to a
	// fresh directory under os.TempDir that Stop removes; a Dir given here is
	// left in place by Stop.
	Dir string
	// Server sizes each server (buffer pool, redo log, connections).
	// Defaults to TestSettings; the sandbox's commands use
	// DeploymentSettings.
	Server ServerSettings
	// BufferPoolSize, when set, overrides Server.BufferPool.
	BufferPoolSize string
	// Detach makes the servers outlive the process that starts them (for
	// `make run`): they get their own session and no parent-death signal.
	// Otherwise they are SIGKILLed when the starting process dies, however
	// it dies.
	Detach bool
	// Logger receives progress messages. Defaults to discarding them.
	Logger *slog.Logger
	// ServerArgs are extra mariadbd flags for every instance (e.g. the
	// --ssl-* flags of a TLS test).
	ServerArgs []string
	// Place, when set, puts each instance on a host of its own: mariadbd
	// runs in the network namespace netns (`ip netns exec`) and listens on
	// addr, which its DSN names; the accounts then accept root and the
	// replicas from any address (internal/netbed's partition tests).
	Place func(inst *Instance) (netns, addr string)

	// firstCluster numbers the first cluster (1 when zero); an added
	// cluster continues a running bed's numbering.
	firstCluster int
	// replPassword, when set, is the replication password (an added
	// cluster shares its bed's).
	replPassword string
}

func (s Spec) withDefaults() (Spec, error) {
	switch {
	case s.Clusters < 0:
		return s, fmt.Errorf("testbed: Spec.Clusters is %d, want ≥ 0", s.Clusters)
	case s.Replicas < 0:
		return s, fmt.Errorf("testbed: Spec.Replicas is %d, want ≥ 0 (use Spec.NoReplicas for none)", s.Replicas)
	case s.Replicas > maxReplicas:
		return s, fmt.Errorf("testbed: Spec.Replicas is %d, want ≤ %d", s.Replicas, maxReplicas)
	case s.NoReplicas && s.Replicas > 0:
		return s, fmt.Errorf("testbed: Spec.NoReplicas is set but Spec.Replicas is %d", s.Replicas)
	}
	if s.Clusters == 0 {
		s.Clusters = defaultClusters
	}
	if s.Replicas == 0 && !s.NoReplicas {
		s.Replicas = defaultReplicas
	}
	if s.Server == (ServerSettings{}) {
		s.Server = TestSettings()
	}
	if s.BufferPoolSize != "" {
		s.Server.BufferPool = s.BufferPoolSize
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Instance is one mariadbd process.
type Instance struct {
	Name     string `json:"name"`    // "c1-primary", "c1-replica1", …
	Cluster  string `json:"cluster"` // "c1", …
	Role     string `json:"role"`    // RolePrimary or RoleReplica, as started; Promote does not change it
	Host     string `json:"host"`    // always "127.0.0.1"
	Port     int    `json:"port"`
	Socket   string `json:"socket"`
	DataDir  string `json:"data_dir"`
	ErrorLog string `json:"error_log"`
	PIDFile  string `json:"pid_file"`
	ServerID int    `json:"server_id"`
	// PID is the server's process ID. Restart changes it; do not read it
	// while a Restart runs.
	PID int `json:"pid"`

	netns    string   // network namespace to run in (Spec.Place); "" for the caller's
	readOnly bool     // start with --read-only; cleared by Promote
	proc     *process // nil until started by this process; guarded by Bed.mu
}

// DSN returns the go-sql-driver/mysql data source name of database on this
// instance, as root over TCP: "root@tcp(127.0.0.1:PORT)/database".
func (i *Instance) DSN(database string) string {
	return "root@tcp(" + i.Addr() + ")/" + database
}

// Addr returns the instance's "host:port".
func (i *Instance) Addr() string {
	return net.JoinHostPort(i.Host, strconv.Itoa(i.Port))
}

// dir is the instance's own directory: its data directory's parent.
func (i *Instance) dir() string { return filepath.Dir(i.DataDir) }

// Cluster is a primary and its replicas.
type Cluster struct {
	Name     string      `json:"name"`
	Primary  *Instance   `json:"primary"`
	Replicas []*Instance `json:"replicas"`
}

// Bed is a set of running clusters. Its topology (Clusters) is fixed when it
// starts: Promote and Restart do not rearrange it.
type Bed struct {
	// Dir holds one directory per instance (data/, error.log, mysqld.pid,
	// mysqld.sock, mariadbd.out).
	Dir      string
	Clusters []*Cluster

	spec         Spec
	bins         binaries // zero for an attached bed
	log          *slog.Logger
	ownsDir      bool // Start created Dir; Stop removes it
	ownerPID     int  // the process that started the servers
	attached     bool // from Attach: processes belong to another process
	replPassword string

	mu       sync.Mutex
	stopped  bool
	stopOnce sync.Once
	stopErr  error
}

// Start starts the servers of spec in parallel, sets up replication and
// returns when every server answers over TCP and every replica has applied
// its primary's binary log. Without a deadline on ctx, Start gives up after
// two minutes. On error nothing is left running.
func Start(ctx context.Context, spec Spec) (*Bed, error) {
	if os.Getenv(EnvFast) != "" {
		// make test-fast promises no MariaDB: a test that gets here
		// lacks its Need.
		return nil, fmt.Errorf("testbed: no MariaDB under %s: the test must call testbed.Need first", EnvFast)
	}
	spec, err := spec.withDefaults()
	if err != nil {
		return nil, err
	}
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	b := &Bed{spec: spec, bins: bins, log: spec.Logger, ownerPID: os.Getpid(), replPassword: spec.replPassword}
	if b.replPassword == "" {
		b.replPassword = randomHex(12)
	}
	if spec.Dir == "" {
		reapStaleDirs(b.log)
		dir, err := os.MkdirTemp("", tempPrefix+"*")
		if err != nil {
			return nil, fmt.Errorf("testbed: %w", err)
		}
		b.Dir, b.ownsDir = dir, true
		if !spec.Detach {
			// Marks the directory as reapable once this process is gone.
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(ownerLine(os.Getpid())), 0o644); err != nil {
				os.RemoveAll(dir)
				return nil, fmt.Errorf("testbed: %w", err)
			}
		}
	} else {
		dir, err := filepath.Abs(spec.Dir)
		if err != nil {
			return nil, fmt.Errorf("testbed: Spec.Dir: %w", err)
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("testbed: Spec.Dir: %w", err)
		}
		b.Dir = dir
	}
	b.layout()
	for _, inst := range b.Instances() {
		if _, err := os.Stat(inst.dir()); err == nil {
			return nil, fmt.Errorf("testbed: %s already exists; remove it or choose another Spec.Dir", inst.dir())
		}
	}

	begin := time.Now()
	if err := b.start(ctx); err != nil {
		// The error carries the logs' tails; leave nothing behind.
		err = errors.Join(err, b.stop())
		if !b.ownsDir {
			for _, inst := range b.Instances() {
				os.RemoveAll(inst.dir())
			}
		}
		return nil, err
	}
	b.log.Info("testbed started", "dir", b.Dir, "clusters", len(b.Clusters),
		"instances", len(b.Instances()), "elapsed", time.Since(begin).Round(time.Millisecond))
	return b, nil
}

// layout names the instances and places their files under b.Dir.
func (b *Bed) layout() {
	first := max(b.spec.firstCluster, 1)
	for ci := first; ci < first+b.spec.Clusters; ci++ {
		c := &Cluster{Name: "c" + strconv.Itoa(ci)}
		c.Primary = b.newInstance(c.Name, RolePrimary, c.Name+"-primary", ci*100+1)
		for r := 1; r <= b.spec.Replicas; r++ {
			name := fmt.Sprintf("%s-replica%d", c.Name, r)
			c.Replicas = append(c.Replicas, b.newInstance(c.Name, RoleReplica, name, ci*100+1+r))
		}
		b.Clusters = append(b.Clusters, c)
	}
}

func (b *Bed) newInstance(cluster, role, name string, serverID int) *Instance {
	dir := filepath.Join(b.Dir, name)
	inst := &Instance{
		Name:     name,
		Cluster:  cluster,
		Role:     role,
		Host:     "127.0.0.1",
		Socket:   socketPath(dir),
		DataDir:  filepath.Join(dir, "data"),
		ErrorLog: filepath.Join(dir, "error.log"),
		PIDFile:  filepath.Join(dir, "mysqld.pid"),
		ServerID: serverID,
		readOnly: role == RoleReplica,
	}
	if b.spec.Place != nil {
		inst.netns, inst.Host = b.spec.Place(inst)
	}
	return inst
}

// clientHost is the host part of the accounts the servers' clients use:
// 127.0.0.1, or any address when the instances are placed on hosts of
// their own.
func (b *Bed) clientHost() string {
	if b.spec.Place != nil {
		return "%"
	}
	return "127.0.0.1"
}

// socketPath puts the socket in the instance's directory unless the path
// would not fit in a sockaddr_un; then it goes to os.TempDir under a name
// derived from the directory, so a restart finds the same path.
func socketPath(dir string) string {
	p := filepath.Join(dir, "mysqld.sock")
	if len(p) <= maxSocket {
		return p
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("shardmq-%08x.sock", fnv32(dir)))
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (b *Bed) start(ctx context.Context) error {
	t0 := time.Now()
	tmpl, release, err := template(ctx, b.bins, filepath.Join(b.Dir, ".template"), b.log)
	if err != nil {
		return err
	}
	defer release()
	b.log.Debug("template data directory ready", "dir", tmpl, "elapsed", time.Since(t0).Round(time.Millisecond))

	g, gctx := errgroup.WithContext(ctx)
	for _, inst := range b.Instances() {
		g.Go(func() error {
			t0 := time.Now()
			if err := os.MkdirAll(inst.dir(), 0o755); err != nil {
				return fmt.Errorf("testbed: %w", err)
			}
			if err := copyDataDir(tmpl, inst.DataDir); err != nil {
				return fmt.Errorf("testbed: copy data directory for %s: %w", inst.Name, err)
			}
			tCopied := time.Now()
			if err := b.launch(gctx, inst, true); err != nil {
				return err
			}
			tUp := time.Now()
			if err := b.prepare(gctx, inst); err != nil {
				return err
			}
			b.log.Debug("instance ready", "name", inst.Name, "port", inst.Port, "pid", inst.PID,
				"copy", tCopied.Sub(t0).Round(time.Millisecond), "start", tUp.Sub(tCopied).Round(time.Millisecond),
				"prepare", time.Since(tUp).Round(time.Millisecond))
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}

	g, gctx = errgroup.WithContext(ctx)
	for _, c := range b.Clusters {
		g.Go(func() error { return b.replicate(gctx, c) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return WaitReplicated(ctx, b)
}

// Instances returns every instance of the bed: each cluster's primary, then
// its replicas, in cluster order.
func (b *Bed) Instances() []*Instance {
	var all []*Instance
	for _, c := range b.Clusters {
		all = append(all, c.Primary)
		all = append(all, c.Replicas...)
	}
	return all
}

// Cluster returns the cluster called name, or nil.
func (b *Bed) Cluster(name string) *Cluster {
	for _, c := range b.Clusters {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Stop shuts every instance down cleanly (SIGTERM, then SIGKILL after 30 s)
// and removes Dir if Start created it. It is safe to call more than once and
// returns the first call's result.
//
// Stop on a bed from Attach stops nothing: the processes belong to the
// process that started them, which stops them.
func (b *Bed) Stop() error {
	b.stopOnce.Do(func() { b.stopErr = b.stop() })
	return b.stopErr
}

func (b *Bed) stop() error {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	if b.attached {
		return nil
	}
	err := parallel(b.Instances(), func(inst *Instance) error {
		b.mu.Lock()
		p := inst.proc
		b.mu.Unlock()
		if p == nil {
			return nil
		}
		return p.terminate(inst, b.log)
	})
	if b.ownsDir {
		if rerr := os.RemoveAll(b.Dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("testbed: %w", rerr))
		}
	}
	return err
}

// Kill sends SIGKILL to inst, as a crash would, and returns once the process
// is gone. Restart brings it back.
func (b *Bed) Kill(inst *Instance) error {
	p, err := b.ownProcess(inst)
	if err != nil {
		return err
	}
	if !p.running() {
		return fmt.Errorf("testbed: %s is not running", inst.Name)
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("testbed: %s (pid %d) still running %s after SIGKILL", inst.Name, inst.PID, killWait)
	}
}

// Restart starts inst again on the same port and data directory (shutting
// it down cleanly first if it still runs) and waits until it answers. A
// replica resumes replication by itself; Restart waits until its SQL thread
// runs and its IO thread runs or is connecting (its primary may be down).
// Without a deadline on ctx, Restart gives up after a minute.
func (b *Bed) Restart(ctx context.Context, inst *Instance) error {
	p, err := b.ownProcess(inst)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRestartTimeout)
		defer cancel()
	}
	if err := p.terminate(inst, b.log); err != nil {
		return err
	}
	if err := b.launch(ctx, inst, false); err != nil {
		return err
	}
	return b.waitReplicationRunning(ctx, inst, false)
}

// ownProcess returns inst's process if this process started it.
func (b *Bed) ownProcess(inst *Instance) (*process, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.attached:
		return nil, ErrNotOwner
	case b.stopped:
		return nil, ErrStopped
	case inst.proc == nil:
		return nil, fmt.Errorf("testbed: %s is not an instance of this bed", inst.Name)
	}
	return inst.proc, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// parallel runs fn for every item at once and joins the errors.
func parallel[T any](items []T, fn func(T) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, it := range items {
		wg.Go(func() {
			if err := fn(it); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
