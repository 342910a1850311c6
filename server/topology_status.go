package server

import (
	"sort"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// staleSource is what /readyz asks of a topology source that can fall
// behind the store it follows (Consul: unreachable, or its shard map
// rejected). The router keeps serving with the last known topology, so a
// stale source is reported, not a reason to be unready.
type staleSource interface {
	Stale() (bool, error)
}

// topologyView is what /readyz and the admin topology say about the
// topology: the source's standing and the shard map in use.
type topologyView struct {
	source topology.Source
	table  *routing.Table // nil until the router has one
	fence  *fenceWatch    // nil in views made before the router routes
	// selfFenced reports the router's self-fence (nil: never).
	selfFenced func() bool
}

// withStatus adds the shard-map version in use and, for a source that can
// be stale, whether it is and why, to a /readyz answer.
func (v topologyView) withStatus(out map[string]any) map[string]any {
	if v.table != nil {
		out["shard_map_version"] = v.table.Load().Version()
	}
	fs, fenced := v.fence.status()
	if fenced {
		out["fence"] = fs
	}
	if v.selfFenced != nil && v.selfFenced() {
		out["self_fenced"] = true
		fs.Stale = true // topology_stale below
	}
	if s, ok := v.source.(staleSource); ok {
		stale, err := s.Stale()
		out["topology_stale"] = stale || fs.Stale
		if err != nil {
			// /readyz is open: the source's error (addresses) stays in
			// the router's log.
			out["topology_error"] = "the topology source cannot be read or its data was rejected; see the router's log"
		}
	} else if fs.Stale {
		out["topology_stale"] = true
	}
	return out
}

// ShardMapVersion is the version of the shard map the router routes with;
// a topology backend's registration publishes it for the resharding
// barrier.
func (r *Router) ShardMapVersion() int64 { return r.table.Load().Version() }

// ShardMap is the shard map the router routes with.
func (r *Router) ShardMap() *routing.Map { return r.table.Load() }

// clusterStates lists every cluster of the shard map in use and every
// cluster with a pool, sorted, each with its state: the source's when it
// reports states (Consul), else serving for a cluster with a pool and
// unknown for one the map names without any.
func (v topologyView) clusterStates(stores map[string]*store.Store) []topology.ClusterState {
	byName := map[string]topology.ClusterState{}
	if s, ok := v.source.(topology.ClusterStater); ok {
		for _, st := range s.ClusterStates() {
			byName[st.Name] = st
		}
	}
	names := map[string]bool{}
	if v.table != nil {
		for _, n := range v.table.Load().Clusters() {
			names[n] = true
		}
	}
	for n := range stores {
		names[n] = true
	}
	out := make([]topology.ClusterState, 0, len(names))
	for n := range names {
		st, ok := byName[n]
		switch {
		case ok:
		case stores[n] != nil:
			st = topology.ClusterState{Name: n, State: topology.StateServing}
		default:
			st = topology.ClusterState{Name: n, State: topology.StateUnknown, Detail: "the shard map names it but the topology has no primary for it"}
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
