package partition

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

// Must-show (c) of issue 26 on the test hosts: the only router (static
// topology file) is killed with SIGKILL while its job cleans up the
// source, and started again on the file of before the move (version 1, as
// a restored backup or a regenerated sandbox has it). It refuses to start,
// naming both versions, and the source keeps every row of the moved
// vshards it held at the kill. Started on the file the job wrote, it
// finishes the cleanup; every acknowledged key is stored once with its id,
// every message consumed once.
func TestRouterKilledInCleanupRefusesOlderMap(t *testing.T) {
	testbed.Need(t)
	w := newWorld(t, "r1")
	before, err := os.ReadFile(w.topo)
	if err != nil {
		t.Fatal(err)
	}
	// Deletes at 500 rows/s: the cleanup lasts seconds, and the kill
	// lands inside it.
	r := w.startRouter("r1", "-reshard-rows-per-second", "500", "-reshard-batch-rows", "100")
	l := w.newLoad(r.url, "pz", nil)
	l.start(2, 5, 50*time.Millisecond, 1)
	stopped := false
	defer func() {
		if !stopped {
			l.Stop()
		}
	}()
	time.Sleep(3 * time.Second)
	id := w.submitMove(r)
	var state string
	state = jobState(w.waitJob(r, id, 2*time.Minute, "the job reaching its cleanup", stateIn("cleanup", "done", "failed", "aborted")))
	if state != "cleanup" {
		w.fatalf("the job went to %s before the kill", state)
	}
	r.kill()
	l.Stop()
	stopped = true
	held := w.rows("c1", 256, 511)
	t.Logf("router killed in cleanup; c1 still holds %v of vshards 256–511", held)
	if held["message_store"] == 0 {
		t.Fatal("no source rows left to protect: the kill came after the cleanup's deletes")
	}
	resharded, err := os.ReadFile(w.topo)
	if err != nil {
		t.Fatal(err)
	}
	if string(resharded) == string(before) {
		t.Fatal("the job in cleanup did not write its map to the topology file")
	}

	// Started again on the file of before the move: refused.
	if err := os.WriteFile(w.topo, before, 0o644); err != nil {
		t.Fatal(err)
	}
	out := r.startRefused(time.Minute)
	for _, want := range []string{"version 1 ", "put back the file"} {
		if !strings.Contains(out, want) {
			w.errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if now := w.rows("c1", 256, 511); now["message_store"] != held["message_store"] || now["message_key"] != held["message_key"] {
		w.fatalf("source rows of the moved vshards: %v after the refused start, %v at the kill", now, held)
	}

	// On the file the job wrote the router starts and the job finishes.
	if err := os.WriteFile(w.topo, resharded, 0o644); err != nil {
		t.Fatal(err)
	}
	r.start()
	state = jobState(w.waitJob(r, id, 2*time.Minute, "the job ending after the restart", stateIn("done", "failed", "aborted")))
	if state != "done" {
		_, j := w.call("GET", r.url+"/v1/admin/reshard/"+id, nil)
		w.fatalf("job after the restart: %v", j)
	}
	if left := w.rows("c1", 256, 511); left["message_store"] != 0 || left["message_key"] != 0 {
		w.fatalf("after the resumed cleanup c1 keeps %v", left)
	}
	l.settle(time.Minute)
	l.drain()
	l.checkStored()
}

// rows counts the rows of vshards from–to in each table a reshard moves,
// on cluster's primary.
func (w *world) rows(cluster string, from, to int) map[string]int {
	w.t.Helper()
	out := map[string]int{}
	for _, tb := range store.MoveTables() {
		var n int
		if err := w.checks[cluster].QueryRowContext(w.ctx, "SELECT COUNT(*) FROM "+tb.Name+" WHERE vshard BETWEEN ? AND ?", from, to).Scan(&n); err != nil {
			w.t.Fatal(err)
		}
		out[tb.Name] = n
	}
	return out
}

// startRefused runs the router with its arguments and wants it to exit
// with an error within d, as a router refusing its configuration does; it
// returns what the router printed.
func (r *router) startRefused(d time.Duration) string {
	t := r.w.t
	t.Helper()
	ctx, cancel := context.WithTimeout(r.w.ctx, d)
	defer cancel()
	cmd := r.host.Command(ctx, routerBinary(t), r.args...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		r.w.fatalf("router %s still ran %v after its start; it should have refused:\n%s", r.host.Name, d, out)
	}
	if err == nil {
		r.w.fatalf("router %s exited with status 0; it should have refused:\n%s", r.host.Name, out)
	}
	t.Logf("router %s refused to start (%v): %s", r.host.Name, err, strings.TrimSpace(lastLine(string(out))))
	return string(out)
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
