package partition

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
	"time"
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
	st, body := w.call("POST", r.url+"/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 256, "to": 511, "target": "c2"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	var state string
	w.waitFor(2*time.Minute, "the job reaching its freeze", func() bool {
		_, j := w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		state, _ = j["state"].(string)
		return state == "freezing" || state == "frozen" || state == "cutover" || state == "cleanup" || state == "done"
	})
	if state == "cleanup" || state == "done" {
		t.Fatalf("the job went past its cut-over (%s) before the kill", state)
	}
	r.kill()
	t.Logf("router killed with the job in state %s", state)
	time.Sleep(time.Second)
	r.start()
	w.waitFor(2*time.Minute, "the job ending", func() bool {
		_, j := w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		state, _ = j["state"].(string)
		return state == "done" || state == "failed" || state == "aborted"
	})
	if state != "done" {
		_, j := w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		t.Fatalf("job after the restart: %v", j)
	}
	time.Sleep(2 * time.Second) // load after the move
	l.Stop()
	stopped = true
	l.settle(time.Minute)
	l.drain()
	l.checkStored()
}
