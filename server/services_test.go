package server

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/topology"
)

// logService records its Start and Stop calls in a shared log.
type logService struct {
	name string
	log  *[]string
	mu   *sync.Mutex
}

func (s *logService) Start(context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.log = append(*s.log, "start "+s.name)
}

func (s *logService) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.log = append(*s.log, "stop "+s.name)
}

// Services start in order and stop in reverse order, once, however often
// Stop is called; none starts after Stop.
func TestServicesStopInReverseOrder(t *testing.T) {
	t.Parallel()
	var log []string
	var mu sync.Mutex
	mk := func(name string) *logService { return &logService{name: name, log: &log, mu: &mu} }
	var s services
	a, b, c := mk("a"), mk("b"), mk("c")
	s.start(t.Context(), a, b)
	s.start(t.Context(), c)
	s.Stop()
	s.Stop()
	s.start(t.Context(), mk("late"))
	want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}
	if !slices.Equal(log, want) {
		t.Fatalf("log %v, want %v", log, want)
	}
}

// A topology that could not be applied is applied again after the
// interval, unless a newer one arrived meanwhile; after Stop no retry
// runs.
func TestApplierRetriesOnlyTheNewest(t *testing.T) {
	t.Parallel()
	a := &applier{every: 10 * time.Millisecond}
	applied := make(chan *topology.Topology, 4)
	var apply func(ctx context.Context, top *topology.Topology)
	failOnce := map[*topology.Topology]bool{}
	apply = func(ctx context.Context, top *topology.Topology) {
		release, current := a.begin(top)
		defer release()
		if !current {
			applied <- nil // skipped: a newer one came
			return
		}
		if !failOnce[top] {
			failOnce[top] = true
			a.retryLater(ctx, top, apply)
			return
		}
		applied <- top
	}
	t1 := &topology.Topology{}
	apply(t.Context(), t1)
	if got := <-applied; got != t1 {
		t.Fatalf("retry applied %v, want t1", got)
	}

	// t2 fails; t3 arrives and applies before t2's retry: the retry
	// finds a newer topology and applies nothing.
	t2, t3 := &topology.Topology{}, &topology.Topology{}
	failOnce[t3] = true // t3 applies at once
	apply(t.Context(), t2)
	apply(t.Context(), t3)
	if got := <-applied; got != t3 {
		t.Fatalf("got %v, want t3 applied at once", got)
	}
	if got := <-applied; got != nil {
		t.Fatal("t2's retry applied an older topology after a newer one")
	}

	// After Stop a pending retry never runs.
	t4 := &topology.Topology{}
	a.mu.Lock()
	a.every = 20 * time.Millisecond
	a.mu.Unlock()
	apply(t.Context(), t4)
	a.Stop()
	a.Stop()
	select {
	case got := <-applied:
		t.Fatalf("a retry ran after Stop: %v", got)
	case <-time.After(200 * time.Millisecond): // ten retry intervals
	}
}
