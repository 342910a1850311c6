package server

import (
	"context"
	"sort"
	"time"

	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// adminOps implements api.Admin over the values it reads: the endpoints,
// the shard map, the topology view, reconciliation and lookups.
type adminOps struct {
	eps     *endpoints
	table   *routing.Table
	view    topologyView
	stores  func() map[string]*store.Store
	recon   *reconcile.Runner
	lookups *lookup.Service
	ready   readyCheck // asks each cluster whether it answers now
}

// EndpointView is one endpoint in GET /v1/admin/topology.
type EndpointView struct {
	Role     string `json:"role"`
	Endpoint string `json:"endpoint"`
	Health   string `json:"health"` // ok | unreachable | replication_stopped | lagging | …
	Breaker  string `json:"breaker"`
	Error    string `json:"error,omitempty"`
	// Primaries: the newest heartbeat this router wrote there.
	LastHeartbeat string `json:"last_heartbeat,omitempty"`
	// Replicas.
	LagMS         *int64 `json:"lag_ms,omitempty"`
	IORunning     *bool  `json:"io_running,omitempty"`
	SQLRunning    *bool  `json:"sql_running,omitempty"`
	SecondsBehind *int   `json:"seconds_behind_master,omitempty"`
	ServesReads   *bool  `json:"serves_reads,omitempty"`
}

// ClusterView is one cluster in GET /v1/admin/topology.
type ClusterView struct {
	Name    string `json:"name"`
	VShards int    `json:"vshards"`
	// State is serving, stale (routing to the last known endpoints of a
	// cluster that vanished from the catalog), no_primary or unknown.
	State     string         `json:"state"`
	Detail    string         `json:"detail,omitempty"`
	Endpoints []EndpointView `json:"endpoints"`
}

// Topology is GET /v1/admin/topology: every cluster with its state and
// endpoints (health, breaker, heartbeat, replica lag), and
// missing_clusters: those whose primary does not answer now, asked
// live as /readyz asks (the heartbeat and the breaker only notice a dead
// primary after their next write or enough failed requests).
func (a adminOps) Topology(ctx context.Context) (any, error) {
	m := a.table.Load()
	answers := map[string]bool{}
	missing := []string{}
	for _, h := range a.ready.clusters(ctx) {
		answers[h.Cluster] = h.OK
		if !h.OK {
			missing = append(missing, h.Cluster)
		}
	}
	states := map[string]string{}
	for _, s := range a.eps.breakers.States() {
		states[s.Endpoint] = s.State
	}
	breaker := func(ep string) string {
		if s, ok := states[ep]; ok {
			return s
		}
		return "closed"
	}
	mon := map[string]replica.ClusterStatus{}
	for _, c := range a.eps.monitor.Status() {
		mon[c.Cluster] = c
	}
	prims := a.eps.primaries()
	names := make([]string, 0, len(prims))
	for n := range prims {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]ClusterView, 0, len(names))
	cstates := map[string]topology.ClusterState{}
	for _, cs := range a.view.clusterStates(a.stores()) {
		cstates[cs.Name] = cs
		if _, ok := prims[cs.Name]; !ok {
			out = append(out, ClusterView{Name: cs.Name, VShards: len(m.VShards(cs.Name)), State: cs.State, Detail: cs.Detail, Endpoints: []EndpointView{}})
		}
	}
	for _, n := range names {
		p, st := prims[n], mon[n]
		cv := ClusterView{Name: n, VShards: len(m.VShards(n)), State: cstates[n].State, Detail: cstates[n].Detail}
		pv := EndpointView{Role: "primary", Endpoint: p.Endpoint, Health: "ok", Breaker: breaker(p.Endpoint), Error: st.HeartbeatError}
		if !st.LastHeartbeat.IsZero() {
			pv.LastHeartbeat = st.LastHeartbeat.Format(time.RFC3339Nano)
		}
		if pv.Error != "" || pv.Breaker == "open" || !answers[n] {
			pv.Health = "unreachable"
		}
		cv.Endpoints = append(cv.Endpoints, pv)
		for _, rs := range st.Replicas {
			rv := EndpointView{Role: "replica", Endpoint: rs.Endpoint, Breaker: breaker(rs.Endpoint), Error: rs.Error,
				LagMS: &rs.LagMS, IORunning: &rs.IORunning, SQLRunning: &rs.SQLRunning, SecondsBehind: &rs.SecondsBehind, ServesReads: &rs.Eligible}
			switch {
			case rs.Eligible:
				rv.Health = "ok"
			case rs.Error != "":
				rv.Health = "unreachable"
			case !rs.SQLRunning:
				rv.Health = "replication_stopped"
			default:
				rv.Health = "lagging"
			}
			cv.Endpoints = append(cv.Endpoints, rv)
		}
		out = append(out, cv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	res := map[string]any{"shard_map_version": m.Version(), "max_replica_lag_ms": a.eps.monitor.Config().MaxLag.Milliseconds(),
		"clusters": out, "missing_clusters": missing}
	return a.view.withStatus(res), nil
}

func (a adminOps) Reconcile(ctx context.Context, req reconcile.Request) (*reconcile.Report, error) {
	return a.recon.Run(ctx, req)
}

func (a adminOps) LastReconcile() *reconcile.Report { return a.recon.Last() }

func (a adminOps) MissingTransactions(ctx context.Context, ids []string) (*lookup.MissingResult, error) {
	return a.lookups.MissingTransactions(ctx, ids)
}
