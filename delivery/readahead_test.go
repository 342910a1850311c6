package delivery

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shardmq/shardmq/store"
)

// A claim routed with the map before a freeze gives back, after a claim
// routed with the freezing map re-read what was ahead, candidates on the
// frozen vshard: giveBack puts them into o.ahead, which is labelled with
// the new Exclude, and the next claim hands them out from there (after
// the freeze's WriteOut: a lease in memory the cut-over never sees).
func TestReadAheadNeverHandsOutAnExcludedVShard(t *testing.T) {
	ctx := context.Background()
	b := newBed(t, Config{})
	all := b.fill(20)
	o := b.take(t)
	old := spec("a") // routed with the map before the freeze
	cs, err := o.Reserve(ctx, 5, old)
	if err != nil || len(cs) != 5 {
		t.Fatalf("reserve: %v, %v", cs, err)
	}
	frozen := b.table.get(all[2], "s").msg.VShard
	nw := spec("b") // routed with the map that freezes all[2]'s vshard
	nw.Exclude = []uint16{frozen}
	b.claim(t, 5, nw)
	// The old claim takes two and gives the rest back, as a claim over
	// two clusters does.
	o.Release(cs[2:])
	if _, err := o.Take(ctx, cs[:2], old, 0, true, size); err != nil {
		t.Fatal(err)
	}
	// (The freeze's WriteOut runs here: no lease on the frozen vshard.)
	for _, c := range b.claim(t, 5, nw) {
		if slices.Contains(nw.Exclude, c.Message.VShard) {
			t.Fatalf("message %d on excluded vshard %d handed out from what was read ahead", c.Message.ID, c.Message.VShard)
		}
	}
}

// A claim gives back candidates while a read from the head is on its way:
// giveBack puts them into the empty o.ahead, and the scan then appends
// what it read from the head behind them, so o.ahead is no longer in
// claim order: a priority-9 delivery read by that scan is handed out
// after priority-0 ones.
func TestReadAheadKeepsClaimOrderWhenAGiveBackRacesAReadFromTheHead(t *testing.T) {
	ctx := context.Background()
	b := newBed(t, Config{})
	all := b.fill(30)
	o := b.take(t)
	if _, err := o.Reserve(ctx, 5, spec("y")); err != nil { // all[0:5], the rest read ahead
		t.Fatal(err)
	}
	z, err := o.Reserve(ctx, 5, spec("z")) // all[5:10], from what was read ahead
	if err != nil || !slices.Equal(candIDs(z), all[5:10]) {
		t.Fatalf("reserve from ahead: %v, %v", candIDs(z), err)
	}
	var urgent []uint64
	for range 3 {
		urgent = append(urgent, b.table.add("t", "s", 9, "", 0))
	}
	b.tick(100 * time.Millisecond)
	b.table.mu.Lock()
	b.table.onScan = func() { o.Release(z) } // z gives back while w reads from the head
	b.table.mu.Unlock()
	if w, err := o.Reserve(ctx, 1, spec("w")); err != nil || !slices.Equal(candIDs(w), urgent[:1]) {
		t.Fatalf("read from the head: %v, %v", candIDs(w), err)
	}
	next, err := o.Reserve(ctx, 1, spec("v"))
	if err != nil || !slices.Equal(candIDs(next), urgent[1:2]) {
		t.Fatalf("next claim reserved %v, want %v (priority 9, read by the last scan) before priority 0", candIDs(next), urgent[1:2])
	}
}

func candIDs(cs []store.Candidate) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.MessageID)
	}
	return out
}
