package loadtest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when told to, or when the pacer
// sleeps (the sleep jumps to its end).
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.Advance(d)
	}
	return ctx.Err()
}

func fakePacer(rate float64, length time.Duration) (*Pacer, *fakeClock) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &fakeClock{now: start}
	p := NewPacer(rate, start, start.Add(length))
	p.now, p.sleep = c.Now, c.sleep
	return p, c
}

func TestPacerSchedulesSlotsEvenly(t *testing.T) {
	t.Parallel()
	p, c := fakePacer(1000, time.Second)
	start := c.Now()
	for n := range 1000 {
		at, ok := p.Next(context.Background())
		if !ok {
			t.Fatalf("slot %d refused before the end", n)
		}
		if want := start.Add(time.Duration(n) * time.Millisecond); !at.Equal(want) {
			t.Fatalf("slot %d intended at %v, want %v", n, at.Sub(start), want.Sub(start))
		}
		if !c.Now().Equal(at) {
			t.Fatalf("slot %d returned at %v, before its time %v", n, c.Now().Sub(start), at.Sub(start))
		}
	}
	if _, ok := p.Next(context.Background()); ok {
		t.Fatal("a slot at the end was handed out")
	}
	if got := p.Taken(); got < 1000 || got > 1001 {
		t.Fatalf("taken %d, want 1000", got)
	}
}

// A worker that comes back late gets the slots it missed at once, with
// their intended times in the past: the latency measured from them
// includes the stall (no coordinated omission).
func TestPacerLateWorkerGetsPastSlots(t *testing.T) {
	t.Parallel()
	p, c := fakePacer(100, 10*time.Second) // a slot every 10 ms
	start := c.Now()
	if _, ok := p.Next(context.Background()); !ok {
		t.Fatal("first slot refused")
	}
	c.Advance(500 * time.Millisecond) // the request took 500 ms
	if got := p.Behind(); got != 50 {
		t.Fatalf("behind %d slots after a 500 ms stall, want 50", got)
	}
	at, ok := p.Next(context.Background())
	if !ok {
		t.Fatal("slot refused")
	}
	if want := start.Add(10 * time.Millisecond); !at.Equal(want) {
		t.Fatalf("late slot intended at %v, want %v", at.Sub(start), want.Sub(start))
	}
	if lat := c.Now().Sub(at); lat != 490*time.Millisecond {
		t.Fatalf("latency from the intended time %v, want 490ms", lat)
	}
}

func TestPacerStopsAtEndEvenWhenBehind(t *testing.T) {
	t.Parallel()
	p, c := fakePacer(1000, time.Second)
	p.Next(context.Background())
	c.Advance(2 * time.Second)
	if _, ok := p.Next(context.Background()); ok {
		t.Fatal("a slot due before the end was sent after it")
	}
	if got := p.Behind(); got != 999 {
		t.Fatalf("behind %d at the end, want 999 never sent", got)
	}
}

func TestPacerClosedLoop(t *testing.T) {
	t.Parallel()
	p, c := fakePacer(0, time.Second)
	for range 4 { // at 0, 0.3, 0.6 and 0.9 s
		at, ok := p.Next(context.Background())
		if !ok || !at.Equal(c.Now()) {
			t.Fatalf("closed loop: got %v %v, want now and ok", at, ok)
		}
		c.Advance(300 * time.Millisecond)
		if p.Behind() != 0 {
			t.Fatal("closed loop is never behind")
		}
	}
	if _, ok := p.Next(context.Background()); ok {
		t.Fatal("closed loop ran past the end")
	}
}

func TestPacerCancelled(t *testing.T) {
	t.Parallel()
	p, _ := fakePacer(10, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := p.Next(ctx); ok {
		t.Fatal("slot handed out on a cancelled context")
	}
}

// With real time and several workers, the achieved rate is the target.
func TestPacerRealRate(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p := NewPacer(2000, start, start.Add(300*time.Millisecond))
	var mu sync.Mutex
	var sent int
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, ok := p.Next(context.Background()); !ok {
					return
				}
				mu.Lock()
				sent++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Never more than the schedule; fewer only if the machine stalls
	// the workers past the end.
	if sent < 300 || sent > 600 {
		t.Fatalf("sent %d in 300 ms at 2000/s, want about 600", sent)
	}
}
