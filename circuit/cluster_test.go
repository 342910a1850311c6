package circuit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

// Every operation, whatever it is, goes through the call point's breaker:
// outages open it, then calls are refused without reaching the store, and
// the observer is told each call with its operation and outcome.
func TestDoGuardsEveryOperationAlike(t *testing.T) {
	t.Parallel()
	var obs opLog
	c := NewCluster(nil, NewSet(Config{Failures: 2, OpenFor: time.Hour}).For("ep"), obs.observe)
	ran := 0
	outage := func(ctx context.Context, s broker.Store) error {
		ran++
		return fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	for _, op := range []string{broker.OpStats, broker.OpRedrive} {
		if err := c.Do(context.Background(), op, outage); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("%s: %v", op, err)
		}
	}
	err := c.Do(context.Background(), broker.OpProduce, outage)
	if !errors.Is(err, ErrOpen) || !errors.Is(err, store.ErrUnavailable) || ran != 2 {
		t.Fatalf("third call after two outages: %v (store reached %d times), want refused by the open breaker", err, ran)
	}
	for _, op := range []string{broker.OpStats, broker.OpRedrive, broker.OpProduce} {
		if calls, failed := obs.counts(op); calls != 1 || failed != 1 {
			t.Errorf("observer saw %s %d times, %d failed; want 1, 1", op, calls, failed)
		}
	}
}

// An answer that is not an outage (not found, a constraint) is the
// endpoint working: it never opens the breaker.
func TestDoCountsOnlyOutagesAgainstTheEndpoint(t *testing.T) {
	t.Parallel()
	c := NewCluster(nil, NewSet(Config{Failures: 1, OpenFor: time.Hour}).For("ep"), nil)
	for range 3 {
		if err := c.Do(context.Background(), broker.OpAck, func(context.Context, broker.Store) error { return store.ErrNotFound }); !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
	}
	if st := c.Breaker().State(); st != "closed" {
		t.Fatalf("breaker %s after answers that are not outages", st)
	}
}

// A call on a retired endpoint goes to its successor; with none it fails
// unavailable without running.
func TestDoOnRetiredEndpointGoesToTheSuccessor(t *testing.T) {
	t.Parallel()
	set := NewSet(Config{})
	old, next := NewCluster(named{name: "old"}, set.For("old"), nil), NewCluster(named{name: "new"}, set.For("new"), nil)
	old.Retire(next)
	old.Retire(nil) // the first successor stays
	on := ""
	if err := old.Do(context.Background(), broker.OpAck, func(_ context.Context, s broker.Store) error { on = s.(named).name; return nil }); err != nil || on != "new" {
		t.Fatalf("call on a retired endpoint ran on %q: %v", on, err)
	}
	gone := NewCluster(nil, set.For("gone"), nil)
	gone.Retire(nil)
	if err := gone.Do(context.Background(), broker.OpAck, func(context.Context, broker.Store) error {
		t.Error("ran on an endpoint retired without successor")
		return nil
	}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("retired without successor: %v", err)
	}
}

// An Endpoint's call is bounded by its own Timeout, and its timeout is an
// outage of the endpoint.
func TestEndpointBoundsEachCall(t *testing.T) {
	t.Parallel()
	e := Endpoint[string]{S: "replica", Breaker: NewSet(Config{CallTimeout: time.Hour}).For("r"), Timeout: 20 * time.Millisecond}
	began := time.Now()
	err := e.Do(context.Background(), func(ctx context.Context, s string) error {
		if s != "replica" {
			t.Errorf("ran on %q", s)
		}
		<-ctx.Done() // a hung endpoint
		return ctx.Err()
	})
	if !errors.Is(err, store.ErrUnavailable) || time.Since(began) > 10*time.Second {
		t.Fatalf("hung call: %v after %v", err, time.Since(began))
	}
	if s := e.Breaker.cb.Counts().ConsecutiveFailures; s != 1 {
		t.Fatalf("the timeout counted %d failures, want 1", s)
	}
}

// named is a store that is never called, told apart by its name.
type named struct {
	broker.Store
	name string
}
