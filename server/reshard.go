package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
)

// Resharding (DESIGN §7, docs/resharding.md): the job manager runs on the
// leading router over the topology backend (check-and-set shard maps and
// the barrier on every live router) and the clusters' primaries. A router
// on the static file is the only router: it registers itself with the file
// backend and publishes the shard-map version it can vouch for (the oldest
// one an operation in flight still routes with), so the barrier of a
// freeze waits for writes routed with the map before it.

// The topology backends keep the jobs' document (consul.ReshardState is
// checked where cmd/router wires it).
var _ rebalance.StateDoc = (*topology.FileDoc)(nil)

type reshard struct {
	backend topology.Backend
	state   rebalance.StateDoc
	manager *rebalance.Manager
	cancel  context.CancelFunc
	done    chan struct{}
}

// setupReshard builds the manager when the topology has a backend: the
// static file by default, or Config.Backend (Consul). Without one the
// resharding endpoints are not served.
func (r *Router) setupReshard(ctx context.Context) error {
	rs := &reshard{backend: r.cfg.Backend, state: r.cfg.ReshardState}
	fb, onFile := r.cfg.Source.(*topology.FileBackend)
	if rs.backend == nil && onFile {
		rs.backend = fb
	}
	if rs.state == nil && onFile {
		rs.state = fb.ReshardState()
	}
	if rs.backend == nil || rs.state == nil {
		return nil
	}
	pctx, cancel := context.WithCancel(context.Background())
	rs.cancel = cancel
	rs.done = make(chan struct{})
	if r.cfg.Backend == nil && onFile {
		reg, err := fb.Register(pctx, "router-"+r.cfg.Listen)
		if err != nil {
			cancel()
			return err
		}
		go func() {
			defer close(rs.done)
			defer reg.Stop()
			for {
				changed := r.broker.AppliedChanged()
				reg.Publish(r.broker.Applied())
				select {
				case <-pctx.Done():
					return
				case <-changed:
				}
			}
		}()
	} else {
		close(rs.done)
	}
	cfg := r.cfg.Reshard
	if cfg.Leader == nil {
		cfg.Leader = r.cfg.Leader
	}
	if cfg.Log == nil {
		cfg.Log = r.cfg.Log
	}
	if cfg.Now == nil {
		cfg.Now = r.cfg.Now
	}
	if cfg.ReplicaLag == nil {
		cfg.ReplicaLag = func(cluster string) (time.Duration, bool) {
			rep, ok := r.eps.monitor.Best(cluster)
			if !ok || rep.Lag < 0 {
				return 0, false
			}
			return rep.Lag, true
		}
	}
	if cfg.Sessions == nil {
		cfg.Sessions = r.pools.reshardSessions("router-"+r.cfg.Listen, cfg.Log)
	}
	rs.manager = rebalance.New(cfg, rs.state, rs.backend, r.pools.movers)
	r.api.RouteReshard(rs.manager)
	r.reshard = rs
	r.metrics.MustRegister(frozenCollector{r.broker})
	r.metrics.MustRegister(rs.manager.Collectors()...)
	return nil
}

// stop ends the barrier registration (the job manager is one of the
// router's services). Safe to call twice.
func (rs *reshard) stop() {
	if rs == nil {
		return
	}
	rs.manager.Stop()
	rs.cancel()
	<-rs.done
}

// Reshard is the resharding job manager, nil when the topology has no
// backend to coordinate through.
func (r *Router) Reshard() *rebalance.Manager {
	if r.reshard == nil {
		return nil
	}
	return r.reshard.manager
}

// AppliedShardMapVersion is the shard-map version this router vouches
// for: what it publishes to the resharding barrier (see broker.Applied).
func (r *Router) AppliedShardMapVersion() int64 { return r.broker.Applied() }

// AppliedShardMap is the map to publish (version and digest) for the
// barrier: the map in use once no operation routed with an older one is
// still in flight, else nil, so that the registration keeps the older
// version it published until those operations end.
func (r *Router) AppliedShardMap() *routing.Map {
	m := r.table.Load()
	if r.broker.Applied() < m.Version() {
		return nil
	}
	return m
}

var (
	descHeld = prometheus.NewDesc("shardmq_frozen_held_requests",
		"Requests held now on vshards frozen for a resharding cut-over.", nil, nil)
	descHeldTotal = prometheus.NewDesc("shardmq_frozen_held_requests_total",
		"Requests ever held on frozen vshards.", nil, nil)
	descHeldUnavailable = prometheus.NewDesc("shardmq_frozen_unavailable_total",
		"Held requests answered unavailable: after the frozen wait (reason=timeout) or at once because the cap of held requests was reached (reason=overflow).", []string{"reason"}, nil)
	descHeldSeconds = prometheus.NewDesc("shardmq_frozen_held_seconds_total",
		"Time requests spent held on frozen vshards, summed.", nil, nil)
	descHeldMax = prometheus.NewDesc("shardmq_frozen_held_max_seconds",
		"Longest time one request was held on frozen vshards.", nil, nil)
	descFrozen = prometheus.NewDesc("shardmq_frozen_vshards",
		"Vshards frozen in the shard map in use (a cut-over is under way while it is above 0).", nil, nil)
)

// frozenCollector reads the broker's frozen-vshard buffer at scrape time.
type frozenCollector struct{ b *broker.Broker }

func (c frozenCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHeld, descHeldTotal, descHeldUnavailable, descHeldSeconds, descHeldMax, descFrozen} {
		ch <- d
	}
}

func (c frozenCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.b.FrozenStats()
	ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(s.Held))
	ch <- prometheus.MustNewConstMetric(descHeldTotal, prometheus.CounterValue, float64(s.HeldTotal))
	ch <- prometheus.MustNewConstMetric(descHeldUnavailable, prometheus.CounterValue, float64(s.TimedOut), "timeout")
	ch <- prometheus.MustNewConstMetric(descHeldUnavailable, prometheus.CounterValue, float64(s.Overflow), "overflow")
	ch <- prometheus.MustNewConstMetric(descHeldSeconds, prometheus.CounterValue, s.HeldSeconds)
	ch <- prometheus.MustNewConstMetric(descHeldMax, prometheus.GaugeValue, s.MaxHeld.Seconds())
	ch <- prometheus.MustNewConstMetric(descFrozen, prometheus.GaugeValue, float64(len(c.b.ShardMap().FrozenVShards())))
}
