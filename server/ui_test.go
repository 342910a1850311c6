package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/cdp"
	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/ui"
)

// uiEnv is a router over three clusters (setupReshard: c3 owns nothing)
// with an admin token, counting queues every 100 ms and sampling them
// every second, seeded by seedUI.
type uiEnv struct {
	*env
	token string
}

func setupUI(t *testing.T, tune func(*Config)) *uiEnv {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	secret := "secret-ui-admin"
	if err := auth.PutEntry(path, auth.FileToken{Name: "ui-admin", SHA256: auth.Hash(secret),
		Scopes: map[auth.Scope][]string{auth.Admin: {"*"}, auth.Produce: {"*"}, auth.Consume: {"*"}}}); err != nil {
		t.Fatal(err)
	}
	e := setupReshardOn(t, func(c *Config) {
		c.Security.TokensFile = path
		c.Observe.QueueEvery = 100 * time.Millisecond
		c.UI.SampleEvery = time.Second
		if tune != nil {
			tune(c)
		}
	}, true)
	return &uiEnv{env: e, token: secret}
}

// send makes one request with the token (and extra headers).
func (e *uiEnv) send(t *testing.T, method, path string, body any, hdr map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+e.token)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: status %d, body %q is not JSON", method, path, resp.StatusCode, data)
	}
	return resp.StatusCode, resp.Header, out
}

func (e *uiEnv) must(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	st, _, out := e.send(t, method, path, body, nil)
	if st/100 != 2 {
		t.Fatalf("%s %s: %d %v", method, path, st, out)
	}
	return out
}

// seedUI: orders/billing (max 1 attempt) with 20 produced, 3 dead
// E_STOCK, 2 dead E_PAY, 4 in flight, 11 ready; orders/audit with 20
// ready; payments/default with 10 ready.
func seedUI(t *testing.T, e *uiEnv) {
	t.Helper()
	e.must(t, "PUT", "/v1/topics/orders/subscriptions/billing", map[string]any{"max_attempts": 1})
	e.must(t, "PUT", "/v1/topics/orders/subscriptions/audit", map[string]any{})
	for topic, n := range map[string]int{"orders": 20, "payments": 10} {
		var msgs []any
		for i := range n {
			msgs = append(msgs, map[string]any{"key": fmt.Sprintf("%s-%d", topic, i), "payload": map[string]any{"n": i}, "transaction_id": "tx-" + topic})
		}
		e.must(t, "POST", "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs})
	}
	claim := func(n int) []any {
		var got []any
		for len(got) < n {
			out := e.must(t, "POST", "/v1/topics/orders/subscriptions/billing/claim",
				map[string]any{"max": n - len(got), "wait_ms": 2000, "visibility_timeout_ms": 600000})
			got = append(got, out["messages"].([]any)...)
		}
		return got
	}
	var items []any
	for i, m := range claim(5) {
		code := "E_STOCK"
		if i >= 3 {
			code = "E_PAY"
		}
		items = append(items, map[string]any{"receipt": m.(map[string]any)["receipt"], "error_code": code, "error": "seeded"})
	}
	out := e.must(t, "POST", "/v1/nack", map[string]any{"items": items})
	for _, r := range out["results"].([]any) {
		if r.(map[string]any)["status"] != "dead" {
			t.Fatalf("seed nack: %v", out)
		}
	}
	claim(4)
}

// waitQueues polls GET /v1/admin/queues until the sampled counts (not a
// live count) match want (topic/sub → depth, in flight, dead).
func (e *uiEnv) waitQueues(t *testing.T, want map[string][3]float64) map[string]any {
	t.Helper()
	var last map[string]any
	deadline := time.Now().Add(30 * time.Second)
	for {
		last = e.must(t, "GET", "/v1/admin/queues?limit=500", nil)
		got := map[string][3]float64{}
		for _, s := range last["subscriptions"].([]any) {
			m := s.(map[string]any)
			got[m["topic"].(string)+"/"+m["subscription"].(string)] = [3]float64{m["depth"].(float64), m["in_flight"].(float64), m["dead"].(float64)}
		}
		if last["live"] == false && fmt.Sprint(got) == fmt.Sprint(want) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("queues %v, want %v (live %v)", got, want, last["live"])
		}
		time.Sleep(20 * time.Millisecond) // polling the condition, with a deadline
	}
}

