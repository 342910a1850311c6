package partition

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

// The leader (here the only router, on the static topology) is killed
// with SIGKILL in the middle of a cut-over — the vshards frozen, their
// deliveries being copied — while a load of known keys runs through it,
// and started again on the same topology: the job resumes where it was
// recorded and finishes, and every acknowledged key is stored once, every
// message consumed once.
func TestLeaderKilledInCutover(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1")
	r := w.startRouter("r1", "-reshard-rows-per-second", "2000")
	l := w.newLoad(r.url, "pk", nil)
	l.start(2, 5, 50*time.Millisecond, 2)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	time.Sleep(3 * time.Second)
	id := w.submitMove(r)
	var state string
	state = jobState(w.waitJob(r, id, 2*time.Minute, "the job reaching its freeze", stateIn("freezing", "frozen", "cutover", "cleanup", "done")))
	if state == "cleanup" || state == "done" {
		w.fatalf("the job went past its cut-over (%s) before the kill", state)
	}
	r.kill()
	t.Logf("router killed with the job in state %s", state)
	time.Sleep(time.Second)
	r.start()
	state = jobState(w.waitJob(r, id, 2*time.Minute, "the job ending", stateIn("done", "failed", "aborted")))
	if state != "done" {
		_, j := w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		w.fatalf("job after the restart: %v", j)
	}
	time.Sleep(2 * time.Second) // load after the move
	l.Stop()
	stopped = true
	l.settle(time.Minute)
	l.drain()
	l.checkStored()
}

// Must-show (d) of issue 26 on the test hosts: two routers on Consul; r1
// leads and runs a move of 256–511 to c2, and is stopped with SIGSTOP
// once the job holds the range frozen (its final sync under way on the
// clusters) while a load runs through r2. r1's
// registration and leadership expire, r2 leads, ends r1's connections and
// finishes the cut-over: a key of the range is writable again through r2
// within 30 s of the stop. r1 is woken after the job ended; every key
// acknowledged through r2 is stored once, every message consumed once.
func TestLeaderStoppedInCutover(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1", "r2")
	w.onConsul("r1", "r2")
	r1 := w.startRouter("r1", "-reshard-rows-per-second", "2000")
	w.waitFor(time.Minute, "r1 leading", func() bool {
		data, _ := os.ReadFile(r1.log)
		return strings.Contains(string(data), `msg="reshard: leading"`)
	})
	r2 := w.startRouter("r2", "-reshard-rows-per-second", "2000")
	l := w.newLoad(r2.url, "ps", nil)
	l.start(2, 5, 50*time.Millisecond, 1)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	time.Sleep(3 * time.Second)
	id := w.submitMove(r2)
	var state string
	// Stopped once every router holds the range frozen (state frozen: the
	// final sync under freeze, then the cut-over), so that no write of it
	// passes until a leader finishes the cut-over.
	state = jobState(w.waitJob(r2, id, 2*time.Minute, "the job holding the range frozen", stateIn("frozen", "cutover", "cleanup", "done", "failed")))
	if state != "frozen" && state != "cutover" {
		w.fatalf("the job went to %s before the stop", state)
	}
	r1.signal(syscall.SIGSTOP)
	stoppedAt := time.Now()
	t.Logf("leader r1 stopped with the job in state %s", state)

	// A key of the moving range, written through r2 until it is created.
	key := ""
	for i := 0; key == ""; i++ {
		if v := shard.Of(fmt.Sprint("probe-", i)); v >= 256 && v <= 511 {
			key = fmt.Sprint("probe-", i)
		}
	}
	probe := w.newLoad(r2.url, "ps-probe", nil)
	w.waitFor(time.Minute, "the range writable through r2", func() bool {
		probe.produce([]string{key})
		probe.mu.Lock()
		defer probe.mu.Unlock()
		_, ok := probe.acked[key]
		return ok
	})
	took := time.Since(stoppedAt)
	t.Logf("range 256–511 writable again %v after the leader stopped", took.Round(time.Millisecond))
	if took > 30*time.Second {
		w.errorf("range writable again only %v after the leader stopped, want within 30 s", took.Round(time.Millisecond))
	}
	state = jobState(w.waitJob(r2, id, 2*time.Minute, "the job ending", stateIn("done", "failed", "aborted")))
	if state != "done" {
		_, j := w.call("GET", r2.url+"/v1/admin/reshard/"+id, nil)
		w.fatalf("job after the leader stopped: %v", j)
	}
	r1.signal(syscall.SIGCONT)
	time.Sleep(3 * time.Second) // r1 awake: what it had in flight must not land
	l.Stop()
	stopped = true
	l.settle(time.Minute)
	l.drain()
	l.checkStored()
	if got := w.rows("c1", 256, 511); got["message_store"] != 0 {
		w.errorf("c1 keeps %v of the moved range after the job", got)
	}
}
