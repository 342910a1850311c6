package partition

import (
	"errors"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/netbed"
	"github.com/shardmq/shardmq/internal/testbed"
)

// The router's link to c1's primary is slowed (500 ms each way: netem
// where the kernel has it, else a relay on the router's host that delays
// every chunk) and then cut while a load of known keys runs: c1's keys
// fail fast (answered, not held), c2's keep being served, the router does
// not pile requests up; once the link heals, c1 serves again, every key
// ends acknowledged and stored once, every message consumed once.
func TestRouterPrimarySlowThenCut(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1")
	var c1p string
	for _, c := range w.bed.Clusters {
		if c.Name == "c1" {
			c1p = c.Primary.Addr()
		}
	}
	relay := w.relay("r1", c1p)
	w.throughRelay(c1p, relay)
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

	slowAt := time.Now()
	netem := true
	if err := link.Delay(500 * time.Millisecond); errors.Is(err, netbed.ErrNoNetem) {
		t.Log("this kernel has no netem: the relay on r1 delays c1's primary 500 ms each way")
		netem = false
		relay.setDelay(500 * time.Millisecond)
	} else if err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	if netem {
		if err := link.Delay(0); err != nil {
			t.Fatal(err)
		}
	} else {
		relay.setDelay(0)
	}
	slowEnd := time.Now()
	// While slow (after a second for requests under way): c2 served, and
	// every request answered within the bound the cut has too.
	var c1Slow, c1SlowOK, c2Slow int
	var slowestSlow time.Duration
	l.mu.Lock()
	for k, as := range l.answers {
		for _, a := range as {
			if a.at.Before(slowAt.Add(time.Second)) || a.at.After(slowEnd) {
				continue
			}
			slowestSlow = max(slowestSlow, a.took)
			switch {
			case onC1(k):
				c1Slow++
				if a.status == "created" || a.status == "duplicate" {
					c1SlowOK++
				}
			case a.status == "created":
				c2Slow++
			}
		}
	}
	l.mu.Unlock()
	t.Logf("while slow: %d of %d c1 items acknowledged, %d c2 items created, slowest request %v", c1SlowOK, c1Slow, c2Slow, slowestSlow)
	if c2Slow == 0 {
		t.Error("c2 was not served while only c1's link was slow")
	}
	if slowestSlow > 15*time.Second {
		w.errorf("a request took %v while c1's link was slow: the router held it instead of failing fast", slowestSlow)
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
		w.errorf("a request took %v during the cut: the router held it instead of failing fast", slowest)
	}

	l.settle(time.Minute)
	l.drain()
	l.checkStored()
}
