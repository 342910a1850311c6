package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/shardmq/shardmq/shard"
)

// What cmd/sandbox does lives here, so tests can drive it.

const (
	// SandboxDatabase is the database `sandbox up` creates on every primary
	// and names in the topology's DSNs.
	SandboxDatabase = "shardmq"
	// SandboxArchiveDatabase is the sandbox's archive cluster (retention's
	// warm tier): a database of its own on the last cluster's primary, as
	// the sandbox has no spare server for it.
	SandboxArchiveDatabase = "shardmq_archive"
	// DescriptionFile and TopologyFile are the files `sandbox up` writes in
	// its directory.
	DescriptionFile = "testbed.json"
	TopologyFile    = "topology.yaml"

	execGrace = 30 * time.Second // a signalled command's time to exit before SIGKILL
)

// ErrSandboxRunning is returned by SandboxUp when its directory already
// holds a running bed.
var ErrSandboxRunning = errors.New("testbed: a sandbox is already running")

// SandboxUp starts a detached bed under dir (spec.Dir and spec.Detach are
// set from it), creates the database "shardmq" on every primary, writes
// dir/testbed.json and dir/topology.yaml and prints where everything is to
// out. If dir holds a running bed it returns ErrSandboxRunning; a stale one
// (its servers gone) is cleared first.
func SandboxUp(ctx context.Context, dir string, spec Spec, out io.Writer) (*Bed, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("testbed: sandbox dir: %w", err)
	}
	desc := filepath.Join(dir, DescriptionFile)
	if old, err := Attach(desc); err == nil {
		if old.running() {
			return nil, fmt.Errorf("%w in %s (see %s); run `sandbox down -dir %s` first", ErrSandboxRunning, dir, desc, dir)
		}
		if err := removeSandboxFiles(old, dir); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	spec.Dir, spec.Detach = dir, true
	spec = sandboxSized(spec)
	begin := time.Now()
	b, err := Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Bed, error) {
		err = errors.Join(err, b.Stop(), removeSandboxFiles(b, dir))
		return nil, err
	}
	if err := CreateDatabase(ctx, b, SandboxDatabase); err != nil {
		return fail(err)
	}
	if err := CreateDatabase(ctx, b, SandboxArchiveDatabase); err != nil {
		return fail(err)
	}
	if err := WaitReplicated(ctx, b); err != nil {
		return fail(err)
	}
	if err := b.Save(desc); err != nil {
		return fail(err)
	}
	topo := filepath.Join(dir, TopologyFile)
	if err := os.WriteFile(topo, SandboxTopologyYAML(b), 0o644); err != nil {
		return fail(fmt.Errorf("testbed: write topology: %w", err))
	}

	fmt.Fprintf(out, "sandbox: %d cluster(s) up in %s (%s)\n\n", len(b.Clusters), dir, time.Since(begin).Round(time.Millisecond))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tADDRESS\tPID\tSOCKET\tDATA DIR")
	for _, inst := range b.Instances() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", inst.Name, inst.Addr(), inst.PID, inst.Socket, inst.DataDir)
	}
	tw.Flush()
	p := b.Clusters[0].Primary
	fmt.Fprintf(out, "\ntopology:    %s\ndescription: %s\nconnect:     mariadb --no-defaults -h127.0.0.1 -P%d -uroot %s\nstop:        sandbox down -dir %s\n",
		topo, desc, p.Port, SandboxDatabase, dir)
	return b, nil
}

// SandboxDown stops the detached bed described by dir/testbed.json
// (SIGTERM, SIGKILL after 30 s) and removes its instance directories and
// the files SandboxUp wrote. With no bed in dir it does nothing.
func SandboxDown(ctx context.Context, dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("testbed: sandbox dir: %w", err)
	}
	b, err := Attach(filepath.Join(dir, DescriptionFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := b.shutdownForeign(ctx); err != nil {
		return err
	}
	if err := removeSandboxFiles(b, dir); err != nil {
		return err
	}
	os.Remove(dir) // only if empty
	return nil
}

func removeSandboxFiles(b *Bed, dir string) error {
	var errs []error
	for _, inst := range b.Instances() {
		errs = append(errs, os.RemoveAll(filepath.Dir(inst.DataDir)))
		if filepath.Dir(inst.Socket) != filepath.Dir(inst.DataDir) {
			os.Remove(inst.Socket)
		}
	}
	// The router records resharding jobs beside the topology file.
	for _, f := range []string{DescriptionFile, TopologyFile, TopologyFile + ".reshard.json"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testbed: remove sandbox files: %w", err)
	}
	return nil
}

// SandboxExec starts a bed with spec in a temporary directory, saves its
// description there and runs name with args, standard streams passed
// through and SHARDMQ_TESTBED naming the description, so every test package
// the command runs attaches to the one bed (see Main). It then stops the
// bed and returns the command's exit code (128+n if signal n killed it).
// SIGINT and SIGTERM are passed on to the command; the bed is stopped once
// the command exits, or after 30 s and a SIGKILL to it.
func SandboxExec(ctx context.Context, spec Spec, name string, args ...string) (int, error) {
	spec.Dir, spec.Detach = "", false
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	startCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			cancel() // a signal during start-up abandons it
		case <-startCtx.Done():
		}
	}()
	b, err := Start(startCtx, spec)
	if err != nil {
		return 1, err
	}
	defer b.Stop()
	desc := filepath.Join(b.Dir, DescriptionFile)
	if err := b.Save(desc); err != nil {
		return 1, err
	}
	if startCtx.Err() != nil {
		return 1, startCtx.Err()
	}
	cancel()

	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), EnvVar+"="+desc)
	if err := cmd.Start(); err != nil {
		return 1, errors.Join(fmt.Errorf("testbed: exec: %w", err), b.Stop())
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var (
		kill    <-chan time.Time
		waitErr error
	)
loop:
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
			if kill == nil {
				kill = time.After(execGrace)
			}
		case <-kill:
			_ = cmd.Process.Kill()
		case waitErr = <-waited:
			break loop
		}
	}
	code := exitCode(cmd, waitErr)
	if err := b.Stop(); err != nil {
		return code, err
	}
	return code, nil
}

