package consul

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/rebalance"
)

// ReshardState keeps the resharding jobs in one KV document at
// <prefix>reshard/jobs, replaced with check-and-set on its ModifyIndex, so
// that every router reads the jobs and the leader's progress, and an
// operator's pause or abort through any router is never lost.
type ReshardState struct {
	s *Source
}

var _ rebalance.StateStore = (*ReshardState)(nil)

// ReshardState returns the resharding job store.
func (s *Source) ReshardState() *ReshardState { return &ReshardState{s: s} }

func (r *ReshardState) key() string { return r.s.cfg.Prefix + "reshard/jobs" }

func (r *ReshardState) get(ctx context.Context) (*rebalance.Jobs, uint64, error) {
	pair, _, err := r.s.api.KV().Get(r.key(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("consul: read reshard jobs: %w", err)
	}
	if pair == nil {
		return &rebalance.Jobs{}, 0, nil
	}
	var js rebalance.Jobs
	if err := json.Unmarshal(pair.Value, &js); err != nil {
		return nil, 0, fmt.Errorf("consul: read reshard jobs at %s: %w", r.key(), err)
	}
	return &js, pair.ModifyIndex, nil
}

// Load implements rebalance.StateStore.
func (r *ReshardState) Load(ctx context.Context) (*rebalance.Jobs, error) {
	js, _, err := r.get(ctx)
	return js, err
}

// Save implements rebalance.StateStore.
func (r *ReshardState) Save(ctx context.Context, prev int64, next *rebalance.Jobs) error {
	cur, index, err := r.get(ctx)
	if err != nil {
		return err
	}
	if cur.Version != prev {
		return fmt.Errorf("%w: expected version %d, stored %d", rebalance.ErrConflict, prev, cur.Version)
	}
	next.Version = prev + 1
	data, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("consul: write reshard jobs: %w", err)
	}
	ok, _, err := r.s.api.KV().CAS(&api.KVPair{Key: r.key(), Value: data, ModifyIndex: index}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("consul: write reshard jobs: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: the document changed while it was written", rebalance.ErrConflict)
	}
	return nil
}
