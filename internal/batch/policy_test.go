package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testtime"
)

// it is a test item: a value, what it weighs against MaxItems and
// MaxBytes, and a class that Joins may keep apart.
type it struct{ v, count, size, class int }

// itGate is gate for it items: each batch blocks until released and is
// recorded as the values it carried.
type itGate struct {
	mu      sync.Mutex
	batches []string
	started chan int
	release chan struct{}
}

func newItGate() *itGate {
	return &itGate{started: make(chan int, 100), release: make(chan struct{}, 100)}
}

func (g *itGate) run(_ context.Context, items []it) []int {
	vs := make([]int, len(items))
	for i, x := range items {
		vs[i] = x.v
	}
	g.mu.Lock()
	g.batches = append(g.batches, fmt.Sprint(vs))
	g.mu.Unlock()
	g.started <- len(items)
	<-g.release
	out := make([]int, len(items))
	for i, x := range items {
		out[i] = x.v * 10
	}
	return out
}

// While a first item's batch runs, the items queued behind it are cut
// into batches by MaxItems (as Count weighs them), MaxBytes and Joins, in
// order; an item too heavy for any batch runs alone.
func TestBatchComposition(t *testing.T) {
	t.Parallel()
	byCount := Count(func(x it) int { return x.count })
	byClass := Joins(func(first, next it) bool { return first.class == next.class })
	for _, tc := range []struct {
		name   string
		cfg    Config
		opts   []Option[it]
		queued []it
		want   []string // batches after the first ([0])
	}{
		{"max items", Config{MaxItems: 2}, nil,
			[]it{{v: 1}, {v: 2}, {v: 3}, {v: 4}, {v: 5}}, []string{"[1 2]", "[3 4]", "[5]"}},
		{"counted items", Config{MaxItems: 10}, []Option[it]{byCount},
			[]it{{v: 1, count: 4}, {v: 2, count: 6}, {v: 3, count: 1}, {v: 4, count: 9}}, []string{"[1 2]", "[3 4]"}},
		{"heavier than a batch runs alone", Config{MaxItems: 10}, []Option[it]{byCount},
			[]it{{v: 1, count: 3}, {v: 2, count: 25}, {v: 3, count: 3}}, []string{"[1]", "[2]", "[3]"}},
		{"max bytes", Config{MaxItems: 100, MaxBytes: 10}, nil,
			[]it{{v: 1, size: 4}, {v: 2, size: 5}, {v: 3, size: 20}, {v: 4, size: 3}}, []string{"[1 2]", "[3]", "[4]"}},
		{"joins keeps order", Config{MaxItems: 100}, []Option[it]{byClass},
			[]it{{v: 1, class: 1}, {v: 2, class: 1}, {v: 3, class: 2}, {v: 4, class: 1}}, []string{"[1 2]", "[3]", "[4]"}},
		{"every limit at once", Config{MaxItems: 5, MaxBytes: 100}, []Option[it]{byCount, byClass},
			[]it{{v: 1, count: 2, size: 10}, {v: 2, count: 2, size: 10}, {v: 3, count: 2, size: 10}, {v: 4, count: 1, size: 95, class: 1}},
			[]string{"[1 2]", "[3]", "[4]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newItGate()
			b := New(tc.cfg, g.run, func(x it) int { return x.size }, tc.opts...)
			defer b.Stop()
			first, _ := b.Submit(it{v: 0})
			<-g.started
			var dones []<-chan int
			for _, x := range tc.queued {
				d, err := b.Enqueue(context.Background(), x)
				if err != nil {
					t.Fatal(err)
				}
				dones = append(dones, d)
			}
			for range len(tc.want) + 1 {
				g.release <- struct{}{}
			}
			<-first
			for i, d := range dones {
				if r := <-d; r != tc.queued[i].v*10 {
					t.Fatalf("item %d answered %d", tc.queued[i].v, r)
				}
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if got, want := fmt.Sprint(g.batches[1:]), fmt.Sprint(tc.want); got != want {
				t.Fatalf("batches %s, want %s", got, want)
			}
		})
	}
}

// Under Eager a further batch starts as soon as items wait; under
// WhenFull only while a full batch waits, and it gives way once the
// backlog no longer fills one.
func TestBatchInFlightPolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		extra   Policy
		queued  int // behind the first, with MaxItems 2 and InFlight 3
		running int // batches that start before any ends
	}{
		{"eager, one waiting", Eager, 1, 2},
		{"eager, many waiting", Eager, 5, 3},
		{"when full, one waiting", WhenFull, 1, 1},
		{"when full, a full batch waiting", WhenFull, 2, 2},
		{"when full, two full batches waiting", WhenFull, 4, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newItGate()
			b := New(Config{MaxItems: 2, InFlight: 3, Extra: tc.extra}, g.run, nil)
			defer b.Stop()
			b.Submit(it{v: 0})
			<-g.started
			for i := range tc.queued {
				b.Submit(it{v: i + 1})
			}
			for range tc.running - 1 {
				<-g.started
			}
			select {
			case n := <-g.started:
				t.Fatalf("another batch (of %d) started: more than %d at once", n, tc.running)
			case <-time.After(50 * time.Millisecond): // nothing else starts meanwhile
			}
			for range tc.queued + 1 {
				g.release <- struct{}{}
			}
		})
	}
}

