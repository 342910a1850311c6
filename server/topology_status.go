package server

// staleSource is what /readyz asks of a topology source that can fall
// behind the store it follows (Consul: unreachable, or its shard map
// rejected). The router keeps serving with the last known topology, so a
// stale source is reported, not a reason to be unready.
type staleSource interface {
	Stale() (bool, error)
}

// withTopologyStatus adds the shard-map version in use and, for a source
// that can be stale, whether it is and why, to a /readyz answer.
func (r *Router) withTopologyStatus(out map[string]any) map[string]any {
	if r.table != nil {
		out["shard_map_version"] = r.table.Load().Version()
	}
	if s, ok := r.cfg.Source.(staleSource); ok {
		stale, err := s.Stale()
		out["topology_stale"] = stale
		if err != nil {
			// /readyz is open: the source's error (addresses) stays in
			// the router's log.
			out["topology_error"] = "the topology source cannot be read or its data was rejected; see the router's log"
		}
	}
	return out
}

// ShardMapVersion is the version of the shard map the router routes with;
// a topology backend's registration publishes it for the resharding
// barrier.
func (r *Router) ShardMapVersion() int64 { return r.table.Load().Version() }
