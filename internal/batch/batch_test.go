package batch

import (
	"context"
	"sync"
	"testing"
	"time"
)

// gate is a run function that blocks each batch until released, recording
// what it got.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	started chan int // len of each batch as it starts
	release chan struct{}
}

func newGate() *gate { return &gate{started: make(chan int, 100), release: make(chan struct{}, 100)} }

func (g *gate) run(_ context.Context, items []int) []int {
	g.mu.Lock()
	g.batches = append(g.batches, append([]int(nil), items...))
	g.mu.Unlock()
	g.started <- len(items)
	<-g.release
	out := make([]int, len(items))
	for i, v := range items {
		out[i] = v * 10
	}
	return out
}

func TestBatcherStartsAtOnceAndCoalescesWhileRunning(t *testing.T) {
	g := newGate()
	b := New[int, int](Config{MaxItems: 3}, g.run, nil)
	first, _ := b.Submit(1)
	if n := <-g.started; n != 1 {
		t.Fatalf("first batch has %d items, want 1 (an item alone starts at once)", n)
	}
	var dones []<-chan int
	for i := 2; i <= 6; i++ {
		d, ok := b.Submit(i)
		if !ok {
			t.Fatal("refused before Stop")
		}
		dones = append(dones, d)
	}
	g.release <- struct{}{}
	if r := <-first; r != 10 {
		t.Fatalf("answer %d, want 10", r)
	}
	if n := <-g.started; n != 3 {
		t.Fatalf("second batch has %d items, want 3 (MaxItems)", n)
	}
	g.release <- struct{}{}
	if n := <-g.started; n != 2 {
		t.Fatalf("third batch has %d items, want 2", n)
	}
	g.release <- struct{}{}
	for i, d := range dones {
		if r := <-d; r != (i+2)*10 {
			t.Fatalf("item %d answered %d", i+2, r)
		}
	}
	b.Stop()
}

func TestBatcherMaxBytesAndOversizeItem(t *testing.T) {
	g := newGate()
	b := New[int, int](Config{MaxItems: 100, MaxBytes: 10}, g.run, func(v int) int { return v })
	d0, _ := b.Submit(1)
	<-g.started
	var dones []<-chan int
	for _, v := range []int{4, 5, 20, 3} {
		d, _ := b.Submit(v)
		dones = append(dones, d)
	}
	g.release <- struct{}{}
	<-d0
	for _, want := range []int{2, 1, 1} { // [4 5] [20] [3]
		if n := <-g.started; n != want {
			t.Fatalf("batch of %d, want %d", n, want)
		}
		g.release <- struct{}{}
	}
	for _, d := range dones {
		<-d
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if got := g.batches[2]; len(got) != 1 || got[0] != 20 {
		t.Fatalf("oversize item ran as %v, want alone", got)
	}
	b.Stop()
}

func TestBatcherInFlight(t *testing.T) {
	g := newGate()
	b := New[int, int](Config{MaxItems: 1, InFlight: 2}, g.run, nil)
	for i := range 3 {
		b.Submit(i)
	}
	<-g.started
	<-g.started
	select {
	case <-g.started:
		t.Fatal("a third batch ran with InFlight 2")
	default:
	}
	for range 3 {
		g.release <- struct{}{}
	}
	<-g.started
	b.Stop()
}

func TestBatcherStopRunsQueuedAndRefusesNew(t *testing.T) {
	g := newGate()
	b := New[int, int](Config{}, g.run, nil)
	d1, _ := b.Submit(1)
	<-g.started
	d2, _ := b.Submit(2)
	stopped := make(chan struct{})
	go func() { b.Stop(); close(stopped) }()
	g.release <- struct{}{}
	<-g.started
	select {
	case <-stopped:
		t.Fatal("Stop returned with a batch running")
	default:
	}
	g.release <- struct{}{}
	<-stopped
	if <-d1 != 10 || <-d2 != 20 {
		t.Fatal("queued items not answered")
	}
	if _, ok := b.Submit(3); ok {
		t.Fatal("Submit accepted after Stop")
	}
	if _, err := b.Do(context.Background(), 3); err != ErrStopped {
		t.Fatalf("Do after Stop: %v", err)
	}
	b.Stop()
}

func TestBatcherDoHonoursContext(t *testing.T) {
	g := newGate()
	b := New[int, int](Config{}, g.run, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := b.Do(ctx, 1); errc <- err }()
	<-g.started
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Do: %v, want context.Canceled", err)
	}
	g.release <- struct{}{}
	b.Stop()
	if runs, items := b.Stats(); runs != 1 || items != 1 {
		t.Fatalf("stats %d runs %d items", runs, items)
	}
}

func TestBatcherLinger(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	b := New[int, int](Config{Linger: 50 * time.Millisecond}, func(_ context.Context, items []int) []int {
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		return make([]int, len(items))
	}, nil)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() { b.Do(context.Background(), i) })
	}
	wg.Wait()
	b.Stop()
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, s := range sizes {
		total += s
	}
	if total != 5 {
		t.Fatalf("ran %d items", total)
	}
}
