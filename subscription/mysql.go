package subscription

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardmq/shardmq/store"
)

// MySQLStore keeps subscriptions in the subscription table of every
// cluster's primary (the static topology's home for them). A write goes to
// every primary and succeeds only when all took it; a read merges all
// primaries, the highest version of each subscription winning, so a cluster
// that missed a write (or was added later) is outvoted, and a delete's
// tombstone outvotes older copies.
type MySQLStore struct {
	// Primaries returns the current primaries by cluster name.
	Primaries func() map[string]*store.Store
	// Now is the clock of versions. Defaults to time.Now.
	Now func() time.Time

	mu   sync.Mutex
	last uint64
}

var _ Store = (*MySQLStore)(nil)

// version is a strictly growing number based on the clock, so that writes
// of one router order correctly even within a clock tick, and above every
// stored version of the subscription, so that a router whose clock runs
// behind another's still replaces what that one wrote.
func (m *MySQLStore) version(ctx context.Context, topic, name string) (uint64, error) {
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	stored, err := m.storedVersion(ctx, topic, name)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v := uint64(now().UnixNano())
	if v <= m.last {
		v = m.last + 1
	}
	if v <= stored {
		v = stored + 1
	}
	m.last = v
	return v, nil
}

// storedVersion is the highest version of a subscription on any primary
// (tombstones included); every primary must answer, since a write must
// reach all of them anyway.
func (m *MySQLStore) storedVersion(ctx context.Context, topic, name string) (uint64, error) {
	best, _, errs := m.newest(ctx)
	if len(errs) > 0 {
		return 0, fmt.Errorf("read stored versions of %s/%s: %w", topic, name, errors.Join(errs...))
	}
	return best[[2]string{topic, name}].Version, nil
}

// newest reads every primary's subscription rows and keeps the highest
// version of each (topic, name), tombstones included; answered counts the
// primaries that answered, errs names the others.
func (m *MySQLStore) newest(ctx context.Context) (best map[[2]string]store.SubscriptionRow, answered int, errs []error) {
	var mu sync.Mutex
	best = map[[2]string]store.SubscriptionRow{}
	errs = m.each(ctx, func(_ string, st *store.Store) error {
		rows, err := st.ListSubscriptions(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		answered++
		for _, r := range rows {
			k := [2]string{r.Topic, r.Name}
			if cur, ok := best[k]; !ok || r.Version > cur.Version {
				best[k] = r
			}
		}
		return nil
	})
	return best, answered, errs
}

func (m *MySQLStore) each(ctx context.Context, fn func(name string, st *store.Store) error) []error {
	prims := m.Primaries()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for name, st := range prims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(name, st); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(prims) == 0 {
		errs = append(errs, errors.New("no cluster to keep subscriptions on"))
	}
	return errs
}

// List implements Store. It returns what the reachable clusters hold along
// with an error naming those that did not answer.
func (m *MySQLStore) List(ctx context.Context) ([]Subscription, error) {
	best, answered, errs := m.newest(ctx)
	var out []Subscription
	for _, r := range best {
		if r.Deleted {
			continue
		}
		var s Subscription
		if err := json.Unmarshal(r.Config, &s); err != nil {
			errs = append(errs, fmt.Errorf("subscription %s/%s: stored configuration unreadable: %w", r.Topic, r.Name, err))
			continue
		}
		s.Topic, s.Name = r.Topic, r.Name
		out = append(out, s.WithDefaults())
	}
	if answered == 0 {
		return nil, errors.Join(errs...)
	}
	return out, errors.Join(errs...)
}

// Put implements Store.
func (m *MySQLStore) Put(ctx context.Context, s Subscription) error {
	cfg, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode subscription: %w", err)
	}
	v, err := m.version(ctx, s.Topic, s.Name)
	if err != nil {
		return err
	}
	row := store.SubscriptionRow{Topic: s.Topic, Name: s.Name, Config: cfg, Version: v, UpdatedAt: time.Now().UTC()}
	if errs := m.each(ctx, func(_ string, st *store.Store) error { return st.PutSubscription(ctx, row) }); len(errs) > 0 {
		return fmt.Errorf("store subscription %s/%s: %w", s.Topic, s.Name, errors.Join(errs...))
	}
	return nil
}

// Delete implements Store: a tombstone on every primary.
func (m *MySQLStore) Delete(ctx context.Context, topic, name string) (bool, error) {
	v, err := m.version(ctx, topic, name)
	if err != nil {
		return false, err
	}
	row := store.SubscriptionRow{Topic: topic, Name: name, Config: []byte("{}"), Version: v, Deleted: true, UpdatedAt: time.Now().UTC()}
	if errs := m.each(ctx, func(_ string, st *store.Store) error { return st.PutSubscription(ctx, row) }); len(errs) > 0 {
		return false, fmt.Errorf("delete subscription %s/%s: %w", topic, name, errors.Join(errs...))
	}
	return true, nil
}

// known reports whether any primary holds a row of the subscription,
// tombstones included.
func (m *MySQLStore) known(ctx context.Context, topic, name string) (bool, error) {
	v, err := m.storedVersion(ctx, topic, name)
	return v > 0, err
}
