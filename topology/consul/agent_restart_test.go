package consul_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/topologytest"
)

// devAgent is a `consul agent -dev` this test starts (CONSUL_BIN) on free
// loopback ports, so that it can restart it: a -dev agent keeps nothing,
// so a restart loses the data and starts the indexes again from 1.
type devAgent struct {
	bin, dir string
	ports    []int // http, serf lan, serf wan, server
	cmd      *exec.Cmd
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out
}

func (a *devAgent) addr() string { return "127.0.0.1:" + strconv.Itoa(a.ports[0]) }

func (a *devAgent) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(a.dir, "agent.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(a.bin, "agent", "-dev", "-client", "127.0.0.1", "-bind", "127.0.0.1",
		"-http-port", strconv.Itoa(a.ports[0]), "-serf-lan-port", strconv.Itoa(a.ports[1]),
		"-serf-wan-port", strconv.Itoa(a.ports[2]), "-server-port", strconv.Itoa(a.ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c, _ := api.NewClient(&api.Config{Address: a.addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	testtime.Until(t, "agent has a leader", func() bool {
		leader, err := c.Status().Leader()
		return err == nil && leader != ""
	})
}

func (a *devAgent) stop() {
	if a.cmd != nil && a.cmd.Process != nil {
		a.cmd.Process.Kill()
		a.cmd.Wait()
		a.cmd = nil
	}
}

// TestAgentRestartOnAgent restarts a real agent under two routers: they
// keep routing to both clusters, register again, write their map back,
// and follow the next map change although the agent's indexes started
// again from 1; a router started afterwards takes the same map.
func TestAgentRestartOnAgent(t *testing.T) {
	bin := os.Getenv("CONSUL_BIN")
	if bin == "" {
		t.Skip("CONSUL_BIN is not set: no consul binary to start and restart an agent")
	}
	t.Parallel()
	a := &devAgent{bin: bin, dir: t.TempDir(), ports: freePorts(t, 4)}
	a.start(t)
	t.Cleanup(a.stop)
	c, err := api.NewClient(&api.Config{Address: a.addr(), HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{addr: a.addr(), api: c, ttl: 10 * time.Second, prefix: "shardmq/", service: "mysql", node: "db-node", primaries: map[string]string{}}
	e.seed(t, topologytest.NewSeed())
	ctx := testtime.Context(t)
	r1, err := startRouter(t, e, "router-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := startRouter(t, e, "router-2", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := e.source(t, e.config(t))
	// Raise the agent's index well above where a fresh agent starts.
	for i := 0; i < 50; i++ {
		c.KV().Put(&api.KVPair{Key: fmt.Sprint("noise/", i), Value: []byte("x")}, nil)
	}
	m, err := topology.WriteShardMap(ctx, admin, func(*routing.Map) ([]routing.Range, error) {
		return []routing.Range{{From: 0, To: 99, Cluster: "c1"}, {From: 100, To: 1023, Cluster: "c2"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*testRouter{r1, r2} {
		testtime.Until(t, r.id+" on map 2", func() bool { cur, _ := r.current(); return cur.Version() == m.Version() })
	}

	start := time.Now()
	a.stop()
	a.start(t)
	t.Logf("agent restarted in %s", time.Since(start))

	testtime.Until(t, "routers registered again and the map written back", func() bool {
		applied, err := admin.Applied(ctx)
		top, who := topology.HighestApplied(applied)
		stored, serr := admin.ShardMap(ctx)
		return err == nil && top == m.Version() && len(who) == 2 && serr == nil && stored.Digest() == m.Digest() && stored.Version() == m.Version()
	})
	t.Logf("routers back and map %d written back %s after the restart began", m.Version(), time.Since(start))
	for _, r := range []*testRouter{r1, r2} {
		cur, clusters := r.current()
		if cur.Version() != m.Version() || len(clusters) != 2 {
			t.Fatalf("%s after the restart: map %d, clusters %v; want map %d and both clusters", r.id, cur.Version(), clusters, m.Version())
		}
	}
	e.mu.Lock()
	e.primaries = map[string]string{}
	e.mu.Unlock()
	e.SetPrimary(t, "c1", topologytest.C1Primary)
	e.SetPrimary(t, "c2", topologytest.C2Primary)
	next, err := topology.WriteShardMap(ctx, admin, func(*routing.Map) ([]routing.Range, error) { return topologytest.SeedRanges, nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*testRouter{r1, r2} {
		testtime.Until(t, r.id+" follows the next change", func() bool { cur, _ := r.current(); return cur.Version() == next.Version() })
	}
	r3, err := startRouter(t, e, "router-3", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur, _ := r3.current(); cur.Version() != next.Version() {
		t.Fatalf("router-3 started on %d, want %d", cur.Version(), next.Version())
	}
}
