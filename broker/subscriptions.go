package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// Subscriptions is what the broker needs to know about subscriptions.
type Subscriptions interface {
	// ForProduce lists the subscriptions a message produced to topic now is
	// delivered to; a topic with none gets its default one.
	ForProduce(ctx context.Context, topic string) ([]string, error)
	// Get returns a subscription; ok is false when it does not exist.
	Get(ctx context.Context, topic, name string) (s subscription.Subscription, ok bool, err error)
	// Put creates or replaces a subscription and says whether it is new.
	Put(ctx context.Context, s subscription.Subscription) (subscription.Subscription, bool, error)
	// Delete removes a subscription (subscription.ErrNotFound if absent).
	Delete(ctx context.Context, topic, name string) error
	// List returns a topic's subscriptions ("" for all topics).
	List(topic string) []subscription.Subscription
}

var _ Subscriptions = (*subscription.Registry)(nil)

// GetSubscription returns a subscription's configuration.
func (b *Broker) GetSubscription(ctx context.Context, topic, name string) (subscription.Subscription, error) {
	s, ok, err := b.subs.Get(ctx, topic, name)
	if err != nil {
		return s, err
	}
	if !ok {
		return s, ErrUnknownSubscription
	}
	return s, nil
}

// PutSubscription creates or replaces a subscription. When a subscription
// stops being ordered, its parked deliveries are released on every cluster.
func (b *Broker) PutSubscription(ctx context.Context, s subscription.Subscription) (subscription.Subscription, bool, error) {
	old, existed, err := b.subs.Get(ctx, s.Topic, s.Name)
	if err != nil {
		return s, false, err
	}
	s, created, err := b.subs.Put(ctx, s)
	if err != nil {
		return s, false, err
	}
	if existed && old.Ordered && !s.Ordered {
		unpark := func(ctx context.Context) error {
			return b.eachCluster(ctx, func(ctx context.Context, name string, sh Cluster) error {
				_, err := sh.Unpark(ctx, s.Topic, s.Name, b.now().UTC())
				return err
			})
		}
		if err := unpark(ctx); err != nil {
			return s, created, fmt.Errorf("subscription saved, but its parked deliveries were not all released (put it again to retry): %w", err)
		}
		// Routers that have not seen the change yet (up to a refresh)
		// may still park deliveries: release again once they have.
		time.AfterFunc(unparkAgainAfter, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := unpark(ctx); err != nil {
				b.log.Warn("second release of parked deliveries failed; put the subscription again to retry", "topic", s.Topic, "subscription", s.Name, "err", err)
			}
		})
	}
	return s, created, nil
}

// DeleteSubscription removes a subscription and its deliveries on every
// cluster. A message left with no delivery is consumed.
func (b *Broker) DeleteSubscription(ctx context.Context, topic, name string) error {
	if err := b.subs.Delete(ctx, topic, name); err != nil {
		if errors.Is(err, subscription.ErrNotFound) {
			return ErrUnknownSubscription
		}
		return err
	}
	err := b.eachCluster(ctx, func(ctx context.Context, _ string, sh Cluster) error {
		_, err := sh.DropSubscription(ctx, topic, name, b.now().UTC())
		return err
	})
	if err != nil {
		return fmt.Errorf("subscription deleted, but not all of its deliveries were removed: %w", err)
	}
	return nil
}

// unparkAgainAfter outlasts every router's subscription refresh (1s).
const unparkAgainAfter = 5 * time.Second

// eachCluster runs fn on every cluster of the current shard map at once
// and joins the errors, each naming its cluster.
func (b *Broker) eachCluster(ctx context.Context, fn func(ctx context.Context, name string, c Cluster) error) error {
	_, err := b.eachClusterMissing(ctx, fn)
	return err
}

// eachClusterMissing is eachCluster that also names, sorted, the clusters
// that did not answer (their call point refused or failed the call, or the
// router holds no connection to them).
func (b *Broker) eachClusterMissing(ctx context.Context, fn func(ctx context.Context, name string, c Cluster) error) (missing []string, err error) {
	clusters := *b.clusters.Load()
	var mu sync.Mutex
	var errs []error
	fail := func(name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		missing = append(missing, name)
		errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
	}
	// Writes among them are fenced by the map in use (store.WithFence).
	m := b.table.Load()
	ctx = store.WithFence(ctx, store.Fence{MapVersion: m.Version()})
	var wg sync.WaitGroup
	for _, name := range m.Clusters() {
		cs, ok := clusters[name]
		if !ok {
			fail(name, fmt.Errorf("%w: no connection", ErrUnavailable))
			continue
		}
		wg.Go(func() {
			if err := fn(ctx, name, cs.conn); err != nil {
				fail(name, err)
			}
		})
	}
	wg.Wait()
	sort.Strings(missing)
	return missing, errors.Join(errs...)
}
