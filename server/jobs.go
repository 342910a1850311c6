package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/topology"
)

// leader says whether this router runs the background jobs now: those
// of the leading router (Config.Leader; a router without one always
// leads) — dead-letter alarms and archive, scheduled reconciliation, queue
// health counts, resharding jobs.
func leader(l topology.Leader) func() bool {
	return func() bool { return l == nil || l.IsLeader() }
}

// txRetries counts the store's transaction retries: deadlocks and lock
// waits that made a transaction run again, by cluster and operation.
type txRetries struct{ c *prometheus.CounterVec }

func newTxRetries(reg prometheus.Registerer) *txRetries {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_tx_retries_total",
		Help: "Transactions run again after a deadlock (1213) or lock wait timeout (1205), by cluster and operation."}, []string{"cluster", "op"})
	reg.MustRegister(c)
	return &txRetries{c}
}

// hook is the store's OnRetry hook for cluster.
func (t *txRetries) hook(cluster string) func(op string) {
	return func(op string) { t.c.WithLabelValues(cluster, op).Inc() }
}

// DeadLetters exposes the dead-letter upkeep (tests, admin).
func (r *Router) DeadLetters() *deadletter.Upkeep { return r.upkeep }

var (
	descCommitTx = prometheus.NewDesc("shardmq_group_commit_transactions_total",
		"Produce transactions run by a cluster's group committer.", []string{"cluster"}, nil)
	descCommitMsgs = prometheus.NewDesc("shardmq_group_commit_messages_total",
		"Messages carried by those transactions (messages/transactions is the batch size).", []string{"cluster"}, nil)
	descCommitSplits = prometheus.NewDesc("shardmq_group_commit_splits_total",
		"Batches split to isolate an item the database refused.", []string{"cluster"}, nil)
	descCommitSeconds = prometheus.NewDesc("shardmq_group_commit_seconds_total",
		"Time spent committing batches, summed over a cluster's concurrent committers (waiting for a connection and split retries included): seconds/transactions is the mean time a batch took.", []string{"cluster"}, nil)
)

// commitCollector reads the group committers' counters at scrape time.
type commitCollector struct{ b *broker.Broker }

func (c commitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCommitTx
	ch <- descCommitMsgs
	ch <- descCommitSplits
	ch <- descCommitSeconds
}

func (c commitCollector) Collect(ch chan<- prometheus.Metric) {
	for name, s := range c.b.CommitStats() {
		ch <- prometheus.MustNewConstMetric(descCommitTx, prometheus.CounterValue, float64(s.Transactions), name)
		ch <- prometheus.MustNewConstMetric(descCommitMsgs, prometheus.CounterValue, float64(s.Messages), name)
		ch <- prometheus.MustNewConstMetric(descCommitSplits, prometheus.CounterValue, float64(s.Splits), name)
		ch <- prometheus.MustNewConstMetric(descCommitSeconds, prometheus.CounterValue, s.Busy.Seconds(), name)
	}
}

var (
	descOwnerUnits = prometheus.NewDesc("shardmq_owner_units",
		"Units (a subscription on a cluster) whose delivery state this router owns (docs/consume.md, \"Owners\").", []string{"cluster"}, nil)
	descOwnerLeases = prometheus.NewDesc("shardmq_owner_leases",
		"Leases this router holds in memory (first attempts in flight).", []string{"cluster"}, nil)
	descOwnerFlushes = prometheus.NewDesc("shardmq_owner_flushes_total",
		"Flush transactions this router's owners ran (acks, nacks, expiries, hand-overs and parking of leases held in memory).", []string{"cluster"}, nil)
	descOwnerOutcomes = prometheus.NewDesc("shardmq_owner_flushed_outcomes_total",
		"Outcomes those flushes carried (outcomes/flushes is the batch size).", []string{"cluster"}, nil)
	descOwnerRefused = prometheus.NewDesc("shardmq_owner_leases_refused_total",
		"First attempts a claim did not hand out because the router held -max-leases leases in memory.", nil, nil)
	descBodyBytes = prometheus.NewDesc("shardmq_body_cache_bytes",
		"Bytes of messages this router keeps after producing them, for its owners' claims (-body-cache-mb).", nil, nil)
	descBodyLookups = prometheus.NewDesc("shardmq_body_cache_lookups_total",
		"Bodies an owner's claim looked for in that cache: result hit (read nothing back) or miss (read from the primary).", []string{"result"}, nil)
)

// ownerCollector reads the owners' state at scrape time.
type ownerCollector struct{ b *broker.Broker }

func (c ownerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOwnerUnits, descOwnerLeases, descOwnerFlushes, descOwnerOutcomes, descOwnerRefused, descBodyBytes, descBodyLookups} {
		ch <- d
	}
}

func (c ownerCollector) Collect(ch chan<- prometheus.Metric) {
	for name, s := range c.b.Owners().Stats() {
		ch <- prometheus.MustNewConstMetric(descOwnerUnits, prometheus.GaugeValue, float64(s.Units), name)
		ch <- prometheus.MustNewConstMetric(descOwnerLeases, prometheus.GaugeValue, float64(s.Leases), name)
		ch <- prometheus.MustNewConstMetric(descOwnerFlushes, prometheus.CounterValue, float64(s.Flushes), name)
		ch <- prometheus.MustNewConstMetric(descOwnerOutcomes, prometheus.CounterValue, float64(s.Outcomes), name)
	}
	_, refused := c.b.Owners().InFlight()
	ch <- prometheus.MustNewConstMetric(descOwnerRefused, prometheus.CounterValue, float64(refused))
	bs := c.b.Owners().BodiesStats()
	ch <- prometheus.MustNewConstMetric(descBodyBytes, prometheus.GaugeValue, float64(bs.Bytes))
	ch <- prometheus.MustNewConstMetric(descBodyLookups, prometheus.CounterValue, float64(bs.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(descBodyLookups, prometheus.CounterValue, float64(bs.Misses), "miss")
}
