package consul

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
)

// mapDoc is the JSON of the shard map in KV (<prefix>shardmap).
type mapDoc struct {
	Version int64           `json:"version"`
	Ranges  []routing.Range `json:"ranges"`
}

// EncodeMap returns the KV document of m.
func EncodeMap(m *routing.Map) []byte {
	data, _ := json.MarshalIndent(mapDoc{Version: m.Version(), Ranges: m.Ranges()}, "", "  ") // plain structs always encode
	return data
}

// DecodeMap validates a shard-map document: known fields only, version 1 or
// more, every vshard assigned exactly once. Errors wrap topology.ErrInvalid.
func DecodeMap(data []byte) (*routing.Map, error) {
	var doc mapDoc
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	if doc.Version < 1 {
		return nil, fmt.Errorf("%w: version must be 1 or more, got %d", topology.ErrInvalid, doc.Version)
	}
	m, err := routing.NewMap(doc.Version, doc.Ranges, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	return m, nil
}

func decodeMap(pair *api.KVPair) (*routing.Map, error) {
	if pair == nil {
		return nil, fmt.Errorf("%w: no shard map stored (seed it with cmd/consul-seed)", topology.ErrInvalid)
	}
	return DecodeMap(pair.Value)
}

// ShardMap implements topology.Backend.
func (s *Source) ShardMap(ctx context.Context) (*routing.Map, error) {
	pair, _, err := s.api.KV().Get(s.mapKey(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: read shard map: %w", err)
	}
	return decodeMap(pair)
}

// UpdateShardMap implements topology.Backend: the version check and the
// write are one check-and-set on the key's ModifyIndex. With prev 0 it
// creates the map where none (or no valid one) is stored. A version that
// a live router has already applied is refused (topology.ErrBehind).
func (s *Source) UpdateShardMap(ctx context.Context, prev int64, next *routing.Map) error {
	if err := topology.CheckNext(prev, next); err != nil {
		return err
	}
	pair, _, err := s.api.KV().Get(s.mapKey(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul: read shard map: %w", err)
	}
	have, index := storedVersion(pair)
	if have != prev {
		return &topology.ConflictError{Want: prev, Have: have}
	}
	applied, err := s.Applied(ctx)
	if err != nil {
		return err
	}
	if err := topology.CheckAbove(next, applied); err != nil {
		return err
	}
	ok, _, err := s.api.KV().CAS(&api.KVPair{Key: s.mapKey(), Value: EncodeMap(next), ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul: write shard map: %w", err)
	}
	if !ok {
		now, _, err := s.api.KV().Get(s.mapKey(), (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return &topology.ConflictError{Want: prev, Have: -1}
		}
		have, _ := storedVersion(now)
		return &topology.ConflictError{Want: prev, Have: have}
	}
	s.log.Info("consul shard map updated", "from", prev, "to", next.Version())
	return nil
}

// storedVersion is the version of a stored map (0 when none or invalid)
// and the ModifyIndex to check-and-set against (0 when the key is absent).
func storedVersion(pair *api.KVPair) (int64, uint64) {
	if pair == nil {
		return 0, 0
	}
	m, err := DecodeMap(pair.Value)
	if err != nil {
		return 0, pair.ModifyIndex
	}
	return m.Version(), pair.ModifyIndex
}

// Subscriptions keeps subscriptions in Consul KV, one JSON document per
// subscription at <prefix>subscriptions/<topic>/<name>, written with
// check-and-set so that concurrent writers never lose an update silently.
type Subscriptions struct {
	s *Source
}

var _ subscription.Store = (*Subscriptions)(nil)

// Subscriptions returns the subscription store.
func (s *Source) Subscriptions() *Subscriptions { return &Subscriptions{s: s} }

func (st *Subscriptions) key(topic, name string) string {
	return st.s.subsPrefix() + topic + "/" + name
}

// List implements subscription.Store. An invalid document is logged and
// skipped.
func (st *Subscriptions) List(ctx context.Context) ([]subscription.Subscription, error) {
	pairs, _, err := st.s.api.KV().List(st.s.subsPrefix(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: list subscriptions: %w", err)
	}
	return st.decode(pairs), nil
}

func (st *Subscriptions) decode(pairs api.KVPairs) []subscription.Subscription {
	out := make([]subscription.Subscription, 0, len(pairs))
	for _, p := range pairs {
		var sub subscription.Subscription
		err := json.Unmarshal(p.Value, &sub)
		if err == nil {
			err = sub.Validate()
		}
		if err == nil && st.key(sub.Topic, sub.Name) != p.Key {
			err = fmt.Errorf("topic %q and name %q do not match the key", sub.Topic, sub.Name)
		}
		if err != nil {
			st.s.log.Error("consul subscription rejected", "key", p.Key, "err", err)
			continue
		}
		out = append(out, sub)
	}
	return out
}

// Put implements subscription.Store. CreatedAt is kept from the stored
// subscription (set to now for a new one).
func (st *Subscriptions) Put(ctx context.Context, sub subscription.Subscription) error {
	if err := sub.Validate(); err != nil {
		return err
	}
	key := st.key(sub.Topic, sub.Name)
	for {
		pair, _, err := st.s.api.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("consul: read subscription: %w", err)
		}
		var index uint64
		out := sub
		if pair != nil {
			index = pair.ModifyIndex
			var old subscription.Subscription
			if json.Unmarshal(pair.Value, &old) == nil && !old.CreatedAt.IsZero() {
				out.CreatedAt = old.CreatedAt
			}
		}
		if out.CreatedAt.IsZero() {
			out.CreatedAt = time.Now().UTC()
		}
		data, err := json.Marshal(out)
		if err != nil {
			return fmt.Errorf("consul: encode subscription: %w", err)
		}
		ok, _, err := st.s.api.KV().CAS(&api.KVPair{Key: key, Value: data, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return fmt.Errorf("consul: write subscription: %w", err)
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil { // lost a race: read again
			return err
		}
	}
}

// Delete implements subscription.Store.
func (st *Subscriptions) Delete(ctx context.Context, topic, name string) (bool, error) {
	key := st.key(topic, name)
	for {
		pair, _, err := st.s.api.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return false, fmt.Errorf("consul: read subscription: %w", err)
		}
		if pair == nil {
			return false, nil
		}
		ok, _, err := st.s.api.KV().DeleteCAS(&api.KVPair{Key: key, ModifyIndex: pair.ModifyIndex}, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil {
			return false, fmt.Errorf("consul: delete subscription: %w", err)
		}
		if ok {
			return true, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
}

// Watch calls fn with every subscription after each change in KV, until
// ctx is done, so that every router sees a subscription another router
// created. Failures are retried with backoff.
func (st *Subscriptions) Watch(ctx context.Context, fn func([]subscription.Subscription)) {
	var last []subscription.Subscription
	first := true
	st.s.blockingLoop(ctx, "subscriptions", 0, func(q *api.QueryOptions) (uint64, error) {
		pairs, meta, err := st.s.api.KV().List(st.s.subsPrefix(), q)
		if err != nil {
			return 0, err
		}
		subs := st.decode(pairs)
		if first || !equalSubs(last, subs) {
			first, last = false, subs
			fn(subs)
		}
		return meta.LastIndex, nil
	})
}

func equalSubs(a, b []subscription.Subscription) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, _ := json.Marshal(a[i])
		y, _ := json.Marshal(b[i])
		if !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}
