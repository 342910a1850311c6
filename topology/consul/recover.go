package consul

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
)

// RecoverMap writes rb, a shard map rebuilt from the clusters' own
// records (topology.Rebuild), after the topology store lost or rolled
// back its map. The version written is above the stored map's, above
// every live router's and above every record, so that every router takes
// it. Unless force is set it first checks that the live routers route as
// the rebuilt map does (topology.CheckRebuilt), so that recovering moves
// no vshard under a running router.
func RecoverMap(ctx context.Context, s *Source, rb *topology.Rebuilt, force bool) (*routing.Map, error) {
	applied, err := s.Applied(ctx)
	if err != nil {
		return nil, err
	}
	if !force {
		if err := topology.CheckRebuilt(rb, applied); err != nil {
			return nil, err
		}
	}
	var stored int64
	switch cur, err := s.ShardMap(ctx); {
	case err == nil:
		stored = cur.Version()
	case errors.Is(err, topology.ErrInvalid):
	default:
		return nil, err
	}
	next, err := routing.NewMap(max(topology.NextVersion(stored, applied), rb.Newest+1), rb.Ranges, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	if err := s.UpdateShardMap(ctx, stored, next); err != nil {
		return nil, fmt.Errorf("write recovered shard map: %w", err)
	}
	return next, nil
}
