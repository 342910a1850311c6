package partition

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/netbed"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// testBudget bounds each test: it stops by itself well before `go test`'s
// own timeout.
const testBudget = 4 * time.Minute

var (
	buildOnce sync.Once
	routerBin string
	buildErr  error
)

// routerBinary builds cmd/router (and cmd/consul-seed beside it) once per
// test process.
func routerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "shardmq-partition-")
		if err != nil {
			buildErr = err
			return
		}
		routerBin = filepath.Join(dir, "router")
		out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/shardmq/shardmq/cmd/router", "github.com/shardmq/shardmq/cmd/consul-seed").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("build cmd/router and cmd/consul-seed: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return routerBin
}

// world is one test's hosts: "client" (the test's load and checks),
// routers, and every MariaDB server of a two-cluster bed (c1p, c1r, c2p,
// c2r), each linked to the hosts it talks to.
type world struct {
	t      *testing.T
	ctx    context.Context
	net    *netbed.Bed
	hosts  map[string]*netbed.Host
	bed    *testbed.Bed
	dbName string
	topo   string
	// receiptKey is the file of the key every router of the world signs
	// receipts with: they forward claims and acks to each other.
	receiptKey string
	client     *http.Client
	checks     map[string]*sql.DB // each primary through its socket, for the checks
	consul     string             // the Consul double's address, once onConsul ran

	// failures are the test's failures, and explained what explains
	// them, said again once the routers' logs are printed: CI shows a
	// failing run's last lines only.
	mu        sync.Mutex
	failures  []string
	explained []string
}

// errorf fails the test, and says why again at its end.
func (w *world) errorf(format string, args ...any) {
	w.t.Helper()
	w.remember(fmt.Sprintf(format, args...))
	w.t.Errorf(format, args...)
}

// fatalf fails and ends the test, and says why again at its end.
func (w *world) fatalf(format string, args ...any) {
	w.t.Helper()
	w.remember(fmt.Sprintf(format, args...))
	w.t.Fatalf(format, args...)
}

// explain logs what explains a failure, and says it again at the end.
func (w *world) explain(format string, args ...any) {
	w.t.Helper()
	w.mu.Lock()
	w.explained = append(w.explained, fmt.Sprintf(format, args...))
	w.mu.Unlock()
	w.t.Logf(format, args...)
}

func (w *world) remember(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.failures = append(w.failures, s)
}

// hostOf names the host of a test bed instance.
func hostOf(inst *testbed.Instance) string {
	if inst.Role == testbed.RolePrimary {
		return inst.Cluster + "p"
	}
	return inst.Cluster + "r"
}

