package server

import (
	"context"
	"database/sql"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/observe"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/ui"
)

// observability is the router's share of package observe: message
// counters, per-cluster operation timers, pool and disk collectors, queue
// health, runtime collectors and the API's request metrics, all on the
// router's registry (GET /metrics).
type observability struct {
	cfg    observe.Config
	labels *observe.Labels
	msgs   *observe.Messages
	shards *observe.Shards
	queue  *observe.QueueHealth
	// history keeps the last hour of queue counts for the operators'
	// page (/ui): fed by queue health, so only while this router leads.
	history *ui.History
	cancel  context.CancelFunc
}

// newObservability registers what needs no broker yet; the router's
// registry exists (newHA).
func newObservability(r *Router) *observability {
	cfg := r.cfg.Observe.WithDefaults()
	reg := r.Metrics()
	o := &observability{cfg: cfg, labels: observe.NewLabels(cfg.MaxLabelValues), history: ui.NewHistory(r.cfg.UI.SampleEvery, r.cfg.UI.Samples)}
	observe.RegisterRuntime(reg)
	o.msgs = observe.NewMessages(reg, o.labels)
	o.shards = observe.NewShards(reg)
	reg.MustRegister(observe.NewPoolCollector(r.pools), observe.NewDiskCollector(cfg.DiskPaths))
	return o
}

// start instruments the API and starts the queue-health counts, once the
// broker and the API exist.
func (o *observability) start(r *Router) {
	reg := r.Metrics()
	r.api.Instrument(api.NewHTTPMetrics(reg))
	o.queue = observe.NewQueueHealth(o.cfg.QueueEvery, r.broker, r.subs, o.labels, o.msgs, r.leading, r.cfg.Now, r.cfg.Log)
	o.queue.OnCount(o.history.Record)
	reg.MustRegister(o.queue)
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	o.queue.Start(ctx)
}

func (o *observability) stop() {
	if o == nil {
		return
	}
	if o.cancel != nil {
		o.cancel()
	}
	if o.queue != nil {
		o.queue.Stop()
	}
}

// pools lists every cluster primary's connection pool.
func (r *Router) pools() map[string]*sql.DB {
	out := map[string]*sql.DB{}
	for name, st := range r.Stores() {
		out[name] = st.DB()
	}
	return out
}

// storeOptions are the store options of cluster's primary: transaction
// retries are counted per cluster unless the caller set its own hook.
func (r *Router) storeOptions(cluster string) store.Options {
	opts := r.cfg.Store
	if r.ownRetries {
		opts.OnRetry = func(op string) { r.jobs.countRetry(cluster, op) }
	}
	return opts
}

// QueueHealth exposes the queue-health counts (tests count at a known
// moment with Refresh).
func (r *Router) QueueHealth() *observe.QueueHealth { return r.obs.queue }
