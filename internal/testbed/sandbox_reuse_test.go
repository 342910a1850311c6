package testbed_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/topology"
)

// SandboxEnsure starts a sandbox where there is none, reuses a running one
// as it is, and starts again only the servers that are down — their data
// kept, replication resumed — where SandboxUp refuses or clears.
func TestSandboxEnsureReusesAndRestartsOnlyWhatIsDown(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testContext(t)
	dir := filepath.Join(t.TempDir(), "sandbox")
	t.Cleanup(func() { testbed.SandboxDown(context.Background(), dir) })
	spec := testbed.Spec{Clusters: 1, Replicas: 1}

	var out bytes.Buffer
	b, started, restarted, err := testbed.SandboxEnsure(ctx, dir, spec, &out)
	if err != nil || !started || len(restarted) != 0 {
		t.Fatalf("first ensure: started %v, restarted %v, err %v", started, restarted, err)
	}
	c := b.Clusters[0]
	p, r := c.Primary, c.Replicas[0]
	db := createTable(t, b, c, "tb_reuse")
	insert(t, db, 1)

	out.Reset()
	again, started, restarted, err := testbed.SandboxEnsure(ctx, dir, spec, &out)
	if err != nil || started || len(restarted) != 0 {
		t.Fatalf("ensure on a running sandbox: started %v, restarted %v, err %v", started, restarted, err)
	}
	if got := again.Clusters[0].Primary.PID; got != p.PID || !strings.Contains(out.String(), "reusing") {
		t.Fatalf("ensure on a running sandbox: primary pid %d (was %d), printed:\n%s", got, p.PID, out.String())
	}

	// The primary dies; ensure starts it alone, on its port and data.
	oldPID, replicaPID := p.PID, r.PID
	if err := b.Kill(p); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	again, started, restarted, err = testbed.SandboxEnsure(ctx, dir, spec, &out)
	if err != nil || started || !slices.Equal(restarted, []string{p.Name}) {
		t.Fatalf("ensure after the primary died: started %v, restarted %v, err %v\n%s", started, restarted, err, out.String())
	}
	np := again.Clusters[0].Primary
	if np.PID == oldPID || np.Port != p.Port || again.Clusters[0].Replicas[0].PID != replicaPID {
		t.Fatalf("primary pid %d (was %d) port %d (was %d); replica pid %d (was %d)", np.PID, oldPID, np.Port, p.Port,
			again.Clusters[0].Replicas[0].PID, replicaPID)
	}
	if !hasRow(t, np, "tb_reuse", 1) {
		t.Fatal("row 1 lost: the restarted primary did not keep its data")
	}
	insert(t, open(t, np, "tb_reuse"), 2)
	if err := testbed.WaitReplicated(ctx, again); err != nil {
		t.Fatal(err)
	}
	if !hasRow(t, r, "tb_reuse", 2) {
		t.Fatal("the replica does not replicate from the restarted primary")
	}
	// A resharding rewrote the map (a newer version); the next reuse
	// keeps it rather than writing version 1 over it.
	topo := filepath.Join(dir, testbed.TopologyFile)
	was, err := topology.LoadFile(topo)
	if err != nil {
		t.Fatal(err)
	}
	resharded, err := was.Map.With(7, []shard.ID{0, 1023}, was.Map.Clusters()[0], routing.Serving)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(topo)
	if err != nil {
		t.Fatal(err)
	}
	if data, err = topology.ReplaceShardMap(data, resharded); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(topo, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, _, _, err := testbed.SandboxEnsure(ctx, dir, spec, &out); err != nil {
		t.Fatal(err)
	}
	if now, err := topology.LoadFile(topo); err != nil || now.Map.Version() != 7 || !strings.Contains(out.String(), "kept shard map version 7") {
		t.Fatalf("after a reuse the topology's map is %v (err %v), want version 7 kept; printed:\n%s", now.Map.Version(), err, out.String())
	}

	// The saved description names the new process, so `sandbox down` stops it.
	saved, err := testbed.Attach(filepath.Join(dir, testbed.DescriptionFile))
	if err != nil {
		t.Fatal(err)
	}
	if saved.Clusters[0].Primary.PID != np.PID {
		t.Fatalf("testbed.json names pid %d, want %d", saved.Clusters[0].Primary.PID, np.PID)
	}
	if err := testbed.SandboxDown(ctx, dir); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "restarted primary stops", func() bool { return !alive(np.PID) })
}
