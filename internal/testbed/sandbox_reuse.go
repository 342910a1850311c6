package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/shardmq/shardmq/topology"
)

// SandboxEnsure makes sure a sandbox runs in dir without ever removing
// data: with no bed described there, it starts one as SandboxUp does; with
// one, it starts again — on their own ports and data directories — only the
// servers that do not run (killed, crashed, or all of them after a
// reboot), waits until restarted replicas replicate, rewrites
// testbed.json (new PIDs) and topology.yaml, and prints where everything
// is. spec's cluster and replica counts apply only to a new bed. started
// reports whether a new bed was started; restarted names the servers
// started again.
func SandboxEnsure(ctx context.Context, dir string, spec Spec, out io.Writer) (b *Bed, started bool, restarted []string, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, false, nil, fmt.Errorf("testbed: sandbox dir: %w", err)
	}
	desc := filepath.Join(dir, DescriptionFile)
	b, err = Attach(desc)
	if errors.Is(err, os.ErrNotExist) {
		b, err = SandboxUp(ctx, dir, spec, out)
		return b, err == nil, nil, err
	}
	if err != nil {
		return nil, false, nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultRestartTimeout)
		defer cancel()
	}
	spec, err = sandboxSized(spec).withDefaults()
	if err != nil {
		return nil, false, nil, err
	}
	var missing []*Instance
	for _, inst := range b.Instances() {
		if len(ServerPIDs(inst)) > 0 || ping(ctx, inst) == nil {
			continue
		}
		if _, err := os.Stat(inst.DataDir); err != nil {
			return nil, false, nil, fmt.Errorf("testbed: %s is not running and its data directory is gone (%w); `sandbox down -dir %s` clears the sandbox", inst.Name, err, dir)
		}
		missing = append(missing, inst)
	}
	if len(missing) > 0 {
		bins, err := findBinaries()
		if err != nil {
			return nil, false, nil, err
		}
		b.bins, b.spec.Server, b.spec.Detach, b.log = bins, spec.Server, true, spec.Logger
		// Primaries first, so that restarted replicas find them.
		for _, primaries := range []bool{true, false} {
			err := parallel(missing, func(inst *Instance) error {
				if (inst.Role == RolePrimary) != primaries {
					return nil
				}
				if err := b.launch(ctx, inst, false); err != nil {
					return err
				}
				if err := b.waitReplicationRunning(ctx, inst, false); err != nil {
					return fmt.Errorf("testbed: %s: %w", inst.Name, err)
				}
				return nil
			})
			if err != nil {
				return nil, false, nil, err
			}
		}
		for _, inst := range missing {
			restarted = append(restarted, inst.Name)
		}
		if err := b.Save(desc); err != nil {
			return nil, false, nil, err
		}
	}
	if err := CreateDatabase(ctx, b, SandboxArchiveDatabase); err != nil { // a sandbox made before the archive
		return nil, false, nil, err
	}
	topo := filepath.Join(dir, TopologyFile)
	data, kept, err := keepNewerShardMap(topo, SandboxTopologyYAML(b))
	if err != nil {
		return nil, false, nil, err
	}
	if err := os.WriteFile(topo, data, 0o644); err != nil {
		return nil, false, nil, fmt.Errorf("testbed: write topology: %w", err)
	}
	if kept > 0 {
		fmt.Fprintf(out, "sandbox: kept shard map version %d of %s (written by a resharding; the clusters hold their vshards there)\n", kept, topo)
	}
	replicas := 0
	if len(b.Clusters) > 0 {
		replicas = len(b.Clusters[0].Replicas)
	}
	fmt.Fprintf(out, "sandbox: reusing %d cluster(s) × %d replica(s) in %s (its data kept)", len(b.Clusters), replicas, dir)
	if len(restarted) > 0 {
		fmt.Fprintf(out, "; started again: %s", strings.Join(restarted, ", "))
	}
	fmt.Fprintln(out)
	if len(b.Clusters) != spec.Clusters || replicas != spec.Replicas {
		fmt.Fprintf(out, "note: asked for %d cluster(s) × %d replica(s); `sandbox down -dir %s` (deletes its data) then up for another shape\n",
			spec.Clusters, spec.Replicas, dir)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tADDRESS\tPID\tSOCKET\tDATA DIR")
	for _, inst := range b.Instances() {
		pid := inst.PID
		if pids := ServerPIDs(inst); len(pids) > 0 {
			pid = pids[len(pids)-1]
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", inst.Name, inst.Addr(), pid, inst.Socket, inst.DataDir)
	}
	tw.Flush()
	fmt.Fprintf(out, "\ntopology:    %s\ndescription: %s\n", topo, desc)
	return b, false, restarted, nil
}

// keepNewerShardMap returns next, the regenerated topology file, with the
// shard map of the file at path when that one is newer (a resharding
// rewrote it): a rewrite must never put an older map over a newer one —
// the router would refuse to start on it (the clusters' fences and owner
// records are newer), and before that check, it routed vshards to
// clusters that no longer held them. kept is the version kept, 0 when
// next's own map is used. An existing file that cannot be read as a
// topology is an error: the operator decides.
func keepNewerShardMap(path string, next []byte) (out []byte, kept int64, err error) {
	old, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return next, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("testbed: read topology: %w", err)
	}
	was, err := topology.Parse(path, old)
	if err != nil {
		return nil, 0, fmt.Errorf("testbed: the existing %s cannot be read (%w); move it away to regenerate it", path, err)
	}
	now, err := topology.Parse(path, next)
	if err != nil {
		return nil, 0, fmt.Errorf("testbed: generated topology: %w", err)
	}
	if was.Map.Version() <= now.Map.Version() {
		return next, 0, nil
	}
	out, err = topology.ReplaceShardMap(next, was.Map)
	if err != nil {
		return nil, 0, fmt.Errorf("testbed: keep the shard map of %s: %w", path, err)
	}
	return out, was.Map.Version(), nil
}
