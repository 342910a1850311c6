package observe

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// StatsSource is what queue health needs from the broker: every
// subscription's deliveries counted by state over all clusters.
type StatsSource interface {
	Stats(ctx context.Context) broker.Stats
}

// SubscriptionGetter tells whether a subscription still exists, so that
// the series of one deleted through another router are removed too.
type SubscriptionGetter interface {
	Get(ctx context.Context, topic, name string) (subscription.Subscription, bool, error)
}

// QueueHealth keeps every subscription's depth by state and the age of its
// oldest ready message, recounted every Config.QueueEvery by one grouped
// pass per cluster (broker.Stats), and serves the last count at scrape
// time: a scrape never touches the database. The age is computed at
// scrape time from the oldest ready message's produce time, so it grows
// smoothly between counts (by at most QueueEvery too much if that message
// was consumed meanwhile).
//
// Only the router that runs the background jobs counts (leading); the
// others export no queue series, so that the sum over routers is right.
type QueueHealth struct {
	every   time.Duration
	src     StatsSource
	subs    SubscriptionGetter
	labels  *Labels
	msgs    *Messages
	leading func() bool
	now     func() time.Time
	log     *slog.Logger

	snap     atomic.Pointer[queueSnapshot]
	failures atomic.Int64
	onCount  func(at time.Time, subs []store.QueueStats, missing []string)

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	done                chan struct{}
}

type queueSnapshot struct {
	at        time.Time
	took      time.Duration
	missing   int
	onReplica int
	rows      []queueRow
}

type queueRow struct {
	topic, sub string
	counts     [5]int64 // ready, delayed, in_flight, parked, dead
	oldest     time.Time
}

var queueStates = [5]string{"ready", "delayed", "in_flight", "parked", "dead"}

var (
	descQueue = prometheus.NewDesc("shardmq_queue_messages",
		"Deliveries of a subscription by state (ready, delayed, in_flight, parked, dead) at the last count.", []string{"topic", "subscription", "state"}, nil)
	descOldest = prometheus.NewDesc("shardmq_queue_oldest_ready_age_seconds",
		"Age of the subscription's oldest ready (claimable) message: now minus its produce time; 0 when none is ready.", []string{"topic", "subscription"}, nil)
	descQueueAge = prometheus.NewDesc("shardmq_queue_stats_age_seconds",
		"Time since the last queue count finished.", nil, nil)
	descQueueTook = prometheus.NewDesc("shardmq_queue_stats_duration_seconds",
		"How long the last queue count took over all clusters.", nil, nil)
	descQueueReplica = prometheus.NewDesc("shardmq_queue_stats_replica_clusters",
		"Clusters the last queue count read on a replica (a count that took 250 ms or more on a cluster moves to a replica within the read lag limit).", nil, nil)
	descQueueMissing = prometheus.NewDesc("shardmq_queue_stats_missing_clusters",
		"Clusters that did not answer the last queue count (their deliveries are missing from it).", nil, nil)
	descQueueFailures = prometheus.NewDesc("shardmq_queue_stats_failures_total",
		"Queue counts that missed at least one cluster.", nil, nil)
)

