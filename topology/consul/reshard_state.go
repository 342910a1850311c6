package consul

import (
	"context"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// ReshardState is the document of the resharding jobs (rebalance.StateDoc)
// in KV at <prefix>reshard/jobs, replaced with check-and-set on its
// ModifyIndex, so that every router reads the jobs and the leader's
// progress, and an operator's pause or abort through any router is never
// lost.
type ReshardState struct {
	s *Source
}

// ReshardState returns the document of the resharding jobs.
func (s *Source) ReshardState() *ReshardState { return &ReshardState{s: s} }

func (r *ReshardState) key() string { return r.s.cfg.Prefix + "reshard/jobs" }

// Get returns the stored document (nil when none) and its ModifyIndex.
func (r *ReshardState) Get(ctx context.Context) ([]byte, uint64, error) {
	pair, _, err := r.s.api.KV().Get(r.key(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("consul: read %s: %w", r.key(), err)
	}
	if pair == nil {
		return nil, 0, nil
	}
	if pair.Value == nil {
		return []byte{}, pair.ModifyIndex, nil
	}
	return pair.Value, pair.ModifyIndex, nil
}

// CompareAndSwap writes data when the key is still at ModifyIndex rev (0:
// when there is no key).
func (r *ReshardState) CompareAndSwap(ctx context.Context, rev uint64, data []byte) (bool, error) {
	ok, _, err := r.s.api.KV().CAS(&api.KVPair{Key: r.key(), Value: data, ModifyIndex: rev}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("consul: write %s: %w", r.key(), err)
	}
	return ok, nil
}
