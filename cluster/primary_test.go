package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/store"
)

// Every operation, whatever it is, goes through the call point's breaker:
// outages open it, then calls are refused without reaching the store, and
// the observer decorating it is told each call with its operation and
// outcome.
func TestDoGuardsEveryOperationAlike(t *testing.T) {
	t.Parallel()
	var obs opLog
	c := Observe(NewPrimary(nil, circuit.NewSet(circuit.Config{Failures: 2, OpenFor: time.Hour}).For("ep")), obs.observe)
	ran := 0
	outage := func(ctx context.Context, s Store) error {
		ran++
		return fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	for _, op := range []string{OpStats, OpRedrive} {
		if err := c.Do(context.Background(), op, outage); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("%s: %v", op, err)
		}
	}
	err := c.Do(context.Background(), OpProduce, outage)
	if !errors.Is(err, circuit.ErrOpen) || !errors.Is(err, store.ErrUnavailable) || ran != 2 {
		t.Fatalf("third call after two outages: %v (store reached %d times), want refused by the open breaker", err, ran)
	}
	for _, op := range []string{OpStats, OpRedrive, OpProduce} {
		if calls, failed := obs.counts(op); calls != 1 || failed != 1 {
			t.Errorf("observer saw %s %d times, %d failed; want 1, 1", op, calls, failed)
		}
	}
}

// An answer that is not an outage (not found, a constraint) is the
// endpoint working: it never opens the breaker.
func TestDoCountsOnlyOutagesAgainstTheEndpoint(t *testing.T) {
	t.Parallel()
	c := NewPrimary(nil, circuit.NewSet(circuit.Config{Failures: 1, OpenFor: time.Hour}).For("ep"))
	for range 3 {
		if err := c.Do(context.Background(), OpAck, func(context.Context, Store) error { return store.ErrNotFound }); !errors.Is(err, store.ErrNotFound) {
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
	set := circuit.NewSet(circuit.Config{})
	old, next := NewPrimary(named{name: "old"}, set.For("old")), NewPrimary(named{name: "new"}, set.For("new"))
	old.Retire(next)
	old.Retire(nil) // the first successor stays
	on := ""
	if err := old.Do(context.Background(), OpAck, func(_ context.Context, s Store) error { on = s.(named).name; return nil }); err != nil || on != "new" {
		t.Fatalf("call on a retired endpoint ran on %q: %v", on, err)
	}
	gone := NewPrimary(nil, set.For("gone"))
	gone.Retire(nil)
	if err := gone.Do(context.Background(), OpAck, func(context.Context, Store) error {
		t.Error("ran on an endpoint retired without successor")
		return nil
	}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("retired without successor: %v", err)
	}
}

// named is a store that is never called, told apart by its name.
type named struct {
	Store
	name string
}

// Retire hands an endpoint over (the failover's hand-over logic, with
// stores that are fakes): a call in flight on the old endpoint is
// cancelled and, when its error says the endpoint went away, runs once
// more on the successor; one that failed for another reason, whose
// caller gave up, or that has no successor is answered as it ended and
// never run again. A call waits on the signals of its fake, never on the
// clock.
func TestRetireHandsInFlightCallsToTheSuccessor(t *testing.T) {
	t.Parallel()
	outage := fmt.Errorf("%w: invalid connection", store.ErrUnavailable)
	tests := []struct {
		name string
		// The in-flight call on the old endpoint: held until its context
		// ends (a statement in a lock wait), then answering that; or
		// answering answer once the endpoint is retired.
		held          bool
		answer        error
		successor     bool
		callerGivesUp bool
		wantOn        []string // endpoints the call ran on, in order
		wantErr       error
	}{
		{name: "cancelled by the hand-over", held: true, successor: true, wantOn: []string{"old", "new"}},
		{name: "the connection went away", answer: outage, successor: true, wantOn: []string{"old", "new"}},
		{name: "an answer that is not an outage", answer: store.ErrNotFound, successor: true, wantOn: []string{"old"}, wantErr: store.ErrNotFound},
		{name: "done before the hand-over took effect", successor: true, wantOn: []string{"old"}},
		{name: "the caller gave up", held: true, callerGivesUp: true, successor: true, wantOn: []string{"old"}, wantErr: context.Canceled},
		{name: "no successor", held: true, wantOn: []string{"old"}, wantErr: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set := circuit.NewSet(circuit.Config{CallTimeout: time.Hour})
			old, next := NewPrimary(named{name: "old"}, set.For("old")), NewPrimary(named{name: "new"}, set.For("new"))
			ctx, giveUp := context.WithCancel(context.Background())
			defer giveUp()
			started, retired := make(chan struct{}), make(chan struct{})
			var on []string // written by the call's goroutine only, read after done
			done := make(chan error, 1)
			go func() {
				done <- old.Do(ctx, OpProduce, func(ctx context.Context, s Store) error {
					on = append(on, s.(named).name)
					if s.(named).name == "new" {
						return nil
					}
					close(started)
					<-retired
					if tt.held {
						<-ctx.Done()
						return ctx.Err()
					}
					return tt.answer
				})
			}()
			<-started
			if tt.callerGivesUp {
				giveUp()
			}
			if tt.successor {
				old.Retire(next)
			} else {
				old.Retire(nil)
			}
			close(retired)
			err := <-done
			if fmt.Sprint(on) != fmt.Sprint(tt.wantOn) {
				t.Fatalf("ran on %v, want %v (err %v)", on, tt.wantOn, err)
			}
			if (tt.wantErr == nil) != (err == nil) || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			// Later calls go to the successor, or fail unavailable without one.
			later := ""
			err = old.Do(context.Background(), OpAck, func(_ context.Context, s Store) error { later = s.(named).name; return nil })
			switch {
			case tt.successor && (err != nil || later != "new"):
				t.Fatalf("a later call ran on %q: %v", later, err)
			case !tt.successor && (!errors.Is(err, store.ErrUnavailable) || later != ""):
				t.Fatalf("a later call without successor ran on %q: %v", later, err)
			}
		})
	}
}