func exitCode(cmd *exec.Cmd, waitErr error) int {
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	if waitErr != nil {
		return 1
	}
	return 0
}

// VShardRange is a contiguous range of vshards, From and To included, placed
// on one cluster.
type VShardRange struct {
	From, To int
	Cluster  string
}

// SplitVShards splits the vshards 0…shard.Count-1 into equal contiguous
// ranges, one per cluster in order; when they do not divide evenly the later
// ranges are one vshard longer.
func SplitVShards(clusters []string) []VShardRange {
	n := len(clusters)
	ranges := make([]VShardRange, 0, n)
	for i, c := range clusters {
		ranges = append(ranges, VShardRange{From: i * shard.Count / n, To: (i+1)*shard.Count/n - 1, Cluster: c})
	}
	return ranges
}

// WriteTopology writes the static topology file the router reads: every
// cluster's primary and replica DSNs for database, and a shard map (version
// 1) that splits the vshards evenly over the clusters (SplitVShards).
func WriteTopology(path string, b *Bed, database string) error {
	if err := os.WriteFile(path, TopologyYAML(b, database), 0o644); err != nil {
		return fmt.Errorf("testbed: write topology: %w", err)
	}
	return nil
}

// TopologyYAML returns what WriteTopology writes.
func TopologyYAML(b *Bed, database string) []byte {
	var w bytes.Buffer
	w.WriteString("# generated by sandbox up\nclusters:\n")
	names := make([]string, 0, len(b.Clusters))
	for _, c := range b.Clusters {
		names = append(names, c.Name)
		fmt.Fprintf(&w, "  - name: %s\n    primary: %s\n    replicas: [", c.Name, strconv.Quote(c.Primary.DSN(database)))
		for i, r := range c.Replicas {
			if i > 0 {
				w.WriteString(", ")
			}
			w.WriteString(strconv.Quote(r.DSN(database)))
		}
		w.WriteString("]\n")
	}
	w.WriteString("shard_map:\n  version: 1\n  ranges:\n")
	for _, r := range SplitVShards(names) {
		fmt.Fprintf(&w, "    - {from: %d, to: %d, cluster: %s}\n", r.From, r.To, r.Cluster)
	}
	return w.Bytes()
}

// SandboxServerArgsEnv names extra mariadbd flags for a sandbox's servers,
// separated by spaces, e.g. "--performance-schema=ON" to read where the
// servers' time goes per statement (docs/performance.md, "Where the
// servers' time goes"). A running sandbox keeps the flags it started with.
const SandboxServerArgsEnv = "SHARDMQ_SANDBOX_SERVER_ARGS"

// sandboxSized gives a sandbox's spec the deployment's server settings
// unless it names its own, and the flags SandboxServerArgsEnv adds.
func sandboxSized(spec Spec) Spec {
	if spec.Server == (ServerSettings{}) {
		spec.Server = DeploymentSettings()
	}
	spec.ServerArgs = append(spec.ServerArgs, strings.Fields(os.Getenv(SandboxServerArgsEnv))...)
	return spec
}

// SandboxTopologyYAML is the sandbox's topology: TopologyYAML of
// SandboxDatabase and an archive cluster, SandboxArchiveDatabase on the
// last cluster's primary.
func SandboxTopologyYAML(b *Bed) []byte {
	out := TopologyYAML(b, SandboxDatabase)
	if len(b.Clusters) == 0 {
		return out
	}
	p := b.Clusters[len(b.Clusters)-1].Primary
	return append(out, fmt.Sprintf("archive:\n  primary: %s\n", strconv.Quote(p.DSN(SandboxArchiveDatabase)))...)
}