// A quiet batcher never makes a lone item linger; a batch that begins
// with LingerAfter items queued, and the batch after it, linger, and a
// lingering batch runs as soon as it is full.
func TestBatchLingerAfter(t *testing.T) {
	t.Parallel()
	g := newItGate()
	b := New(Config{MaxItems: 4, Linger: time.Minute, LingerAfter: 2}, g.run, nil)
	t.Cleanup(b.Stop)
	quickly := func(want int) {
		t.Helper()
		select {
		case n := <-g.started:
			if n != want {
				t.Fatalf("batch of %d, want %d", n, want)
			}
		case <-time.After(30 * time.Second): // half the linger
			t.Fatal("a batch lingered")
		}
	}
	b.Submit(it{v: 1})
	quickly(1) // quiet: at once
	b.Submit(it{v: 2})
	b.Submit(it{v: 3})
	g.release <- struct{}{}
	// Begins with 2 queued: lingers until full.
	select {
	case n := <-g.started:
		t.Fatalf("a batch of %d started without lingering", n)
	case <-time.After(100 * time.Millisecond):
	}
	b.Submit(it{v: 4})
	b.Submit(it{v: 5})
	quickly(4)
	g.release <- struct{}{}
	// The batch after a busy one lingers too, even alone.
	b.Submit(it{v: 6})
	select {
	case n := <-g.started:
		t.Fatalf("the batch after a busy one started at once with %d", n)
	case <-time.After(100 * time.Millisecond):
	}
	for v := 7; v <= 9; v++ {
		b.Submit(it{v: v})
	}
	quickly(4)
	g.release <- struct{}{}
	// That one began with one item: quiet again.
	b.Submit(it{v: 10})
	quickly(1)
	g.release <- struct{}{}
}

// With MaxQueued items waiting, Enqueue blocks until one is taken, its
// context ends or the batcher stops; Stop runs everything queued first.
func TestBatchMaxQueuedAndStop(t *testing.T) {
	t.Parallel()
	g := newItGate()
	b := New(Config{MaxItems: 10, MaxQueued: 2}, g.run, nil)
	d0, _ := b.Submit(it{v: 0})
	<-g.started
	d1, _ := b.Submit(it{v: 1})
	d2, _ := b.Submit(it{v: 2})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Enqueue(ctx, it{v: 3}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("enqueue on a full queue: %v, want the context's deadline", err)
	}
	blocked := make(chan error, 1)
	go func() {
		_, err := b.Enqueue(context.Background(), it{v: 4})
		blocked <- err
	}()
	stopped := make(chan struct{})
	go func() { b.Stop(); close(stopped) }()
	if err := <-blocked; !errors.Is(err, ErrStopped) {
		t.Fatalf("enqueue blocked at stop: %v, want ErrStopped", err)
	}
	g.release <- struct{}{}
	if n := <-g.started; n != 2 {
		t.Fatalf("the drain ran %d items, want the 2 queued", n)
	}
	select {
	case <-stopped:
		t.Fatal("Stop returned with a batch running")
	default:
	}
	g.release <- struct{}{}
	<-stopped
	if <-d0 != 0 || <-d1 != 10 || <-d2 != 20 {
		t.Fatal("queued items not answered")
	}
	if _, err := b.Enqueue(context.Background(), it{v: 5}); !errors.Is(err, ErrStopped) {
		t.Fatalf("after Stop: %v", err)
	}
	if runs, items := b.Stats(); runs != 2 || items != 3 {
		t.Fatalf("stats: %d runs, %d items", runs, items)
	}
}

// A group batches each key apart, forgets a key once nothing of it waits
// or runs, and drains every key on Stop.
func TestGroup(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	got := map[string][]string{}
	hold := make(chan struct{})
	started := make(chan string, 10)
	gr := NewGroup(Config{}, func(_ context.Context, k string, items []int) []int {
		mu.Lock()
		got[k] = append(got[k], fmt.Sprint(items))
		mu.Unlock()
		started <- k
		<-hold
		return items
	}, nil)
	a0, _ := gr.Enqueue(context.Background(), "a", 0)
	b0, _ := gr.Enqueue(context.Background(), "b", 0)
	<-started
	<-started
	var dones []<-chan int
	for i := 1; i <= 3; i++ {
		d, err := gr.Enqueue(context.Background(), "a", i)
		if err != nil {
			t.Fatal(err)
		}
		dones = append(dones, d)
	}
	if n := gr.Len(); n != 2 {
		t.Fatalf("%d keys busy, want 2", n)
	}
	close(hold)
	<-a0
	<-b0
	for _, d := range dones {
		<-d
	}
	testtime.UntilState(t, "no key left with nothing to do", func() (bool, string) {
		n := gr.Len()
		return n == 0, fmt.Sprint(n, " keys")
	})
	mu.Lock()
	if fmt.Sprint(got["a"]) != "[[0] [1 2 3]]" || fmt.Sprint(got["b"]) != "[[0]]" {
		t.Fatalf("batches %v", got)
	}
	mu.Unlock()
	if r := gr.Runs(); r != 3 {
		t.Fatalf("%d runs, want 3", r)
	}
	gr.Stop()
	gr.Stop()
	if _, err := gr.Do(context.Background(), "a", 9); !errors.Is(err, ErrStopped) {
		t.Fatalf("after Stop: %v", err)
	}
}
