package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shardmq/shardmq/internal/cdp"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// The operators' page in a real headless Chromium (Debian's chromium,
// driven over the DevTools protocol on a pipe: internal/cdp), against a
// router over the test bed. The tests are not parallel: the browser's CPU
// would slow the timing-sensitive tests that run beside them on a small
// machine. Screenshots go to var/ui-test/ ($SHARDMQ_UI_ARTIFACTS).

// uiArtifacts is where the browser tests keep their screenshots.
func uiArtifacts() string {
	if d := os.Getenv("SHARDMQ_UI_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "var", "ui-test")
}

// withArchive gives the router an archive cluster: a database of its own
// on the bed's last primary, named in the topology file.
func withArchive(t *testing.T) func(*Config) {
	return func(c *Config) {
		db := testbed.TestDatabase(t, bed, "t_ui_arch_")
		f, err := os.OpenFile(c.TopologyFile, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "archive:\n  primary: %q\n", bed.Clusters[len(bed.Clusters)-1].Primary.DSN(db)); err != nil {
			t.Fatal(err)
		}
	}
}

// uiPage is one signed-in tab of the page.
type uiPage struct {
	t    *testing.T
	name string // the screenshot of a failed step is <name>-failed.png
	ctx  context.Context
	p    *cdp.Page

	mu       sync.Mutex
	problems []string // console errors, exceptions, failed loads, refused policies
}

// openUI starts Chromium (skipping the test without one), loads the page
// and signs in with the env's token.
func openUI(t *testing.T, e *uiEnv, name string) *uiPage {
	t.Helper()
	path := cdp.Find()
	if path == "" {
		t.Skip("chromium is not installed (apt-get install -y chromium; make test installs it): skipping the browser test of /ui")
	}
	u := &uiPage{t: t, name: name}
	b, err := cdp.Launch(path, t.TempDir(), 1400, 1000, func(_, method string, params json.RawMessage) {
		if p := cdp.ConsoleProblem(method, params); p != "" {
			u.mu.Lock()
			u.problems = append(u.problems, p)
			u.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithCancel(testtime.Context(t))
	t.Cleanup(cancel)
	u.ctx = ctx
	if u.p, err = b.NewPage(ctx); err != nil {
		t.Fatal(err)
	}
	u.step("load /ui/", u.p.Navigate(ctx, e.url+"/ui/"))
	u.wait("the token form shows, no data", `!document.getElementById("login").hidden && document.getElementById("app").hidden`)
	u.eval("sign in", `document.getElementById("token").value = `+strconv.Quote(e.token)+`; document.getElementById("signin").click()`)
	return u
}

func (u *uiPage) step(what string, err error) {
	u.t.Helper()
	if err != nil {
		u.shot(u.name + "-failed.png")
		u.t.Fatalf("%s: %v", what, err)
	}
}

func (u *uiPage) eval(what, expr string) { u.t.Helper(); u.step(what, u.p.Eval(u.ctx, expr, nil)) }

func (u *uiPage) wait(what, expr string) { u.t.Helper(); u.step(what, u.p.WaitFor(u.ctx, expr)) }

// text is the text of the first element matching the CSS selector.
func (u *uiPage) text(sel string) string {
	u.t.Helper()
	var s string
	u.step("read "+sel, u.p.Eval(u.ctx, `(document.querySelector(`+strconv.Quote(sel)+`) || {}).textContent || ""`, &s))
	return s
}

// click clicks the first element matching the CSS selector.
func (u *uiPage) click(what, sel string) {
	u.t.Helper()
	u.eval(what, `document.querySelector(`+strconv.Quote(sel)+`).click()`)
}

// confirm answers the open confirmation dialog: types typed (when not
// empty) and presses its OK button.
func (u *uiPage) confirm(what, typed string) {
	u.t.Helper()
	u.wait(what+": the confirmation", `document.getElementById("confirm").open`)
	if typed != "" {
		u.typeConfirm(typed)
	}
	u.wait(what+": OK enabled", `!document.getElementById("cfok").disabled`)
	u.click(what+": OK", "#cfok")
	u.wait(what+": the dialog closes", `!document.getElementById("confirm").open`)
}

func (u *uiPage) typeConfirm(s string) {
	u.t.Helper()
	u.eval("type "+s, `(() => { const i = document.getElementById("cftyped"); i.value = `+strconv.Quote(s)+`; i.dispatchEvent(new Event("input")); })()`)
}

// shot writes a screenshot of the whole page into uiArtifacts().
func (u *uiPage) shot(file string) {
	png, err := u.p.Screenshot(u.ctx)
	if err != nil {
		u.t.Logf("screenshot %s: %v", file, err)
		return
	}
	os.MkdirAll(uiArtifacts(), 0o755)
	if err := os.WriteFile(filepath.Join(uiArtifacts(), file), png, 0o644); err != nil {
		u.t.Errorf("screenshot %s: %v", file, err)
	}
}

// noProblems fails the test on anything the page logged, but what
// expected says it may.
func (u *uiPage) noProblems(expected func(string) bool) {
	u.t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	var bad []string
	for _, p := range u.problems {
		if expected == nil || !expected(p) {
			bad = append(bad, p)
		}
	}
	if len(bad) > 0 {
		u.t.Fatalf("the page logged problems:\n%s", strings.Join(bad, "\n"))
	}
}

// utcTime is how the page writes a time.
var utcTime = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`)

// The page loads with no console error (CSP violations and failed loads
// included), asks for the token, and shows the map, the clusters, the
// queues with their lag, parked count and rates, the retention tiers with
// the archive cluster's health; it plans and starts a reshard (after a
// confirmation), pauses and resumes it and follows it to done with a full
// bar; then it aborts a second one (a cancelled confirmation first),
// whose bar stays grey where it stopped and whose note clears.
func TestUIBrowser(t *testing.T) {
	testbed.Need(t)
	// A slow copy (10 rows a second, 5 a batch), so that the jobs can be
	// paused and aborted from the page while they copy.
	e := setupUI(t, func(c *Config) {
		withArchive(t)(c)
		c.Reshard.RowsPerSecond, c.Reshard.BatchRows = 10, 5
	})
	seedUI(t, e)
	u := openUI(t, e, "ui")

	// The map: 1024 cells, c1 and c2 with 512 each, c3 with none.
	u.wait("the map", `document.querySelectorAll("#grid div").length === 1024 && document.querySelector('#legend span[data-cluster="c1"]') !== null`)
	for c, want := range map[string]string{"c1": "c1 (512)", "c2": "c2 (512)", "c3": "c3 (0)"} {
		if got := u.text(`#legend span[data-cluster="` + c + `"]`); got != want {
			t.Fatalf("legend %s: %q, want %q", c, got, want)
		}
	}
	u.wait("the clusters, each with its replica", `new Set([...document.querySelectorAll("#clusters tbody tr[data-cluster]")].map((r) => r.dataset.cluster)).size === 3 &&
		document.querySelectorAll("#clusters tbody tr[data-cluster]").length === 6`)
	// The queues, once sampled: the seeded counts, nothing parked, and
	// the age of billing's oldest ready message.
	row := `#queues tr[data-topic="orders"][data-sub="billing"]`
	u.wait("the queue counts", `(() => { const r = document.querySelector('`+row+`');
		return !!r && r.querySelector(".depth").textContent === "11" && r.querySelector(".inflight").textContent === "4" &&
			r.querySelector(".dead").textContent === "5" && r.querySelector(".parked").textContent === "0" && /^\d+ (s|min)$/.test(r.querySelector(".lag").textContent); })()`)
	if got := u.text("#qpage"); got != " 1-3 of 3 " {
		t.Fatalf("queue paging %q", got)
	}
	// Rates: 3 messages produced to orders and 2 of audit's acked after
	// the page's first count show as in/s and out/s at its next refreshes.
	var msgs []any
	for i := range 3 {
		msgs = append(msgs, map[string]any{"key": fmt.Sprintf("orders-late-%d", i), "payload": map[string]any{"n": i}})
	}
	e.must(t, "POST", "/v1/topics/orders/messages", map[string]any{"messages": msgs})
	got := e.must(t, "POST", "/v1/topics/orders/subscriptions/audit/claim", map[string]any{"max": 2, "wait_ms": 2000})
	var receipts []any
	for _, m := range got["messages"].([]any) {
		receipts = append(receipts, m.(map[string]any)["receipt"])
	}
	e.must(t, "POST", "/v1/ack", map[string]any{"receipts": receipts})
	audit := `#queues tr[data-topic="orders"][data-sub="audit"]`
	u.wait("the rates", `(() => { const b = document.querySelector('`+row+`'), a = document.querySelector('`+audit+`');
		return parseFloat(b.querySelector(".rin").textContent) > 0 && parseFloat(a.querySelector(".rout").textContent) > 0 &&
			document.querySelector('#queues tr[data-topic="payments"] .rin').textContent === "0.0"; })()`)
	// The filter (answered by the server) narrows the table, and clearing
	// it brings every row back.
	filter := func(v string) string {
		return `(() => { const f = document.getElementById("qfilter"); f.value = ` + strconv.Quote(v) + `; f.dispatchEvent(new Event("input")); })()`
	}
	u.eval("filter", filter("payments"))
	u.wait("filtered", `document.getElementById("qpage").textContent === " 1-1 of 1 " && document.querySelectorAll("#queues tbody tr").length === 1`)
	u.eval("unfilter", filter(""))
	u.wait("unfiltered", `document.getElementById("qpage").textContent === " 1-3 of 3 "`)
	// Retention: the three tiers, the archive cluster connected, the
	// partition job's pass of the router's start.
	u.wait("the retention panel", `document.querySelectorAll("#tiers tr[data-tier]").length === 3 &&
		document.getElementById("archive").dataset.state === "ok" && document.querySelector('#retjobs tr[data-job="partitions"]') !== null`)
	if got := u.text(`#tiers tr[data-tier="hot"] td:nth-child(2)`); !regexp.MustCompile(`^\d{4}-\d\d to \d{4}-\d\d$`).MatchString(got) {
		t.Fatalf("hot months %q", got)
	}

	// Resharding: plan c3's share, start it after the confirmation.
	u.eval("plan", `document.getElementById("rsmode").value = "add_cluster"; document.getElementById("rsarg").value = "c3"; document.getElementById("rsplan").click()`)
	u.wait("the plan", `!document.getElementById("rsstart").disabled`)
	if got := u.text("#rsmsg"); !strings.HasPrefix(got, "plan: ") {
		t.Fatalf("plan message %q", got)
	}
	u.click("start", "#rsstart")
	u.wait("the start's confirmation", `document.getElementById("confirm").open`)
	if jobs := e.must(t, "GET", "/v1/admin/reshard", nil); len(jobs["jobs"].([]any)) != 0 {
		t.Fatalf("a job started before the confirmation: %v", jobs)
	}
	u.confirm("start", "")
	u.wait("the job row", `document.querySelectorAll("#jobs tr[data-job]").length === 1`)
	if got := u.text(`#jobs tr[data-job] time`); !utcTime.MatchString(got) {
		t.Fatalf("the job's start %q, want UTC with the zone", got)
	}
	var title string
	u.step("the time's title", u.p.Eval(u.ctx, `document.querySelector("#jobs tr[data-job] time").title`, &title))
	if !strings.HasPrefix(title, "local: ") {
		t.Fatalf("the time's title %q, want the local time", title)
	}
	// Pause it while it copies: the map shows the moving vshards, the row
	// a resume button; the screenshot of that moment is ui-paused.png.
	u.wait("the pause button", `document.querySelector('#jobs tr[data-job] button[data-act="pause"]') !== null`)
	u.click("pause", `#jobs tr[data-job] button[data-act="pause"]`)
	u.wait("paused", `document.querySelector("#jobs tr[data-job] td.state").textContent === "paused" &&
		document.querySelector('#jobs tr[data-job] button[data-act="resume"]') !== null && document.querySelectorAll("#grid div.moving").length > 0`)
	if jobs := e.must(t, "GET", "/v1/admin/reshard", nil); list(jobs["jobs"])[0]["state"] != "paused" {
		t.Fatalf("the router's job after the page paused it: %v", jobs)
	}
	u.shot("ui-paused.png")
	u.click("resume", `#jobs tr[data-job] button[data-act="resume"]`)
	u.wait("the job ends done", `document.querySelector("#jobs tr[data-job] td.state").textContent === "done"`)
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
	u.wait("the map follows", `document.querySelector('#legend span[data-cluster="c3"]').textContent === `+strconv.Quote(want))
	done := list(e.must(t, "GET", "/v1/admin/reshard", nil)["jobs"])[0]
	if got, want := u.text(`#jobs tr[data-job] td.progress`), fmt.Sprintf(" 100%% · %v/%v rows", done["rows_copied"], done["rows_total"]); !strings.HasPrefix(got, want) ||
		done["rows_copied"] != done["rows_total"] {
		t.Fatalf("progress %q, want %q (job %v)", got, want, done)
	}
	u.shot("ui.png")

	// A second job, c3 drained again: a cancelled abort changes nothing;
	// a confirmed one ends it aborted, its bar grey where it stopped, and
	// the note about it goes.
	u.eval("plan the drain", `document.getElementById("rsmode").value = "drain"; document.getElementById("rsarg").value = "c3"; document.getElementById("rsplan").click()`)
	u.wait("the drain's plan", `!document.getElementById("rsstart").disabled`)
	u.click("start the drain", "#rsstart")
	u.confirm("start the drain", "")
	second := `#jobs tr[data-job]:first-child`
	u.wait("the drain copies", `document.querySelector('`+second+` button[data-act="abort"]') !== null &&
		document.querySelector('`+second+`').dataset.job !== `+strconv.Quote(done["job"].(string)))
	u.click("abort", second+` button[data-act="abort"]`)
	u.wait("the abort's confirmation", `document.getElementById("confirm").open`)
	u.click("cancel the abort", "#cfcancel")
	u.wait("cancelled", `!document.getElementById("confirm").open`)
	if j := list(e.must(t, "GET", "/v1/admin/reshard", nil)["jobs"])[0]; j["state"] == "aborting" || j["state"] == "aborted" {
		t.Fatalf("a cancelled abort aborted the job: %v", j)
	}
	u.click("abort", second+` button[data-act="abort"]`)
	u.confirm("abort", "")
	u.wait("the note while it aborts", `document.getElementById("rsmsg").textContent.startsWith("rs-")`)
	u.wait("aborted", `document.querySelector('`+second+`').dataset.state === "aborted" && document.querySelector('`+second+` .bar.ended') !== null &&
		document.querySelector('`+second+` td.progress').textContent.includes("aborted") && document.getElementById("rsmsg").textContent === ""`)
	u.wait("the map is back", `document.querySelector('#legend span[data-cluster="c3"]').textContent === `+strconv.Quote(want))
	u.shot("ui-aborted.png")
	u.noProblems(nil)
}

// Per-message dead-letter work from the page: a firing dead-letter alarm
// shows in the banner and leads to its subscription, whose purge is
// blocked until its name is typed; billing's consumers (worker-7 with its
// four leases), one dead letter retried (it leaves the list and is ready
// again), one deleted, one traced from its row, the rest redriven by code
// after a dry run; keys "." and ".." traced from the form; 23 dead letters
// paged older and newer. Then, on the same page, a cluster and the router
// stop answering (one router and one browser for both: each costs a
// minute on a loaded machine).
func TestUIDeadLettersAndRouterDown(t *testing.T) {
	testbed.Need(t)
	e := setupUI(t, nil)
	seedUI(t, e)
	ctx := context.Background()
	// The alarm: a first count of every subscription's dead letters, then
	// three of payments/default die (max one attempt): growth from none.
	e.r.DeadLetters().Check(ctx)
	e.must(t, "PUT", "/v1/topics/payments/subscriptions/default", map[string]any{"max_attempts": 1})
	got := e.must(t, "POST", "/v1/topics/payments/subscriptions/default/claim", map[string]any{"max": 3, "wait_ms": 2000})
	var items []any
	for _, m := range got["messages"].([]any) {
		items = append(items, map[string]any{"receipt": m.(map[string]any)["receipt"], "error_code": "E_CARD", "error": "declined"})
	}
	if len(items) != 3 {
		t.Fatalf("claimed %d of payments, want 3", len(items))
	}
	for _, r := range e.must(t, "POST", "/v1/nack", map[string]any{"items": items})["results"].([]any) {
		if r.(map[string]any)["status"] != "dead" {
			t.Fatalf("nack: %v", r)
		}
	}
	e.r.DeadLetters().Check(ctx)
	codes := func(sub string) float64 {
		return e.must(t, "GET", "/v1/topics/"+sub+"/dead-letters/codes", nil)["total"].(float64)
	}

	u := openUI(t, e, "ui-deadletters")
	u.wait("the alarm banner", `[...document.querySelectorAll('#banners [data-banner="alarm"]')].some((b) => b.textContent.includes("payments/default has 3 dead letters"))`)
	u.wait("the alarmed row", `document.querySelector('#queues tr[data-topic="payments"] .dead.h-bad') !== null`)
	u.shot("ui-alarm.png")
	u.click("show the alarm's subscription", `#banners [data-banner="alarm"] button`)
	u.wait("payments' dead letters", `document.getElementById("dlsub").textContent === "payments/default" && document.querySelectorAll("#deadletters tr[data-id]").length === 3`)
	// The purge: OK stays disabled until the name is typed exactly.
	u.click("purge", "#dlpurge")
	u.wait("the purge's confirmation", `document.getElementById("confirm").open && document.getElementById("cfok").disabled && !document.getElementById("cftypedrow").hidden`)
	u.typeConfirm("payments/defaul")
	u.eval("press the disabled OK", `document.getElementById("cfok").click()`)
	var disabled bool
	u.step("OK after a wrong name", u.p.Eval(u.ctx, `document.getElementById("cfok").disabled && document.getElementById("confirm").open`, &disabled))
	if !disabled {
		t.Fatal("the purge's OK is enabled, or the dialog closed, with a wrong name typed")
	}
	if n := codes("payments/subscriptions/default"); n != 3 {
		t.Fatalf("%v dead letters after a purge with a wrong name, want 3", n)
	}
	u.shot("ui-purge.png")
	u.confirm("purge", "payments/default")
	u.wait("purged", `document.getElementById("dlact").textContent === "purged: 3" && document.querySelectorAll("#deadletters tr[data-id]").length === 0`)
	if n := codes("payments/subscriptions/default"); n != 0 {
		t.Fatalf("%v dead letters after the purge", n)
	}

	// Billing: worker-7 holds its four leases; five dead letters.
	u.click("pick billing", `#queues tr[data-topic="orders"][data-sub="billing"]`)
	u.wait("billing's consumers", `(() => { const r = document.querySelector('#consumers tr[data-consumer="worker-7"]');
		return !!r && r.querySelector(".inflight").textContent === "4" && document.querySelectorAll("#consumers tr[data-consumer]").length === 1; })()`)
	u.wait("billing's dead letters", `document.querySelectorAll("#deadletters tr[data-id]").length === 5`)
	var ids []string
	u.step("the listed ids", u.p.Eval(u.ctx, `[...document.querySelectorAll("#deadletters tr[data-id]")].map((r) => r.dataset.id)`, &ids))
	listed := func() string {
		var out []string
		for _, d := range e.must(t, "GET", "/v1/topics/orders/subscriptions/billing/dead-letters", nil)["dead_letters"].([]any) {
			out = append(out, d.(map[string]any)["id"].(string))
		}
		return strings.Join(out, ",")
	}
	if got := listed(); got != strings.Join(ids, ",") {
		t.Fatalf("the page lists %v, the router %s", ids, got)
	}
	// Retry the newest: after the confirmation it leaves the list and is
	// ready again.
	retried := ids[0]
	u.click("retry", `#deadletters tr[data-id="`+retried+`"] button[data-act="retry"]`)
	u.wait("the retry's confirmation", `document.getElementById("confirm").open`)
	if n := codes("orders/subscriptions/billing"); n != 5 {
		t.Fatalf("a dead letter left before the retry was confirmed: %v", n)
	}
	u.confirm("retry", "")
	u.wait("retried", `document.getElementById("dlact").textContent === "retried `+retried+`: 1 made ready" &&
		document.querySelectorAll("#deadletters tr[data-id]").length === 4 && document.querySelector('#deadletters tr[data-id="`+retried+`"]') === null`)
	if got := listed(); strings.Contains(got, retried) || codes("orders/subscriptions/billing") != 4 {
		t.Fatalf("after the retry the router lists %s", got)
	}
	// Delete the next one.
	deleted := ids[1]
	u.click("delete", `#deadletters tr[data-id="`+deleted+`"] button[data-act="delete"]`)
	u.confirm("delete", "")
	u.wait("deleted", `document.getElementById("dlact").textContent === "deleted `+deleted+`: 1" && document.querySelectorAll("#deadletters tr[data-id]").length === 3`)
	if got := listed(); strings.Contains(got, deleted) || codes("orders/subscriptions/billing") != 3 {
		t.Fatalf("after the delete the router lists %s", got)
	}
	// Trace one from its row: its key and the dead delivery.
	key := u.text(`#deadletters tr[data-id="` + ids[2] + `"] td:nth-child(2)`)
	u.click("trace a dead letter", `#deadletters tr[data-id="`+ids[2]+`"] button[data-act="trace"]`)
	u.wait("its trace", `(document.querySelector("#trout .tracehead") || {}).textContent?.includes(`+strconv.Quote(strconv.Quote(key))+`) === true &&
		[...document.querySelectorAll("#trout td")].some((td) => td.textContent === "dead")`)
	// The rest by error code: a dry run, then the redrive, confirmed.
	u.wait("the codes", `document.querySelectorAll("#codes tr[data-code]").length >= 1`)
	u.click("dry run all", `#codes button[data-act="dry-run-all"], #codes button[data-act="dry-run"]`)
	u.wait("the dry run's answer", `!document.getElementById("dlconfirm").hidden`)
	n := codes("orders/subscriptions/billing")
	u.click("redrive", "#dlconfirm")
	u.confirm("redrive", "")
	u.wait("redriven", `document.getElementById("dlmsg").textContent.startsWith("redriven: ")`)
	if after := codes("orders/subscriptions/billing"); after >= n {
		t.Fatalf("dead letters %v before the redrive, %v after", n, after)
	}
	u.shot("ui-deadletters.png")

	// Keys a browser removes from a path ("." and "..") are traced.
	var dots []any
	for _, k := range []string{".", ".."} {
		dots = append(dots, map[string]any{"key": k, "payload": map[string]any{"k": k}})
	}
	e.must(t, "POST", "/v1/topics/dots/messages", map[string]any{"messages": dots})
	for _, k := range []string{".", ".."} {
		u.eval("trace "+k, `document.getElementById("trkey").value = `+strconv.Quote(k)+`; document.getElementById("trtopic").value = "dots";
			document.getElementById("trorder").value = ""; document.getElementById("trtx").value = ""; document.getElementById("trgo").click()`)
		u.wait("the trace of "+k, `(document.querySelector("#trout .tracehead") || {}).textContent?.startsWith("message "+`+strconv.Quote(strconv.Quote(k))+`) === true`)
	}

	// The dead-letter list pages by the router's cursor, 20 a page:
	// 23 dead letters are 20 on page 1 and the 3 oldest on page 2, each
	// listed once; "newer" goes back to page 1.
	e.must(t, "PUT", "/v1/topics/dlpages/subscriptions/default", map[string]any{"max_attempts": 1})
	var many []any
	for i := range 23 {
		many = append(many, map[string]any{"key": fmt.Sprintf("dlpage-%02d", i), "payload": map[string]any{"i": i}})
	}
	e.must(t, "POST", "/v1/topics/dlpages/messages", map[string]any{"messages": many})
	for dead := 0; dead < len(many); {
		got := e.must(t, "POST", "/v1/topics/dlpages/subscriptions/default/claim", map[string]any{"max": len(many), "wait_ms": 2000})
		var items []any
		for _, m := range got["messages"].([]any) {
			items = append(items, map[string]any{"receipt": m.(map[string]any)["receipt"], "error_code": "E_PAGE"})
		}
		if len(items) == 0 {
			t.Fatalf("%d of %d dead, then nothing to claim", dead, len(many))
		}
		e.must(t, "POST", "/v1/nack", map[string]any{"items": items})
		dead += len(items)
	}
	rowIDs := func(what string) []string {
		var ids []string
		u.step(what, u.p.Eval(u.ctx, `[...document.querySelectorAll("#deadletters tr[data-id]")].map((r) => r.dataset.id)`, &ids))
		return ids
	}
	u.eval("pick dlpages", `pickSub("dlpages", "default")`)
	u.wait("page 1 of the dead letters", `document.getElementById("dlsub").textContent === "dlpages/default" &&
		document.querySelectorAll("#deadletters tr[data-id]").length === 20 && !document.getElementById("dlnext").disabled &&
		document.getElementById("dlprev").disabled && document.getElementById("dlinfo").textContent.startsWith("page 1")`)
	first := rowIDs("page 1's ids")
	u.click("older", "#dlnext")
	u.wait("page 2 of the dead letters", `document.querySelectorAll("#deadletters tr[data-id]").length === 3 &&
		document.getElementById("dlnext").disabled && !document.getElementById("dlprev").disabled &&
		document.getElementById("dlinfo").textContent.startsWith("page 2")`)
	seen := map[string]bool{}
	for _, id := range append(first, rowIDs("page 2's ids")...) {
		if seen[id] {
			t.Fatalf("dead letter %s on both pages: %v", id, first)
		}
		seen[id] = true
	}
	u.click("newer", "#dlprev")
	u.wait("back on page 1", `document.querySelectorAll("#deadletters tr[data-id]").length === 20 && document.getElementById("dlinfo").textContent.startsWith("page 1")`)
	if back := rowIDs("page 1's ids again"); strings.Join(back, ",") != strings.Join(first, ",") {
		t.Fatalf("page 1 again lists %v, first %v", back, first)
	}
	u.noProblems(nil)

	// When a cluster stops answering, the queue table keeps the last
	// complete counts (not the smaller ones of the clusters left), marks
	// them stale and names the cluster in red; when the router stops, the
	// page says so at the top and greys out what it shows.
	row := `#queues tr[data-topic="orders"][data-sub="audit"]`
	u.wait("audit's count", `(() => { const r = document.querySelector('`+row+`'); return !!r && r.querySelector(".depth").textContent === "20" && !r.classList.contains("stale"); })()`)
	// c2 loses its database: its part of every count is missing.
	if _, err := e.dbs["c2"].Exec("DROP DATABASE `" + e.name + "`"); err != nil {
		t.Fatal(err)
	}
	u.wait("c2 named in red", `[...document.querySelectorAll('#banners [data-banner="missing"]')].some((b) => b.textContent.includes("c2 (queue counts"))`)
	u.wait("the last complete counts, stale", `(() => { const r = document.querySelector('`+row+`');
		return r.classList.contains("stale") && r.querySelector(".depth").textContent === "20"; })()`)
	// The banners say why: c2's primary cannot serve (the topology's live
	// check fails on the dropped database), and the counts are stale.
	u.wait("the not-served banner", `[...document.querySelectorAll('#banners [data-banner="unserved"]')].some((b) => b.textContent.includes("c2's primary is unreachable"))`)
	u.wait("the stale-counts banner", `[...document.querySelectorAll('#banners [data-banner="stale"]')].some((b) => b.textContent.includes("missed c2"))`)
	if q := e.must(t, "GET", "/v1/admin/queues", nil); fmt.Sprint(q["missing_clusters"]) != "[c2]" {
		t.Fatalf("queues without c2: %v", q)
	}
	u.shot("ui-missing.png")

	e.stop()
	u.wait("the router-down banner", `document.querySelector('#banners [data-banner="down"]') !== null && document.getElementById("app").classList.contains("stale") &&
		document.getElementById("status").textContent === "router unreachable"`)
	if got := u.text(row + " .depth"); got != "20" {
		t.Fatalf("audit's depth %q after the router stopped: the last counts stay", got)
	}
	u.shot("ui-down.png")
	// What the page may log here: the failed loads of a router without
	// c2's database and then without a listener. Never an exception or a
	// refused policy.
	u.noProblems(func(p string) bool {
		return strings.HasPrefix(p, "log error (network)") && (strings.Contains(p, "ERR_CONNECTION_REFUSED") || strings.Contains(p, "status of 5"))
	})
}
