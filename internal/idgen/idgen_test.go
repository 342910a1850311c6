package idgen

import (
	"testing"
	"time"
)

func TestNextGrowsAndEncodesTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	g := New(func() time.Time { return at })
	prev := uint64(0)
	for i := 0; i < 10000; i++ { // more than one millisecond's worth of sequence
		id := g.Next()
		if id <= prev {
			t.Fatalf("id %d not greater than %d", id, prev)
		}
		prev = id
	}
	first := New(func() time.Time { return at }).Next()
	if got := Time(first); !got.Equal(at) {
		t.Fatalf("Time = %v, want %v", got, at)
	}
	if got := Time(prev); got.Sub(at) != 2*time.Millisecond {
		t.Fatalf("after 10000 ids the clock ran ahead by %v, want 2ms", got.Sub(at))
	}
}

func TestClockStepBackStillGrows(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := New(func() time.Time { return at })
	a := g.Next()
	at = at.Add(-time.Second)
	if b := g.Next(); b <= a {
		t.Fatalf("id went back after a clock step: %d <= %d", b, a)
	}
}
