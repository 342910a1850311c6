package server

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/observe"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/ui"
)

// observability is the router's share of package observe: message
// counters, per-cluster operation timers, disk and runtime collectors, and
// the queue-health counts, all on the router's registry (GET /metrics).
type observability struct {
	cfg      observe.Config
	labels   *observe.Labels
	msgs     *observe.Messages
	clusters *observe.Clusters
	queue    *observe.QueueHealth // a service; set by newQueueHealth
	// history keeps the last hour of queue counts for the operators'
	// page (/ui): fed by queue health, so only while this router leads.
	history *ui.History
}

// newObservability registers what needs nothing else of the router.
func newObservability(cfg observe.Config, uiCfg UIConfig, reg prometheus.Registerer) *observability {
	cfg = cfg.WithDefaults()
	o := &observability{cfg: cfg, labels: observe.NewLabels(cfg.MaxLabelValues), history: ui.NewHistory(uiCfg.SampleEvery, uiCfg.Samples)}
	observe.RegisterRuntime(reg)
	o.msgs = observe.NewMessages(reg, o.labels)
	o.clusters = observe.NewClusters(reg)
	reg.MustRegister(observe.NewDiskCollector(cfg.DiskPaths))
	return o
}

// newQueueHealth builds the queue-health counts over the broker's stats,
// registered on reg; the router runs them as a service.
func (o *observability) newQueueHealth(reg prometheus.Registerer, src observe.StatsSource, subs observe.SubscriptionGetter,
	leading func() bool, now func() time.Time, log *slog.Logger) *observe.QueueHealth {
	o.queue = observe.NewQueueHealth(o.cfg.QueueEvery, src, subs, o.labels, o.msgs, leading, now, log)
	o.queue.OnCount(o.history.Record)
	reg.MustRegister(o.queue)
	return o.queue
}

// storeOptions are the store options of each cluster's primary: the
// router's id generator and delivery counters unless set, and transaction
// retries counted per cluster unless the caller set its own hook.
func storeOptions(base store.Options, ids *idgen.Gen, msgs *observe.Messages, retries *txRetries) func(cluster string) store.Options {
	if base.IDs == nil {
		base.IDs = ids
	}
	if base.OnDeliveries == nil {
		base.OnDeliveries = msgs.Delivered
	}
	own := base.OnRetry == nil
	return func(cluster string) store.Options {
		opts := base
		if own {
			opts.OnRetry = retries.hook(cluster)
		}
		return opts
	}
}

// QueueHealth exposes the queue-health counts (tests count at a known
// moment with Refresh).
func (r *Router) QueueHealth() *observe.QueueHealth { return r.obs.queue }
