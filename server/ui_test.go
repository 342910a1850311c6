package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
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
// E_STOCK, 2 dead E_PAY, 4 in flight (leased by worker-7), 11 ready;
// orders/audit with 20 ready; payments/default with 10 ready.
func seedUI(t *testing.T, e *uiEnv) {
	t.Helper()
	e.must(t, "PUT", "/v1/topics/orders/subscriptions/billing", map[string]any{"max_attempts": 1})
	e.must(t, "PUT", "/v1/topics/orders/subscriptions/audit", map[string]any{})
	// orders first, then payments (a slice, not a map: the queue table's
	// lag order, which TestUIEndpoints checks, is the produce order).
	for _, tn := range []struct {
		topic string
		n     int
	}{{"orders", 20}, {"payments", 10}} {
		topic, n := tn.topic, tn.n
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
				map[string]any{"max": n - len(got), "wait_ms": 2000, "visibility_timeout_ms": 600000, "consumer": "worker-7"})
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
	testtime.WithinState(t, 30*time.Second, fmt.Sprint("queues ", want, " from samples"), func() (bool, string) {
		last = e.must(t, "GET", "/v1/admin/queues?limit=500", nil)
		got := map[string][3]float64{}
		for _, s := range last["subscriptions"].([]any) {
			m := s.(map[string]any)
			got[m["topic"].(string)+"/"+m["subscription"].(string)] = [3]float64{m["depth"].(float64), m["in_flight"].(float64), m["dead"].(float64)}
		}
		return last["live"] == false && fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprintf("%v (live %v)", got, last["live"])
	})
	return last
}

// The page's shell is public and carries no data; everything it shows
// comes from authenticated endpoints: the queue table (filter, sort,
// paging, an hour of samples), dead letters by error code, a redrive's
// dry run that changes nothing, the resharding jobs; the page's own
// origin passes the Origin check, another does not.
func TestUIEndpoints(t *testing.T) {
	testbed.Need(t)
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
		{"sort=lag&limit=1", 3, "orders/audit"}, // billing's oldest were claimed
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
	want := `{"codes":[{"count":3,"error_code":"E_STOCK"},{"count":2,"error_code":"E_PAY"}],"missing_clusters":[],"total":5}`
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
	if got := codes(); got != `{"codes":[{"count":3,"error_code":"E_STOCK"}],"missing_clusters":[],"total":3}` {
		t.Fatalf("codes after the redrive: %s", got)
	}

	// The rows' lag (billing's oldest ready message), the flow this
	// router counted (20 created on orders, no ack yet), no alarm.
	q = e.must(t, "GET", "/v1/admin/queues?filter=orders/billing", nil)
	row := list(q["subscriptions"])[0]
	if row["lag_seconds"].(float64) <= 0 || row["oldest_ready_at"] == nil || mustJSON(row["flow"]) != `{"acked":0,"created":20}` ||
		mustJSON(q["alarms"]) != `[]` || q["partial"] != false || mustJSON(q["missing_clusters"]) != `[]` {
		t.Fatalf("queue row %v of %v", row, q)
	}
	// Who holds billing's leases: worker-7, its four.
	cons := list(e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/consumers", nil)["consumers"])
	if len(cons) != 1 || cons[0]["consumer"] != "worker-7" || cons[0]["in_flight"].(float64) != 4 || cons[0]["oldest_lease_at"] == "" {
		t.Fatalf("consumers %v", cons)
	}
	if st, _, out := e.send(t, "GET", "/v1/topics/orders/subscriptions/nobody/consumers", nil, nil); st != 404 {
		t.Fatalf("consumers of no subscription: %d %v", st, out)
	}
	// Deleting one chosen dead letter, twice: the second finds nothing.
	dead := list(e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/dead-letters?error_code=E_STOCK", nil)["dead_letters"])
	del := map[string]any{"ids": []string{dead[0]["id"].(string)}}
	if out := e.must(t, "POST", "/v1/topics/orders/subscriptions/billing/dead-letters/delete", del); out["deleted"].(float64) != 1 {
		t.Fatalf("delete: %v", out)
	}
	if out := e.must(t, "POST", "/v1/topics/orders/subscriptions/billing/dead-letters/delete", del); out["deleted"].(float64) != 0 {
		t.Fatalf("delete again: %v", out)
	}
	if got := codes(); got != `{"codes":[{"count":2,"error_code":"E_STOCK"}],"missing_clusters":[],"total":2}` {
		t.Fatalf("codes after the delete: %s", got)
	}
	// Retention: the three tiers; no archive cluster in this topology.
	ret := e.must(t, "GET", "/v1/admin/retention", nil)
	if ret["archive_state"] != "none" || len(ret["tiers"].([]any)) != 3 {
		t.Fatalf("retention %v", ret)
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

// The operator follows a reshard to its end from the command line: plan
// (a table, nothing started), start -follow (a progress bar to done), the
// heat map before and after, status tables, a redrive's dry run, and the
// bash completion script; -json gives the router's answers.
func TestOperatorCLIReshardFollow(t *testing.T) {
	testbed.Need(t)
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
