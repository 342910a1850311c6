//go:build !race

package delivery

import (
	"runtime"
	"testing"
	"time"
)

// TestMemoryPerLease measures what a lease held in memory costs (the
// figure docs/consume.md gives for -max-leases): heap growth over 20,000
// leases, bodies excluded (an owner keeps none).
func TestMemoryPerLease(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	b := newBed(t, Config{})
	const n = 20000
	for range n {
		b.table.add("t", "s", 0, "order-key-12345", 0)
	}
	b.claim(t, 1, spec("warm-up")) // takes the unit
	o := b.owner(t)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sp := spec("consumer-7")
	sp.Lease = time.Hour
	got := 1
	for got < n {
		c := b.claim(t, 1000, sp)
		if len(c) == 0 {
			t.Fatalf("claimed %d of %d", got, n)
		}
		got += len(c)
	}
	// Drop what the claims returned (bodies live in the table's fake,
	// not in the owner) before measuring.
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per lease held in memory (%d leases)", per, o.InFlight())
	if o.InFlight() != n {
		t.Fatalf("%d leases held, want %d", o.InFlight(), n)
	}
	if per > 400 {
		t.Fatalf("%.0f bytes per lease, docs/consume.md says about 230", per)
	}
}
