package api

import (
	"context"
	"net/http"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/routing"
)

// Operator is what the shard-map and stats endpoints need.
type Operator interface {
	ShardMap() *routing.Map
	Stats(ctx context.Context) broker.Stats
}

var _ Operator = (*broker.Broker)(nil)

// shardMapRange is one range of GET /v1/admin/shardmap.
type shardMapRange struct {
	From    int    `json:"from"`
	To      int    `json:"to"`
	Cluster string `json:"cluster"`
	State   string `json:"state"`
}

// subscriptionStats is one subscription of GET /v1/admin/stats.
type subscriptionStats struct {
	Topic        string `json:"topic"`
	Subscription string `json:"subscription"`
	Depth        int64  `json:"depth"`
	Ready        int64  `json:"ready"`
	Delayed      int64  `json:"delayed"`
	InFlight     int64  `json:"in_flight"`
	Parked       int64  `json:"parked"`
	Dead         int64  `json:"dead"`
}

func (s *Server) shardMap(w http.ResponseWriter, r *http.Request) {
	m := s.b.ShardMap()
	var ranges []shardMapRange
	for _, x := range m.Ranges() {
		st := routing.Serving
		if x.Frozen {
			st = routing.Frozen
		}
		ranges = append(ranges, shardMapRange{From: x.From, To: x.To, Cluster: x.Cluster, State: st.String()})
	}
	writeJSON(w, http.StatusOK, map[string]any{"version": m.Version(), "vshards": 1024, "clusters": m.Clusters(), "ranges": ranges})
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st := s.b.Stats(r.Context())
	subs := make([]subscriptionStats, 0, len(st.Subscriptions))
	for _, q := range st.Subscriptions {
		subs = append(subs, subscriptionStats{Topic: q.Topic, Subscription: q.Subscription, Depth: q.Ready + q.Delayed + q.Parked,
			Ready: q.Ready, Delayed: q.Delayed, InFlight: q.InFlight, Parked: q.Parked, Dead: q.Dead})
	}
	out := map[string]any{"subscriptions": subs, "missing_clusters": missingList(st.Missing)}
	if s.retention != nil {
		out["retention"] = s.retention.Status()
	}
	writeJSON(w, http.StatusOK, out)
}
