package topology

// Cluster states reported by a source that tells them apart (Consul).
const (
	// StateServing: the cluster has one usable primary in the catalog.
	StateServing = "serving"
	// StateStale: every instance of the cluster vanished from the catalog
	// (an agent that lost its data, a deregistration by mistake); the
	// router keeps routing to its last known endpoints until an operator
	// removes the cluster from the shard map or marks its instances
	// critical.
	StateStale = "stale"
	// StateNoPrimary: instances are registered but none is a usable
	// primary (its check is critical, or several claim the role): the
	// cluster's vshards answer unavailable.
	StateNoPrimary = "no_primary"
	// StateUnknown: the shard map names the cluster but the catalog never
	// listed an instance of it (not registered yet, or a mistyped name).
	StateUnknown = "unknown"
)

// ClusterState is one cluster's standing in the topology source.
type ClusterState struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
}

// ClusterStater is implemented by sources that report each cluster's
// state; /readyz and the admin topology show it.
type ClusterStater interface {
	ClusterStates() []ClusterState
}

// ClusterStates passes the wrapped source's states through (nil when it
// has none).
func (p *publishing) ClusterStates() []ClusterState {
	if s, ok := p.Source.(ClusterStater); ok {
		return s.ClusterStates()
	}
	return nil
}
