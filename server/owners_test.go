package server

import (
	"context"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testtime"
)

// Owners of delivery state across routers (issue 28, docs/consume.md
// "Owners"): routers over the same clusters, one of them killed or leaving
// while consumers hold leases.

// peer is another router over e's clusters and database.
type peer struct {
	url string
	r   *Router
	srv *httptest.Server
}

func (e *env) another(t *testing.T, tune func(*Config)) *peer {
	t.Helper()
	ln := listen(t)
	cfg := Config{TopologyFile: e.topology}
	cfg.Broker.Owners.Addr = ln.Addr().String()
	cfg.Broker.Receipts = testReceipts
	if tune != nil {
		tune(&cfg)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	p := &peer{r: r, srv: serveOn(ln, r.Handler())}
	p.url = p.srv.URL
	t.Cleanup(p.close)
	return p
}

func (p *peer) close() {
	p.srv.Close()
	p.r.Close()
}

// crash stops a router as kill -9 would for what others see of it: it
// answers no more, renews nothing, hands nothing over, writes nothing.
func (p *peer) crash() {
	p.srv.CloseClientConnections()
	p.srv.Close()
	p.r.broker.Owners().Abandon()
}

// quickOwners shortens owner leases so that takeovers happen within a
// test's time.
func quickOwners(c *Config) { c.Broker.Owners.LeaseTTL = 2 * time.Second }

func claimVia(t *testing.T, base, topic string, max int, visibility time.Duration) []map[string]any {
	t.Helper()
	code, body := fleetCall(t, base, http.MethodPost, "/v1/topics/"+topic+"/subscriptions/default/claim",
		map[string]any{"max": max, "wait_ms": 0, "visibility_timeout_ms": visibility.Milliseconds(), "consumer": base})
	if code != http.StatusOK {
		t.Fatalf("claim via %s: %d %v", base, code, body)
	}
	return fleetMessages(t, body)
}

// claimAfterCrash is claimVia while a crashed router still owns the
// units on record: until its ownership lapses their clusters answer
// unavailable (503), which is the honest "retry later".
func claimAfterCrash(t *testing.T, base, topic string, max int, visibility time.Duration) []map[string]any {
	t.Helper()
	code, body := fleetCall(t, base, http.MethodPost, "/v1/topics/"+topic+"/subscriptions/default/claim",
		map[string]any{"max": max, "wait_ms": 0, "visibility_timeout_ms": visibility.Milliseconds(), "consumer": base})
	switch code {
	case http.StatusOK:
		return fleetMessages(t, body)
	case http.StatusServiceUnavailable:
		return nil
	}
	t.Fatalf("claim via %s: %d %v", base, code, body)
	return nil
}

func produceVia(t *testing.T, base, topic string, keys ...string) {
	t.Helper()
	var batch []any
	for _, k := range keys {
		batch = append(batch, map[string]any{"key": k, "payload": map[string]any{"k": k}})
	}
	code, body := fleetCall(t, base, http.MethodPost, "/v1/topics/"+topic+"/messages", map[string]any{"messages": batch})
	if code != http.StatusOK {
		t.Fatalf("produce: %d %v", code, body)
	}
	for _, r := range results(t, body) {
		if r["status"] != "created" {
			t.Fatalf("produce: %v", r)
		}
	}
}

// alone keeps a test's own router out of the owners (it serves the
// admin and trace requests): it is no member, so it never owns a unit.
func alone(c *Config) {
	quickOwners(c)
	c.Broker.Owners.Addr = ""
}

// A router killed while consumers hold leases from its memory: another
// router takes its units once its ownership lapses, hands nothing out
// before those leases could have ended, hands them out again within
// seconds after, and refuses the dead router's receipts.
func TestOwnerCrashRedeliversAfterItsLeasesNotBefore(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, alone)
	a := e.another(t, quickOwners)
	const topic = "own.crash"
	var keys []string
	for i := range 20 {
		keys = append(keys, fmt.Sprint("c", i))
	}
	produceVia(t, a.url, topic, keys...)
	const lease = 3 * time.Second
	held := claimVia(t, a.url, topic, 20, lease)
	claimedAt := time.Now()
	if len(held) != 20 {
		t.Fatalf("claimed %d of 20", len(held))
	}
	a.crash()
	b := e.another(t, quickOwners)
	seen := map[string]time.Time{}
	deadline := claimedAt.Add(lease + 30*time.Second)
	for len(seen) < 20 && time.Now().Before(deadline) {
		for _, m := range claimAfterCrash(t, b.url, topic, 20, time.Minute) {
			k := m["key"].(string)
			if _, ok := seen[k]; ok {
				t.Fatalf("%s handed out twice by the new owner", k)
			}
			seen[k] = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(seen) != 20 {
		t.Fatalf("%d of 20 redelivered within %v of the claim", len(seen), deadline.Sub(claimedAt))
	}
	for k, at := range seen {
		if at.Before(claimedAt.Add(lease)) {
			t.Fatalf("%s redelivered %v after its claim, before its lease of %v ran out", k, at.Sub(claimedAt), lease)
		}
	}
	// The dead router's receipts are refused wherever they are sent.
	for _, base := range []string{b.url, e.url} {
		code, body := fleetCall(t, base, http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{held[0]["receipt"]}})
		if code != 200 || results(t, body)[0]["status"] != "lease_lost" {
			t.Fatalf("ack of a crashed owner's receipt via %s: %d %v", base, code, body)
		}
	}
}

// A message that keeps killing its consumers dies after max_attempts,
// even when the routers owning it crash twice on the way: every attempt
// after the first is counted in the table before it is handed out (a
// crash during the first attempt costs that attempt's count only).
func TestPoisonMessageDiesAcrossTwoOwnerCrashes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, alone)
	const topic = "own.poison"
	if code, body := fleetCall(t, e.url, http.MethodPut, "/v1/topics/"+topic+"/subscriptions/default", map[string]any{"max_attempts": 3}); code/100 != 2 {
		t.Fatalf("subscription: %d %v", code, body)
	}
	produceVia(t, e.url, topic, "poison")
	const lease = 500 * time.Millisecond
	status := func() string {
		code, body := fleetCall(t, e.url, http.MethodGet, "/v1/messages/poison/trace?topic="+topic, nil)
		if code != 200 {
			t.Fatalf("trace: %d %v", code, body)
		}
		return fmt.Sprint(body["message"].(map[string]any)["status"])
	}
	var attempts []float64
	// claimUntil claims through p until it gets the message once (the
	// consumer then dies: no ack) or the message is dead.
	claimUntil := func(p *peer) bool {
		deadline := time.Now().Add(40 * time.Second)
		for time.Now().Before(deadline) {
			if status() == "dead" {
				return false
			}
			if got := claimAfterCrash(t, p.url, topic, 1, lease); len(got) == 1 {
				attempts = append(attempts, got[0]["attempt"].(float64))
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("not handed out again within 40s (attempts so far %v)", attempts)
		return false
	}
	r1 := e.another(t, quickOwners)
	claimUntil(r1) // attempt 1, in r1's memory
	r1.crash()
	r2 := e.another(t, quickOwners)
	claimUntil(r2) // attempt 1 again: the crash lost its count
	claimUntil(r2) // its lease lapsed: attempt 2, counted first
	r2.crash()
	r3 := e.another(t, quickOwners)
	for claimUntil(r3) {
	}
	if st := status(); st != "dead" {
		t.Fatalf("status %s after attempts %v", st, attempts)
	}
	want := []float64{1, 1, 2, 3}
	if fmt.Sprint(attempts) != fmt.Sprint(want) {
		t.Fatalf("attempts %v, want %v", attempts, want)
	}
}

// Units move between routers under load — a router leaving hands its
// units over, a router joining takes its share — and every message is
// consumed exactly once: leases handed over stay valid, no ack is lost.
func TestOwnershipMovesBetweenRoutersUnderLoad(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, nil)
	b := e.another(t, nil)
	const topic = "own.move"
	const total = 600
	var mu sync.Mutex
	acked := map[string]int{}
	urls := []string{e.url, b.url}
	var cur sync.Mutex
	routerURLs := func() []string {
		cur.Lock()
		defer cur.Unlock()
		return append([]string(nil), urls...)
	}
	setURLs := func(u []string) {
		cur.Lock()
		defer cur.Unlock()
		urls = u
	}
	ctx, cancel := context.WithCancel(testtime.Context(t))
	defer cancel()
	var wg sync.WaitGroup
	// Producers.
	wg.Go(func() {
		for i := 0; i < total; i += 20 {
			var keys []string
			for j := i; j < i+20; j++ {
				keys = append(keys, fmt.Sprint("m", j))
			}
			us := routerURLs()
			produceVia(t, us[i/20%len(us)], topic, keys...)
			time.Sleep(20 * time.Millisecond)
		}
	})
	// Consumers: claim through any router, ack (retrying an ack that
	// could not be answered) through any other.
	for w := range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				done := len(acked) == total
				mu.Unlock()
				if done {
					return
				}
				us := routerURLs()
				code, body, err := fleetTry(t, us[w%len(us)], http.MethodPost, "/v1/topics/"+topic+"/subscriptions/default/claim",
					map[string]any{"max": 10, "wait_ms": 100, "consumer": fmt.Sprint("w", w)})
				if err != nil || code != 200 {
					// A router leaving: claim again elsewhere (what a claim
					// that lost its answer handed out comes back after its
					// lease).
					continue
				}
				for _, m := range fleetMessages(t, body) {
					lostAnswer := false // an ack sent that got no answer may have acked it
					for try := 0; ; try++ {
						us := routerURLs()
						code, res, err := fleetTry(t, us[(w+try+1)%len(us)], http.MethodPost, "/v1/ack", map[string]any{"receipts": []any{m["receipt"]}})
						st := ""
						if err == nil && code == 200 {
							st = fmt.Sprint(results(t, res)[0]["status"])
						}
						lostAnswer = lostAnswer || err != nil
						if st == "ok" || st == "not_found" && lostAnswer {
							mu.Lock()
							acked[m["key"].(string)]++
							mu.Unlock()
							break
						}
						if st == "lease_lost" || st == "not_found" || try > 50 {
							t.Errorf("ack of %s: %d %v", m["key"], code, res)
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			}
		})
	}
	// Under the load: b leaves (hands over), c joins (takes its share).
	time.Sleep(2 * time.Second)
	setURLs([]string{e.url})
	b.close()
	time.Sleep(time.Second)
	c := e.another(t, nil)
	setURLs([]string{e.url, c.url})
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("acked %d of %d in time", len(acked), total)
	}
	for k, n := range acked {
		if n != 1 {
			t.Fatalf("%s acked %d times", k, n)
		}
	}
	if len(acked) != total {
		t.Fatalf("acked %d of %d", len(acked), total)
	}
	// c took units: its owners hold some, or held.
	var owned int
	for _, cl := range bed.Clusters {
		var n int
		e.dbs[cl.Name].QueryRow("SELECT COUNT(*) FROM delivery_owner WHERE owner = ?", c.r.broker.Owners().Router()).Scan(&n)
		owned += n
	}
	if owned == 0 {
		t.Log("the joining router took no unit (two units, rendezvous kept both elsewhere)")
	}
}