// The page's shell is public and carries no data; everything it shows
// comes from authenticated endpoints: the queue table (filter, sort,
// paging, an hour of samples), dead letters by error code, a redrive's
// dry run that changes nothing, the resharding jobs; the page's own
// origin passes the Origin check, another does not.
func TestUIEndpoints(t *testing.T) {
	t.Parallel()
	e := setupUI(t, nil)
	seedUI(t, e)

	resp, err := testClient.Get(e.url + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") != ui.CSP || !strings.Contains(string(page), "/ui/app.js") ||
		strings.Contains(string(page), "orders") || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatalf("GET /ui/ without a token: %d %v %s", resp.StatusCode, resp.Header, page)
	}
	for path, ctype := range map[string]string{"/ui/app.js": "text/javascript; charset=utf-8", "/ui/app.css": "text/css; charset=utf-8", "/ui/nope.js": "text/plain; charset=utf-8"} {
		resp, err := testClient.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 404, false: 200}[path == "/ui/nope.js"]; resp.StatusCode != want || resp.Header.Get("Content-Type") != ctype {
			t.Fatalf("GET %s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	resp, err = testClient.Get(e.url + "/v1/admin/queues")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("queues without a token: %d", resp.StatusCode)
	}

	q := e.waitQueues(t, map[string][3]float64{"orders/audit": {20, 0, 0}, "orders/billing": {11, 4, 5}, "payments/default": {10, 0, 0}})
	if q["step_seconds"].(float64) != 1 || len(q["times"].([]any)) == 0 {
		t.Fatalf("queues: %v", q)
	}
	for _, c := range []struct {
		query string
		total float64
		first string
	}{
		{"offset=1&limit=1", 3, "orders/billing"},
		{"filter=payments", 1, "payments/default"},
		{"sort=dead&limit=1", 3, "orders/billing"},
		{"sort=depth&limit=1", 3, "orders/audit"},
		{"offset=3", 3, ""},
	} {
		out := e.must(t, "GET", "/v1/admin/queues?"+c.query, nil)
		subs := out["subscriptions"].([]any)
		first := ""
		if len(subs) > 0 {
			m := subs[0].(map[string]any)
			first = m["topic"].(string) + "/" + m["subscription"].(string)
			if h := m["history"].(map[string]any); len(h["depth"].([]any)) != len(out["times"].([]any)) {
				t.Fatalf("%s: history %v for times %v", c.query, h, out["times"])
			}
		}
		if out["total"].(float64) != c.total || first != c.first {
			t.Fatalf("queues?%s: total %v first %q, want %v %q", c.query, out["total"], first, c.total, c.first)
		}
	}
	for _, bad := range []string{"sort=size", "limit=0", "limit=501", "offset=-1", "page=2"} {
		if st, _, out := e.send(t, "GET", "/v1/admin/queues?"+bad, nil, nil); st != 400 {
			t.Fatalf("queues?%s: %d %v", bad, st, out)
		}
	}

	codes := func() string {
		return mustJSON(e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/dead-letters/codes", nil))
	}
	want := `{"codes":[{"count":3,"error_code":"E_STOCK"},{"count":2,"error_code":"E_PAY"}],"total":5}`
	if got := codes(); got != want {
		t.Fatalf("codes: %s, want %s", got, want)
	}
	for _, c := range []struct {
		sel  map[string]any
		want float64
	}{
		{map[string]any{"error_code": "E_STOCK"}, 3},
		{map[string]any{"error_code": "E_NONE"}, 0},
		{map[string]any{"all": true}, 5},
	} {
		body := map[string]any{"dry_run": true}
		for k, v := range c.sel {
			body[k] = v
		}
		out := e.must(t, "POST", "/v1/topics/orders/subscriptions/billing/dead-letters/redrive", body)
		if out["dry_run"] != true || out["would_redrive"].(float64) != c.want || out["redriven"].(float64) != 0 {
			t.Fatalf("dry run %v: %v", c.sel, out)
		}
	}
	if got := codes(); got != want {
		t.Fatalf("codes after the dry runs: %s, want %s (a dry run changed something)", got, want)
	}
	if out := e.must(t, "POST", "/v1/topics/orders/subscriptions/billing/dead-letters/redrive", map[string]any{"error_code": "E_PAY"}); out["redriven"].(float64) != 2 {
		t.Fatalf("redrive: %v", out)
	}
	if got := codes(); got != `{"codes":[{"count":3,"error_code":"E_STOCK"}],"total":3}` {
		t.Fatalf("codes after the redrive: %s", got)
	}

	if out := e.must(t, "GET", "/v1/admin/reshard", nil); mustJSON(out) != `{"jobs":[]}` {
		t.Fatalf("jobs: %v", out)
	}
	if st, _, out := e.send(t, "POST", "/v1/topics/orders/subscriptions/billing/dead-letters/redrive",
		map[string]any{"all": true, "dry_run": true}, map[string]string{"Origin": e.url}); st != 200 {
		t.Fatalf("same-origin request: %d %v", st, out)
	}
	if st, _, out := e.send(t, "GET", "/v1/admin/shardmap", nil, map[string]string{"Origin": "http://evil.example"}); st != 403 {
		t.Fatalf("other origin: %d %v", st, out)
	}
}

func list(v any) []map[string]any {
	var out []map[string]any
	for _, x := range v.([]any) {
		out = append(out, x.(map[string]any))
	}
	return out
}

// uiArtifacts is where the browser test keeps its screenshot.
func uiArtifacts() string {
	if d := os.Getenv("SHARDMQ_UI_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "var", "ui-test")
}

// The operators' page in a real headless Chromium: it loads with no
// console error (CSP violations and failed loads included), asks for the
// token, shows the seeded counts, redrives dead letters after a dry run,
// and starts a reshard that it follows to done; the screenshot is kept
// in var/ui-test/ui.png.
func TestUIBrowser(t *testing.T) {
	path := cdp.Find()
	if path == "" {
		t.Skip("chromium is not installed (apt-get install -y chromium; make test installs it): skipping the browser test of /ui")
	}
	// Not parallel: the browser's CPU would slow the timing-sensitive
	// tests that run beside it on a small machine.
	// A slow copy (10 rows a second, 5 a batch), so that the job can be
	// paused from the page while it copies.
	e := setupUI(t, func(c *Config) { c.Reshard.RowsPerSecond, c.Reshard.BatchRows = 10, 5 })
	seedUI(t, e)

	var mu sync.Mutex
	var problems []string
	b, err := cdp.Launch(path, t.TempDir(), 1400, 1000, func(_, method string, params json.RawMessage) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			if png, serr := p.Screenshot(ctx); serr == nil {
				os.MkdirAll(uiArtifacts(), 0o755)
				os.WriteFile(filepath.Join(uiArtifacts(), "ui-failed.png"), png, 0o644)
			}
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		var s string
		step("read "+sel, p.Eval(ctx, `(document.querySelector(`+strconv.Quote(sel)+`) || {}).textContent || ""`, &s))
		return s
	}
	step("load /ui/", p.Navigate(ctx, e.url+"/ui/"))
	step("the token form shows, no data", p.WaitFor(ctx, `!document.getElementById("login").hidden && document.getElementById("app").hidden`))
	step("sign in", p.Eval(ctx, `document.getElementById("token").value = `+strconv.Quote(e.token)+`; document.getElementById("signin").click()`, nil))

	// The map: 1024 cells, c1 and c2 with 512 each, c3 with none.
	step("the map", p.WaitFor(ctx, `document.querySelectorAll("#grid div").length === 1024 && document.querySelector('#legend span[data-cluster="c1"]') !== null`))
	for c, want := range map[string]string{"c1": "c1 (512)", "c2": "c2 (512)", "c3": "c3 (0)"} {
		if got := text(`#legend span[data-cluster="` + c + `"]`); got != want {
			t.Fatalf("legend %s: %q, want %q", c, got, want)
		}
	}
	step("the clusters, each with its replica", p.WaitFor(ctx, `new Set([...document.querySelectorAll("#clusters tbody tr[data-cluster]")].map((r) => r.dataset.cluster)).size === 3 &&
		document.querySelectorAll("#clusters tbody tr[data-cluster]").length === 6`))
	// The queues, once sampled: the seeded counts.
	row := `#queues tr[data-topic="orders"][data-sub="billing"]`
	step("the queue counts", p.WaitFor(ctx, `(() => { const r = document.querySelector('`+row+`');
		return !!r && r.querySelector(".depth").textContent === "11" && r.querySelector(".inflight").textContent === "4" && r.querySelector(".dead").textContent === "5"; })()`))
	if got := text("#qpage"); got != " 1-3 of 3 " {
		t.Fatalf("queue paging %q", got)
	}
	// The filter (answered by the server) narrows the table, and clearing
	// it brings every row back.
	filter := func(v string) string {
		return `(() => { const f = document.getElementById("qfilter"); f.value = ` + strconv.Quote(v) + `; f.dispatchEvent(new Event("input")); })()`
	}
	step("filter", p.Eval(ctx, filter("payments"), nil))
	step("filtered", p.WaitFor(ctx, `document.getElementById("qpage").textContent === " 1-1 of 1 " && document.querySelectorAll("#queues tbody tr").length === 1`))
	step("unfilter", p.Eval(ctx, filter(""), nil))
	step("unfiltered", p.WaitFor(ctx, `document.getElementById("qpage").textContent === " 1-3 of 3 "`))
	// Dead letters: pick the queue, dry run, then redrive for real.
	step("pick billing", p.Eval(ctx, `document.querySelector('`+row+`').click()`, nil))
	step("the codes", p.WaitFor(ctx, `document.querySelectorAll("#codes tr[data-code]").length === 2`))
	step("dry run E_STOCK", p.Eval(ctx, `document.querySelector('#codes tr[data-code="E_STOCK"] button').click()`, nil))
	step("the dry run's answer", p.WaitFor(ctx, `!document.getElementById("dlconfirm").hidden`))
	if got := text("#dlconfirm"); got != "Redrive 3" {
		t.Fatalf("confirm button %q", got)
	}
	if c := e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/dead-letters/codes", nil); c["total"].(float64) != 5 {
		t.Fatalf("the dry run changed the dead letters: %v", c)
	}
	step("redrive", p.Eval(ctx, `document.getElementById("dlconfirm").click()`, nil))
	step("redriven", p.WaitFor(ctx, `document.getElementById("dlmsg").textContent === "redriven: 3"`))
	if c := e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/dead-letters/codes", nil); c["total"].(float64) != 2 {
		t.Fatalf("after the redrive: %v", c)
	}
	// Trace by transaction id.
	step("trace", p.Eval(ctx, `document.getElementById("trtx").value = "tx-payments"; document.getElementById("trgo").click()`, nil))
	step("trace answer", p.WaitFor(ctx, `(document.querySelector("#trout pre") || {}).textContent?.includes("payments-9") === true`))

	// Resharding: plan c3's share, start it, follow it to done.
	step("plan", p.Eval(ctx, `document.getElementById("rsmode").value = "add_cluster"; document.getElementById("rsarg").value = "c3"; document.getElementById("rsplan").click()`, nil))
	step("the plan", p.WaitFor(ctx, `!document.getElementById("rsstart").disabled`))
	if got := text("#rsmsg"); !strings.HasPrefix(got, "plan: ") {
		t.Fatalf("plan message %q", got)
	}
	if jobs := e.must(t, "GET", "/v1/admin/reshard", nil); len(jobs["jobs"].([]any)) != 0 {
		t.Fatalf("the plan started a job: %v", jobs)
	}
	step("start", p.Eval(ctx, `document.getElementById("rsstart").click()`, nil))
	step("the job row", p.WaitFor(ctx, `document.querySelectorAll("#jobs tr[data-job]").length === 1`))
	// Pause it while it copies: the map shows the moving vshards, the row
	// a resume button; the screenshot of that moment is ui-paused.png.
	step("the pause button", p.WaitFor(ctx, `document.querySelector('#jobs tr[data-job] button[data-act="pause"]') !== null`))
	step("pause", p.Eval(ctx, `document.querySelector('#jobs tr[data-job] button[data-act="pause"]').click()`, nil))
	step("paused", p.WaitFor(ctx, `document.querySelector("#jobs tr[data-job] td.state").textContent === "paused" &&
		document.querySelector('#jobs tr[data-job] button[data-act="resume"]') !== null && document.querySelectorAll("#grid div.moving").length > 0`))
	if jobs := e.must(t, "GET", "/v1/admin/reshard", nil); list(jobs["jobs"])[0]["state"] != "paused" {
		t.Fatalf("the router's job after the page paused it: %v", jobs)
	}
	if png, err := p.Screenshot(ctx); err == nil {
		os.MkdirAll(uiArtifacts(), 0o755)
		os.WriteFile(filepath.Join(uiArtifacts(), "ui-paused.png"), png, 0o644)
	}
	step("resume", p.Eval(ctx, `document.querySelector('#jobs tr[data-job] button[data-act="resume"]').click()`, nil))
	step("the job ends done", p.WaitFor(ctx, `document.querySelector("#jobs tr[data-job] td.state").textContent === "done"`))
	sm := e.must(t, "GET", "/v1/admin/shardmap", nil)
	own := map[string]int{}
	for _, r := range sm["ranges"].([]any) {
		m := r.(map[string]any)
		own[m["cluster"].(string)] += int(m["to"].(float64)-m["from"].(float64)) + 1
	}
	if own["c3"] == 0 {
		t.Fatalf("c3 owns nothing after the job: %v", sm)
	}
	want := fmt.Sprintf("c3 (%d)", own["c3"])
	step("the map follows", p.WaitFor(ctx, `document.querySelector('#legend span[data-cluster="c3"]').textContent === `+strconv.Quote(want)))
	if got := text(`#jobs tr[data-job] td:nth-child(4)`); !strings.HasPrefix(got, " 100% ") {
		t.Fatalf("progress %q", got)
	}

	png, err := p.Screenshot(ctx)
	step("screenshot", err)
	if err := os.MkdirAll(uiArtifacts(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(uiArtifacts(), "ui.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Fatalf("the page logged problems:\n%s", strings.Join(problems, "\n"))
	}
}

// The operator follows a reshard to its end from the command line: plan
// (a table, nothing started), start -follow (a progress bar to done), the
// heat map before and after, status tables, a redrive's dry run, and the
// bash completion script; -json gives the router's answers.
func TestOperatorCLIReshardFollow(t *testing.T) {
	t.Parallel()
	e := setupUI(t, nil)
	seedUI(t, e)
	client := ctl.WithToken(testClient, e.token)
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := ctl.Run(args, e.url, &stdout, &stderr, client)
		return code, stdout.String(), stderr.String()
	}
	heat := func() string {
		t.Helper()
		code, out, errs := run("shardmap", "-heat")
		if code != 0 {
			t.Fatalf("shardmap -heat: %d %s", code, errs)
		}
		return out
	}
	before := heat()
	if !strings.Contains(before, "\n   0 "+strings.Repeat("A", 64)+"\n") || !strings.Contains(before, "\n 960 "+strings.Repeat("B", 64)+"\n") ||
		!strings.Contains(before, "A c1 (512 vshards)") {
		t.Fatalf("heat map before:\n%s", before)
	}
	code, out, errs := run("reshard", "plan", "add-cluster", "c3")
	if code != 0 || !strings.Contains(out, "SOURCE") || !strings.Contains(out, "c3") || !strings.Contains(out, "nothing started") {
		t.Fatalf("plan: %d %q %s", code, out, errs)
	}
	if code, out, _ := run("reshard", "status"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("the plan started a job: %d\n%s", code, out)
	}
	code, out, errs = run("reshard", "start", "add-cluster", "c3", "-follow")
	if code != 0 || !strings.HasPrefix(out, "started rs-") || !strings.Contains(out, "done        ["+strings.Repeat("#", 30)+"] 100%") ||
		!strings.Contains(out, " done: ") {
		t.Fatalf("start -follow: %d\n%s\n%s", code, out, errs)
	}
	t.Logf("reshard start add-cluster c3 -follow:\n%s", out)
	id := strings.Fields(out)[1]
	startOut := out
	if code, out, _ := run("reshard", "status", id); code != 0 || !strings.Contains(out, id+"  done  ") {
		t.Fatalf("status: %d\n%s", code, out)
	}
	lastLine := func(s string) string { ls := strings.Split(strings.TrimSpace(s), "\n"); return ls[len(ls)-1] }
	followed := lastLine(startOut)
	if code, out, _ := run("reshard", "status", id, "-watch"); code != 0 || lastLine(out) != followed || !strings.Contains(out, "100%") {
		t.Fatalf("status -watch of a finished job: %d\n%s\nwant the last line %q", code, out, followed)
	}
	if code, out, _ := run("dlq", "list", "orders", "billing", "-error-code", "E_PAY"); code != 0 || strings.Count(out, "E_PAY") != 2 || !strings.HasPrefix(out, "ID ") {
		t.Fatalf("dlq list: %d\n%s", code, out)
	}
	if code, out, _ := run("-json", "reshard", "status", id); code != 0 || !strings.Contains(out, `"state": "done"`) {
		t.Fatalf("status -json: %d\n%s", code, out)
	}
	after := heat()
	if !strings.Contains(after, "C c3 (") || strings.Contains(after, "C c3 (0 ") {
		t.Fatalf("heat map after:\n%s", after)
	}
	t.Logf("shardmap -heat after:\n%s", after)
	if code, _, errs := run("reshard", "pause", id); code != 1 || !strings.Contains(errs, "reshard") {
		t.Fatalf("pause of a finished job: %d %s", code, errs)
	}
	code, out, _ = run("dlq", "redrive", "orders", "billing", "-error-code", "E_STOCK", "-dry-run")
	if code != 0 || out != "dry run: 3 dead letters would be redriven (E_STOCK 3); nothing changed\n" {
		t.Fatalf("redrive -dry-run: %d %q", code, out)
	}
	if code, out, _ := run("dlq", "codes", "orders", "billing"); code != 0 || !strings.Contains(out, "E_STOCK     3") || !strings.Contains(out, "(total)     5") {
		t.Fatalf("codes after the dry run: %d\n%s", code, out)
	}
	if code, out, _ := run("stats"); code != 0 || !strings.Contains(out, "orders    billing       11     11     0        4          0       5\n") {
		t.Fatalf("stats: %d\n%s", code, out)
	}
	code, out, _ = run("completion", "bash")
	if code != 0 || !strings.Contains(out, "complete -F _shardmqctl shardmqctl") {
		t.Fatalf("completion: %d %q", code, out)
	}
	if bash, err := exec.LookPath("bash"); err == nil {
		cmd := exec.Command(bash, "-n")
		cmd.Stdin = strings.NewReader(out)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the completion script does not parse: %v %s", err, msg)
		}
	}
}
