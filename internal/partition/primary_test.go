package partition

import (
	"errors"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/netbed"
	"github.com/shardmq/shardmq/internal/testbed"
)

// The router's link to c1's primary is slowed (500 ms each way, where the
// kernel has netem) and then cut while a load of known keys runs: c1's
// keys fail fast (answered, not held), c2's keep being served, the router
// does not pile requests up; once the link heals, c1 serves again, every
// key ends acknowledged and stored once, every message consumed once.
func TestRouterPrimarySlowThenCut(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1")
	r := w.startRouter("r1")
	l := w.newLoad(r.url, "pa", nil)
	l.start(2, 5, 50*time.Millisecond, 2)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	time.Sleep(2 * time.Second)
	link := w.link("r1", "c1p")

	if err := link.Delay(500 * time.Millisecond); errors.Is(err, netbed.ErrNoNetem) {
		t.Log("this kernel has no netem: the slow phase is skipped, the cut runs")
	} else if err != nil {
		t.Fatal(err)
	} else {
		time.Sleep(4 * time.Second)
		if err := link.Delay(0); err != nil {
			t.Fatal(err)
		}
	}

	cutAt := time.Now()
	if err := link.Cut(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second)
	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()

	// Recovery: a c1 key is created again within 30 s of the heal.
	w.waitFor(30*time.Second, "c1 writable after the heal", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for k, as := range l.answers {
			for _, a := range as {
				if onC1(k) && a.at.After(healAt) && a.status == "created" {
					return true
				}
			}
		}
		return false
	})
	l.Stop()
	stopped = true

	// During the cut (after a grace for requests under way), every
	// request was answered within a bound, and c2 kept being served.
	var c1Failed, c2Served int
	var slowest time.Duration
	l.mu.Lock()
	for k, as := range l.answers {
		for _, a := range as {
			if a.at.Add(a.took).Before(cutAt) || a.at.After(healAt) {
				continue // not under way during the cut
			}
			slowest = max(slowest, a.took)
			switch {
			case onC1(k) && a.status != "created" && a.status != "duplicate":
				c1Failed++
			case !onC1(k) && a.status == "created":
				c2Served++
			}
		}
	}
	l.mu.Unlock()
	t.Logf("during the cut: %d c1 items refused, %d c2 items created, slowest request %v", c1Failed, c2Served, slowest)
	if c2Served == 0 {
		t.Error("c2 was not served while only c1's link was cut")
	}
	if slowest > 15*time.Second {
		t.Errorf("a request took %v during the cut: the router held it instead of failing fast", slowest)
	}

	l.settle(time.Minute)
	l.drain()
	l.checkStored()
}
