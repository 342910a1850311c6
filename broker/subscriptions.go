package broker

import (
	"context"
	"sort"
	"sync"

	"github.com/shardmq/shardmq/store"
)

// DefaultSubscription is the implicit subscription of a topic that has none.
const DefaultSubscription = "default"

// MemorySubscriptions keeps subscriptions in the router's memory: each
// topic has its implicit default subscription with the default policy.
// It serves a single router on a static topology.
type MemorySubscriptions struct {
	mu     sync.Mutex
	policy store.RetryPolicy
	topics map[string]map[string]store.RetryPolicy
}

var _ Subscriptions = (*MemorySubscriptions)(nil)

// NewMemorySubscriptions returns a registry whose default subscriptions use
// policy (zero fields take store.RetryPolicy's defaults).
func NewMemorySubscriptions(policy store.RetryPolicy) *MemorySubscriptions {
	return &MemorySubscriptions{policy: policy.WithDefaults(), topics: map[string]map[string]store.RetryPolicy{}}
}

// Put creates or replaces a subscription.
func (m *MemorySubscriptions) Put(topic, sub string, p store.RetryPolicy) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.topics[topic] == nil {
		m.topics[topic] = map[string]store.RetryPolicy{}
	}
	m.topics[topic][sub] = p.WithDefaults()
}

// ForProduce implements Subscriptions.
func (m *MemorySubscriptions) ForProduce(_ context.Context, topic string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	subs := m.topics[topic]
	if len(subs) == 0 {
		subs = map[string]store.RetryPolicy{DefaultSubscription: m.policy}
		m.topics[topic] = subs
	}
	out := make([]string, 0, len(subs))
	for s := range subs {
		out = append(out, s)
	}
	sort.Strings(out)
	return out, nil
}

// Policy implements Subscriptions. The default subscription of any topic
// exists, so a consumer may wait on it before the first produce.
func (m *MemorySubscriptions) Policy(_ context.Context, topic, sub string) (store.RetryPolicy, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.topics[topic][sub]; ok {
		return p, true, nil
	}
	if sub == DefaultSubscription && len(m.topics[topic]) == 0 {
		return m.policy, true, nil
	}
	return store.RetryPolicy{}, false, nil
}
