package partition

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"syscall"
	"testing"
	"time"
)

// reshardVia submits a move of vshards 256–511 to c2 through r and waits
// until the job ends; it returns the job.
func (w *world) reshardVia(r *router) map[string]any {
	w.t.Helper()
	st, body := w.call("POST", r.url+"/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 256, "to": 511, "target": "c2"}}})
	if st != 202 {
		w.t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	var job map[string]any
	w.waitFor(3*time.Minute, "the job ending", func() bool {
		_, job = w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		s, _ := job["state"].(string)
		return s == "done" || s == "failed" || s == "aborted"
	})
	return job
}

// Must-show (a) of issue 26 on the test hosts: two routers on Consul; r1
// is cut off from Consul (it still reaches every server) while writes
// keep coming through it and r2 moves vshards 256–511 from c1 to c2. After
// the heal every key acknowledged through either router is stored once
// with its id, every message consumed once, none acked twice.
func TestRouterCutFromConsulDuringReshard(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1", "r2")
	w.onConsul("r1", "r2")
	r1 := w.startRouter("r1")
	r2 := w.startRouter("r2")
	l1 := w.newLoad(r1.url, "pc", nil)
	l2 := w.newLoad(r2.url, "pd", nil)
	l1.start(2, 5, 50*time.Millisecond, 1)
	l2.start(1, 5, 50*time.Millisecond, 1)
	stopped := false
	defer func() {
		if !stopped {
			l1.Stop()
			l2.Stop()
		}
	}()
	time.Sleep(3 * time.Second)
	link := w.link("r1", "consul")
	if err := link.Cut(); err != nil {
		t.Fatal(err)
	}
	job := w.reshardVia(r2)
	if job["state"] != "done" {
		t.Fatalf("job: %v", job)
	}
	time.Sleep(3 * time.Second) // r1 still cut off, still taking writes
	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	l1.Stop()
	l2.Stop()
	stopped = true
	l1.settle(time.Minute)
	l2.settle(time.Minute)
	l1.drain()
	l2.drain()
	l1.checkStored()
	l2.checkStored()
}

// Must-show (b) of issue 26 on the test hosts: r1 is frozen with SIGSTOP
// (requests through it in flight) for a whole reshard that r2 runs, and
// woken after the cut-over. Every acknowledged key stored once, every
// message consumed once, none acked twice.
func TestRouterFrozenThroughReshard(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1", "r2")
	w.onConsul("r1", "r2")
	r1 := w.startRouter("r1")
	r2 := w.startRouter("r2")
	l1 := w.newLoad(r1.url, "pf", nil)
	l2 := w.newLoad(r2.url, "pg", nil)
	l1.start(2, 5, 50*time.Millisecond, 1)
	l2.start(1, 5, 50*time.Millisecond, 1)
	stopped := false
	defer func() {
		if !stopped {
			l1.Stop()
			l2.Stop()
		}
	}()
	time.Sleep(3 * time.Second)
	began := time.Now()
	r1.signal(syscall.SIGSTOP)
	job := w.reshardVia(r2)
	r1.signal(syscall.SIGCONT)
	t.Logf("reshard done %v after r1 stopped", time.Since(began).Round(time.Millisecond))
	if job["state"] != "done" {
		t.Fatalf("job: %v", job)
	}
	time.Sleep(5 * time.Second)
	l1.Stop()
	l2.Stop()
	stopped = true
	t.Logf("load stopped %v after r1 stopped", time.Since(began).Round(time.Millisecond))
	l1.settle(time.Minute)
	l2.settle(time.Minute)
	t.Logf("settled %v after r1 stopped", time.Since(began).Round(time.Millisecond))
	l1.drain()
	l2.drain()
	t.Logf("drained %v after r1 stopped", time.Since(began).Round(time.Millisecond))
	l1.checkStored()
	l2.checkStored()
}
