package subscription

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// slowStore is a fakeStore whose writes take a while, so that concurrent
// creations overlap.
type slowStore struct{ *fakeStore }

func (s slowStore) Put(ctx context.Context, sub Subscription) error {
	time.Sleep(5 * time.Millisecond) // overlap, not an assertion
	return s.fakeStore.Put(ctx, sub)
}

// Concurrent creations never pass a cap together: the subscriptions of a
// topic, the topics, and the topics of one creator.
func TestCapsHoldForConcurrentCreations(t *testing.T) {
	t.Parallel()
	run := func(n int, fn func(i int) error) map[string]int {
		out := map[string]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := fn(i)
				k := "ok"
				switch {
				case errors.Is(err, ErrTooManySubscriptions):
					k = "subs"
				case errors.Is(err, ErrTooManyTopics):
					k = "topics"
				case err != nil:
					k = err.Error()
				}
				mu.Lock()
				out[k]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		return out
	}
	ctx := context.Background()
	r := NewRegistry(slowStore{newFakeStore()}, time.Hour, nil, nil)
	r.SetLimits(Limits{MaxPerTopic: 32, MaxTopics: 10, MaxTopicsPerCreator: 2})
	if got := run(45, func(i int) error {
		_, _, err := r.Put(ctx, Subscription{Topic: "t", Name: fmt.Sprint("s", i)})
		return err
	}); got["ok"] != 32 || got["subs"] != 13 {
		t.Fatalf("45 at once under a cap of 32: %v", got)
	}
	if got := run(6, func(i int) error {
		_, err := r.ForProduce(WithCreator(ctx, "p"), fmt.Sprint("p.", i))
		return err
	}); got["ok"] != 2 || got["topics"] != 4 {
		t.Fatalf("6 topics at once by a creator with a quota of 2: %v", got)
	}
	if got := run(20, func(i int) error {
		_, err := r.ForProduce(ctx, fmt.Sprint("x.", i))
		return err
	}); got["ok"] != 10-3 || got["topics"] != 13 {
		t.Fatalf("20 topics at once with room for 7: %v", got)
	}
}
