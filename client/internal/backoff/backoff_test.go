package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The schedule doubles from Initial and stops at Max.
func TestWaitDoublesUpToMax(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 100, 200, 400, 800, 1000, 1000}
	for n, w := range want {
		if got := p.Wait(n); got != w*time.Millisecond {
			t.Errorf("Wait(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
	if got := p.Wait(1 << 20); got != time.Second {
		t.Errorf("Wait(huge) = %v, want the cap", got)
	}
	if got := (Policy{Initial: time.Second, Max: time.Millisecond}).Wait(1); got != time.Millisecond {
		t.Errorf("Max below Initial: Wait(1) = %v, want Max", got)
	}
}

// Jitter keeps every wait within its fraction of the schedule, and does
// move it.
func TestJitterStaysWithinItsFraction(t *testing.T) {
	t.Parallel()
	p := Policy{Initial: time.Second, Max: 8 * time.Second, Jitter: 0.2}
	seen := map[time.Duration]bool{}
	for range 1000 {
		for n := 1; n <= 5; n++ {
			base := (Policy{Initial: p.Initial, Max: p.Max}).Wait(n)
			got := p.Wait(n)
			if lo, hi := base*8/10, base*12/10; got < lo || got > hi {
				t.Fatalf("Wait(%d) = %v, outside [%v, %v]", n, got, lo, hi)
			}
			seen[got] = true
		}
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct waits: no jitter", len(seen))
	}
}

// Sleep ends with the context.
func TestSleepEndsWithTheContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep with an ended context: %v", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep that runs out: %v", err)
	}
}
