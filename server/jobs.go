package server

import (
	"context"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/retention"
)

// jobs are the router's own background work besides high availability
// (ha.go): dead-letter alarms and archive, run only while this router
// leads (Config.Leader; a router without one always leads), and the
// metrics of group commit and transaction retries.
type jobs struct {
	upkeep    *deadletter.Upkeep
	retention *retention.Job // retention.go
	retries   atomic.Pointer[prometheus.CounterVec]
	cancel    context.CancelFunc
}

// leading says whether this router runs the background jobs now.
func (r *Router) leading() bool {
	return r.cfg.Leader == nil || r.cfg.Leader.IsLeader()
}

// countRetry is the store's OnRetry hook: deadlocks and lock waits that
// made a transaction run again, by cluster and operation.
func (j *jobs) countRetry(cluster, op string) {
	if c := j.retries.Load(); c != nil {
		c.WithLabelValues(cluster, op).Inc()
	}
}

func (r *Router) startJobs() {
	j := r.jobs
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_tx_retries_total",
		Help: "Transactions run again after a deadlock (1213) or lock wait timeout (1205), by cluster and operation."}, []string{"cluster", "op"})
	j.retries.Store(retries)
	j.upkeep = deadletter.New(r.cfg.DeadLetters, r.broker, r.subs, r.leading, r.cfg.Now, r.cfg.Log)
	reg := r.Metrics()
	reg.MustRegister(retries, commitCollector{r}, rejectedCollector{r})
	reg.MustRegister(j.upkeep.Collectors()...)
	ctx, cancel := context.WithCancel(context.Background())
	j.cancel = cancel
	j.upkeep.Start(ctx)
}

func (j *jobs) stop() {
	if j.retention != nil {
		j.retention.Stop()
	}
	if j.upkeep != nil {
		j.upkeep.Stop()
	}
	if j.cancel != nil {
		j.cancel()
	}
}

// DeadLetters exposes the dead-letter upkeep (tests, admin).
func (r *Router) DeadLetters() *deadletter.Upkeep { return r.jobs.upkeep }

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
type commitCollector struct{ r *Router }

func (c commitCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCommitTx
	ch <- descCommitMsgs
	ch <- descCommitSplits
	ch <- descCommitSeconds
}

func (c commitCollector) Collect(ch chan<- prometheus.Metric) {
	for name, s := range c.r.broker.CommitStats() {
		ch <- prometheus.MustNewConstMetric(descCommitTx, prometheus.CounterValue, float64(s.Transactions), name)
		ch <- prometheus.MustNewConstMetric(descCommitMsgs, prometheus.CounterValue, float64(s.Messages), name)
		ch <- prometheus.MustNewConstMetric(descCommitSplits, prometheus.CounterValue, float64(s.Splits), name)
		ch <- prometheus.MustNewConstMetric(descCommitSeconds, prometheus.CounterValue, s.Busy.Seconds(), name)
	}
}
