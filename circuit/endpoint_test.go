package circuit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardmq/shardmq/store"
)

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