// newWorld builds the hosts, the links (client–router, router–every
// server, primary–replica), the servers and a topology file in which c1
// owns vshards 0–511 and c2 512–1023. routers names the router hosts.
func newWorld(t *testing.T, routers ...string) *world {
	t.Helper()
	testbed.Need(t)
	if os.Getenv("SHARDMQ_PARTITIONS") == "" {
		t.Skip("partition tests run with make test-partitions (SHARDMQ_PARTITIONS=1)")
	}
	if err := netbed.Available(); err != nil {
		t.Skipf("partition tests need network namespaces (run as root on Linux with iproute2): %v", err)
	}
	w := &world{t: t, hosts: map[string]*netbed.Host{}, checks: map[string]*sql.DB{}}
	// The first cleanup runs last: after every router's log tail.
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if t.Failed() && len(w.failures) > 0 {
			// The failures last: a reader of the output's tail sees them.
			if len(w.explained) > 0 {
				t.Logf("what explains it:\n  %s", strings.Join(w.explained, "\n  "))
			}
			t.Logf("%s failed:\n  %s", t.Name(), strings.Join(w.failures, "\n  "))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testBudget)
	t.Cleanup(cancel)
	w.ctx = ctx
	nb, err := netbed.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nb.Close(); err != nil {
			t.Errorf("remove the test hosts: %v", err)
		}
	})
	w.net = nb
	names := append([]string{"client"}, routers...)
	names = append(names, "c1p", "c1r", "c2p", "c2r")
	for _, n := range names {
		h, err := nb.Host(n)
		if err != nil {
			t.Fatal(err)
		}
		w.hosts[n] = h
	}
	pairs := [][2]string{{"c1p", "c1r"}, {"c2p", "c2r"}}
	for _, r := range routers {
		pairs = append(pairs, [2]string{"client", r})
		for _, s := range []string{"c1p", "c1r", "c2p", "c2r"} {
			pairs = append(pairs, [2]string{r, s})
		}
		for _, o := range routers {
			if o > r {
				pairs = append(pairs, [2]string{r, o})
			}
		}
	}
	for _, p := range pairs {
		if _, err := nb.Connect(w.hosts[p[0]], w.hosts[p[1]]); err != nil {
			t.Fatal(err)
		}
	}
	bed, err := testbed.Start(ctx, testbed.Spec{Clusters: 2, Replicas: 1, Place: func(inst *testbed.Instance) (string, string) {
		h := w.hosts[hostOf(inst)]
		return h.NS, h.Addr
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bed.Stop() })
	w.bed = bed
	w.dbName = "t_part"
	if err := testbed.CreateDatabase(ctx, bed, w.dbName); err != nil {
		t.Fatal(err)
	}
	var y strings.Builder
	y.WriteString("clusters:\n")
	for _, c := range bed.Clusters {
		fmt.Fprintf(&y, "  - name: %s\n    primary: %q\n    replicas:\n", c.Name, c.Primary.DSN(w.dbName))
		for _, r := range c.Replicas {
			fmt.Fprintf(&y, "      - %q\n", r.DSN(w.dbName))
		}
		db, err := sql.Open("mysql", "root@unix("+c.Primary.Socket+")/"+w.dbName+"?parseTime=true")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		w.checks[c.Name] = db
	}
	y.WriteString("shard_map:\n  version: 1\n  ranges:\n    - {from: 0, to: 511, cluster: c1}\n    - {from: 512, to: 1023, cluster: c2}\n")
	w.topo = filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(w.topo, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	w.receiptKey = filepath.Join(t.TempDir(), "receipt.key")
	if err := os.WriteFile(w.receiptKey, []byte("the partition tests' routers sign receipts with this key"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := w.hosts["client"]
	w.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: client.DialContext, MaxIdleConnsPerHost: 32, ResponseHeaderTimeout: 30 * time.Second}}
	return w
}

// onConsul adds a "consul" host serving the Consul double, linked to
// every router host (and not to the client: cutting a router from Consul
// leaves it serving), registers the servers as services and seeds the
// shard map there with cmd/consul-seed run on the consul host. Routers
// started after it take their topology from Consul.
func (w *world) onConsul(routers ...string) {
	t := w.t
	t.Helper()
	h, err := w.net.Host("consul")
	if err != nil {
		t.Fatal(err)
	}
	w.hosts["consul"] = h
	for _, r := range routers {
		if _, err := w.net.Connect(w.hosts[r], h); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := h.Listen(":8500")
	if err != nil {
		t.Fatal(err)
	}
	// Consul's own expiry: a session lasts twice its TTL after its last
	// renewal, and TTLs are at least 10 s.
	cd := consuldouble.NewOn(consuldouble.Options{TTLMultiplier: 2, MinSessionTTL: 10 * time.Second}, ln)
	t.Cleanup(cd.Close)
	w.consul = cd.Addr()
	seed := filepath.Join(filepath.Dir(routerBinary(t)), "consul-seed")
	out, err := h.Command(w.ctx, seed, "-topology", w.topo, "-consul-addr", w.consul, "-register").CombinedOutput()
	if err != nil {
		t.Fatalf("consul-seed: %v: %s", err, out)
	}
}

// link returns the link between two hosts.
func (w *world) link(a, b string) *netbed.Link {
	l := w.net.Link(w.hosts[a], w.hosts[b])
	if l == nil {
		w.fatalf("no link %s–%s", a, b)
	}
	return l
}

// router is a cmd/router process on a host of its own.
type router struct {
	w    *world
	host *netbed.Host
	args []string
	url  string
	log  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startRouter runs cmd/router on host with the world's topology file.
func (w *world) startRouter(host string, extra ...string) *router {
	w.t.Helper()
	h := w.hosts[host]
	r := &router{w: w, host: h, url: "http://" + h.Addr + ":8080", log: filepath.Join(w.t.TempDir(), host+".log"),
		args: []string{"-listen", h.Addr + ":8080", "-retention-off", "-insecure", "-log-level", "info", "-receipt-key-file", w.receiptKey}}
	if w.consul != "" {
		r.args = append(r.args, "-consul-addr", w.consul, "-mysql-database", w.dbName, "-router-id", host)
	} else {
		r.args = append(r.args, "-topology", w.topo)
	}
	r.args = append(r.args, extra...)
	w.t.Cleanup(func() {
		r.stop()
		if w.t.Failed() {
			keep := filepath.Join(os.TempDir(), "shardmq-partition-logs", w.t.Name()+"-"+host+".log")
			os.MkdirAll(filepath.Dir(keep), 0o755)
			if data, err := os.ReadFile(r.log); err == nil && os.WriteFile(keep, data, 0o644) == nil {
				w.t.Logf("%s log kept in %s; its tail:\n%s", host, keep, tail(r.log, 20))
			}
		}
	})
	r.start()
	return r
}

func (r *router) start() {
	t := r.w.t
	t.Helper()
	out, err := os.OpenFile(r.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := r.host.Command(context.Background(), routerBinary(t), r.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	r.w.waitFor(time.Minute, "router "+r.host.Name+" ready", func() bool {
		select {
		case <-done:
			t.Fatalf("router %s exited at start", r.host.Name)
		default:
		}
		st, _ := r.w.call("GET", r.url+"/readyz", nil)
		return st == 200
	})
}

// stop ends the router: SIGTERM (after SIGCONT, in case it is stopped),
// then SIGKILL if it lingers.
func (r *router) stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Signal(syscall.SIGTERM)
	defer func() {
		r.mu.Lock()
		r.cmd = nil
		r.mu.Unlock()
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// kill ends the router at once, as a crash would.
func (r *router) kill() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	cmd.Process.Kill()
	<-done
}

func (r *router) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmd.Process.Signal(sig)
}

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// call is an HTTP round trip from the client host: the status (0 when
// the request failed) and the decoded JSON answer.
func (w *world) call(method, url string, body any) (int, map[string]any) {
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(w.ctx, method, url, rd)
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, map[string]any{"error": err.Error()}
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&out)
	return resp.StatusCode, out
}

// waitFor polls cond until it holds or d (or the test's budget, or the
// world's context) ends.
func (w *world) waitFor(d time.Duration, what string, cond func() bool) {
	w.t.Helper()
	testtime.Within(w.t, d, what, func() bool {
		if w.ctx.Err() != nil {
			w.fatalf("%s: the world ended first: %v", what, w.ctx.Err())
		}
		return cond()
	})
}