// NewQueueHealth returns the queue-health collector; register it and call
// Start. msgs may be nil; when set, series of subscriptions that no longer
// exist are removed from it at every tick.
func NewQueueHealth(every time.Duration, src StatsSource, subs SubscriptionGetter, labels *Labels, msgs *Messages,
	leading func() bool, now func() time.Time, log *slog.Logger) *QueueHealth {
	if leading == nil {
		leading = func() bool { return true }
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &QueueHealth{every: every, src: src, subs: subs, labels: labels, msgs: msgs, leading: leading, now: now, log: log}
}

// OnCount makes every count also call fn with the subscriptions counted
// and the clusters it did not reach (the operators' page keeps its
// sparklines from it: ui.History). Call it before Start.
func (q *QueueHealth) OnCount(fn func(at time.Time, subs []store.QueueStats, missing []string)) {
	q.onCount = fn
}

// Start counts at once and then every interval until Stop.
func (q *QueueHealth) Start(ctx context.Context) {
	q.startOnce.Do(func() {
		ctx, q.cancel = context.WithCancel(ctx)
		q.done = make(chan struct{})
		go q.loop(ctx)
	})
}

// Stop ends the loop and waits for it. Safe to call twice, and without
// Start.
func (q *QueueHealth) Stop() {
	q.stopOnce.Do(func() {
		if q.cancel != nil {
			q.cancel()
			<-q.done
		}
	})
}

func (q *QueueHealth) loop(ctx context.Context) {
	defer close(q.done)
	for {
		q.Refresh(ctx)
		// A count over a large backlog is slow (measured: 0.5 s for 100k
		// live deliveries, 6 s for 1M): the next one waits at least ten
		// times as long as this took, so counting never takes more than
		// a tenth of a database's time.
		wait := q.every
		if s := q.snap.Load(); s != nil {
			wait = max(wait, 10*s.took)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Refresh counts now (the loop's tick; tests call it to count at a known
// moment). It also removes the message series of deleted subscriptions.
func (q *QueueHealth) Refresh(ctx context.Context) {
	q.forgetDeleted(ctx)
	if !q.leading() {
		q.snap.Store(nil)
		return
	}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, q.every+5*time.Second)
	st := q.src.Stats(cctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if len(st.Missing) > 0 {
		q.failures.Add(1)
		q.log.Warn("queue health counted without some clusters", "missing", st.Missing)
	}
	at := q.now()
	q.snap.Store(&queueSnapshot{at: at, took: time.Since(start), missing: len(st.Missing), onReplica: len(st.OnReplica), rows: q.rows(st.Subscriptions)})
	if q.onCount != nil {
		q.onCount(at, st.Subscriptions, st.Missing)
	}
}

// rows maps subscriptions to their bounded label values, summing those
// that share one (_other): counts add up, the oldest is the oldest.
func (q *QueueHealth) rows(subs []store.QueueStats) []queueRow {
	byLabel := map[[2]string]*queueRow{}
	var out []*queueRow
	for _, s := range subs {
		t, sub := q.labels.Pair(s.Topic, s.Subscription)
		k := [2]string{t, sub}
		r := byLabel[k]
		if r == nil {
			r = &queueRow{topic: t, sub: sub}
			byLabel[k] = r
			out = append(out, r)
		}
		for i, n := range [5]int64{s.Ready, s.Delayed, s.InFlight, s.Parked, s.Dead} {
			r.counts[i] += n
		}
		if s.OldestReady != 0 {
			at := idgen.Time(s.OldestReady)
			if r.oldest.IsZero() || at.Before(r.oldest) {
				r.oldest = at
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].topic != out[j].topic {
			return out[i].topic < out[j].topic
		}
		return out[i].sub < out[j].sub
	})
	rows := make([]queueRow, len(out))
	for i, r := range out {
		rows[i] = *r
	}
	return rows
}

// forgetDeleted removes the message series of subscriptions that are gone
// (deleted through any router).
func (q *QueueHealth) forgetDeleted(ctx context.Context) {
	if q.msgs == nil || q.subs == nil {
		return
	}
	for _, p := range q.labels.Pairs() {
		if _, ok, err := q.subs.Get(ctx, p[0], p[1]); err == nil && !ok {
			q.msgs.Forget(p[0], p[1])
		}
	}
}

// Describe implements prometheus.Collector.
func (q *QueueHealth) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descOldest, descQueueAge, descQueueTook, descQueueMissing, descQueueReplica, descQueueFailures} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last count, no query.
func (q *QueueHealth) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descQueueFailures, prometheus.CounterValue, float64(q.failures.Load()))
	s := q.snap.Load()
	if s == nil {
		return
	}
	now := q.now()
	ch <- prometheus.MustNewConstMetric(descQueueAge, prometheus.GaugeValue, max(now.Sub(s.at).Seconds(), 0))
	ch <- prometheus.MustNewConstMetric(descQueueTook, prometheus.GaugeValue, s.took.Seconds())
	ch <- prometheus.MustNewConstMetric(descQueueMissing, prometheus.GaugeValue, float64(s.missing))
	ch <- prometheus.MustNewConstMetric(descQueueReplica, prometheus.GaugeValue, float64(s.onReplica))
	for _, r := range s.rows {
		for i, st := range queueStates {
			ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(r.counts[i]), r.topic, r.sub, st)
		}
		age := 0.0
		if !r.oldest.IsZero() {
			age = max(now.Sub(r.oldest).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, age, r.topic, r.sub)
	}
}
