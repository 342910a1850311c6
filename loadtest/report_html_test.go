package loadtest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/cdp"
	"github.com/shardmq/shardmq/internal/testbed"
)

// routerProxy is a TCP forwarder in front of the test's router, and the
// run's fault: Kill closes its listener and every connection through it
// (the generator's requests are refused and reset, as when a router
// process dies), Restart listens again on the same address.
type routerProxy struct {
	addr, target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

var _ Fault = (*routerProxy)(nil)

func newRouterProxy(t *testing.T, target string) *routerProxy {
	t.Helper()
	p := &routerProxy{target: strings.TrimPrefix(target, "http://"), conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.Kill(context.Background()) })
	return p
}

func (p *routerProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *routerProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *routerProxy) Name() string { return "router" }

func (p *routerProxy) Kill(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	return nil
}

func (p *routerProxy) Restart(context.Context) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return err
	}
	p.serve(ln)
	return nil
}

// A short, small mixed run with the router cut off for a second writes a
// report.html that stands alone — inline SVG charts of throughput,
// latency, errors, CPU and the clusters' shares, the cut marked, no
// script, nothing loaded from anywhere — and that Chromium renders
// without a complaint; its screenshot is var/ui-test/report.png.
func TestReportHTMLInBrowser(t *testing.T) {
	testbed.Need(t)
	path := cdp.Find()
	if path == "" {
		t.Skip("chromium is not installed (apt-get install -y chromium; make test installs it): skipping the browser test of report.html")
	}
	e := setupOn(t, bed)
	px := newRouterProxy(t, e.url)
	cfg := e.small(ScenarioMixed)
	cfg.Router = "http://" + px.addr
	cfg.Duration, cfg.Warmup, cfg.Drain = 5*time.Second, time.Second, 30*time.Second
	cfg.ProduceRate, cfg.ConsumeRate = 600, 1200
	cfg.Fault, cfg.FaultAt, cfg.FaultDown = px, 2*time.Second, time.Second
	cfg.CPU = []CPUSource{SelfCPU()}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checkPassed(t, rep)
	p := rep.Phases[0]
	var e2e, prod bool
	for _, pt := range p.Timeline {
		e2e = e2e || pt.E2EP99 > 0
		prod = prod || pt.ProduceP99 > 0
	}
	if !e2e || !prod || len(p.CPUTimeline) == 0 || len(p.Faults) != 2 {
		t.Fatalf("the timeline lacks what the charts draw: latencies %v %v, cpu %d points, faults %+v", prod, e2e, len(p.CPUTimeline), p.Faults)
	}

	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	for _, want := range []string{`<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="throughput-0"`, `data-chart="latency-0"`,
		`data-chart="errors-0"`, `data-chart="cpu-0"`, `data-chart="clusters-0"`, ">kill -9 router<", ">router back<", `data-verdict="pass"`} {
		if !strings.Contains(page, want) {
			t.Fatalf("report.html lacks %s", want)
		}
	}
	// Self-contained: nothing to load, no script (a URL in an attribute
	// is only the SVG namespace's name).
	for _, bad := range []*regexp.Regexp{regexp.MustCompile(`(?i)<script`), regexp.MustCompile(`(?i)\s(src|href)=`), regexp.MustCompile(`(?i)url\(`),
		regexp.MustCompile(`(?i)="\s*[a-z]+://[^"]*"`)} {
		for _, m := range bad.FindAllString(page, -1) {
			if m != `="http://www.w3.org/2000/svg"` {
				t.Fatalf("report.html refers outside itself: %q", m)
			}
		}
	}

	var mu sync.Mutex
	var problems []string
	b, err := cdp.Launch(path, t.TempDir(), 1100, 900, func(_, method string, params json.RawMessage) {
		if p := cdp.ConsoleProblem(method, params); p != "" {
			mu.Lock()
			problems = append(problems, p)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Navigate(ctx, "file://"+filepath.Join(dir, "report.html")); err != nil {
		t.Fatal(err)
	}
	// Drawn: the charts have their size, the throughput curve its points,
	// the fault its mark.
	if err := pg.WaitFor(ctx, `document.querySelectorAll("svg.chart").length === 5 &&
		document.querySelector('svg[data-chart="throughput-0"]').getBoundingClientRect().height > 100 &&
		document.querySelector('svg[data-chart="throughput-0"] path').getAttribute("d").split("L").length > 5 &&
		document.querySelectorAll('svg[data-chart="latency-0"] path').length >= 4 &&
		document.querySelectorAll('svg line.mark').length >= 10`); err != nil {
		t.Fatal(err)
	}
	png, err := pg.Screenshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	art := os.Getenv("SHARDMQ_UI_ARTIFACTS")
	if art == "" {
		art = filepath.Join("..", "var", "ui-test")
	}
	os.MkdirAll(art, 0o755)
	if err := os.WriteFile(filepath.Join(art, "report.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("report.html logged problems:\n%s", strings.Join(problems, "\n"))
	}
}
