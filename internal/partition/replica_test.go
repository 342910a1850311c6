package partition

import (
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"strings"
	"testing"
	"time"
)

// The link between c1's primary and its replica is cut while producers
// ask for `durability: replicated`: c1's items are answered
// `unavailable` within the replicated wait (committed on the primary, the
// error says so), c2's keep being `created`; a trace read of a key
// written during the cut (the replica lacks it) answers from the primary.
// After the heal the keys sent again answer `duplicate` with the id the
// primary committed, and every acknowledged key is stored once.
func TestPrimaryReplicaCut(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1")
	r := w.startRouter("r1", "-replicated-timeout", "2s", "-replica-read-timeout", "500ms")
	l := w.newLoad(r.url, "pr", map[string]any{"durability": "replicated"})
	l.resend = false // the cut's check wants only keys new during it
	l.start(2, 5, 100*time.Millisecond, 1)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	time.Sleep(2 * time.Second)
	link := w.link("c1p", "c1r")
	cutAt := time.Now()
	if err := link.Cut(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)

	// A key written during the cut, on c1: its trace comes from the
	// primary (the replica does not have it).
	var during string
	for i := 0; during == ""; i++ {
		if k := fmt.Sprint("trace-", i); onC1(k) {
			during = k
		}
	}
	st, out := w.call("POST", r.url+"/v1/topics/pr/messages", map[string]any{"messages": []any{map[string]any{"key": during, "payload": 1}}})
	if st != 200 || results(out)[0]["status"] != "created" {
		w.fatalf("produce with durability primary during the cut: %d %v", st, out)
	}
	st, tr := w.call("GET", r.url+"/v1/messages/"+during+"/trace?topic=pr", nil)
	if st != 200 {
		w.fatalf("trace of a key written during the cut: %d %v", st, tr)
	}

	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	time.Sleep(3 * time.Second)
	l.Stop()
	stopped = true

	var c1Unavailable, c2Created int
	var slowest time.Duration
	l.mu.Lock()
	for k, as := range l.answers {
		for _, a := range as {
			// Only requests sent a second after the cut and answered
			// before the heal: one sent just before it may have reached
			// the replica's relay log and be confirmed a little later.
			if a.at.Before(cutAt.Add(time.Second)) || a.at.Add(a.took).After(healAt) {
				continue
			}
			slowest = max(slowest, a.took)
			switch {
			case onC1(k) && (a.status == "unknown" || a.status == "unavailable"):
				// Not confirmed: unknown (on the primary, not on a
				// replica in time) or unavailable (not stored).
				c1Unavailable++
			case onC1(k) && (a.status == "created" || a.status == "duplicate"):
				w.errorf("key %s answered %s under durability replicated while its replica was cut off", k, a.status)
			case !onC1(k) && a.status == "created":
				c2Created++
			}
		}
	}
	l.mu.Unlock()
	t.Logf("during the cut: %d c1 items unavailable, %d c2 items created, slowest request %v", c1Unavailable, c2Created, slowest)
	if c1Unavailable == 0 || c2Created == 0 {
		w.errorf("want c1 items unavailable and c2 items created during the cut")
	}
	if slowest > 10*time.Second {
		w.errorf("a request took %v with a replicated wait of 2s", slowest)
	}
	l.settle(time.Minute)
	// Keys first answered unavailable were committed on the primary:
	// sent again they are duplicates with that id (checkStored compares
	// ids), never stored twice.
	dups := 0
	l.mu.Lock()
	for _, as := range l.answers {
		if len(as) > 1 && (as[0].status == "unknown" || as[0].status == "unavailable") && as[len(as)-1].status == "duplicate" {
			dups++
		}
	}
	l.mu.Unlock()
	t.Logf("%d keys answered unavailable during the cut answered duplicate when sent again", dups)
	if dups == 0 {
		t.Error("no key first answered unavailable was a duplicate when sent again")
	}
	l.drain()
	l.checkStored()
}

func results(out map[string]any) []map[string]any {
	raw, _ := out["results"].([]any)
	res := make([]map[string]any, len(raw))
	for i, r := range raw {
		res[i], _ = r.(map[string]any)
	}
	if len(res) == 0 {
		res = []map[string]any{{"status": strings.TrimSpace(fmt.Sprint(out))}}
	}
	return res
}
