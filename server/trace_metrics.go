package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/broker"
)

var (
	descRejectedWritten = prometheus.NewDesc("shardmq_trace_cached_rejections_written_total",
		"Duplicate and conflict trace events of produce attempts answered from the recent-keys cache, written to the trace.", nil, nil)
	descRejectedDropped = prometheus.NewDesc("shardmq_trace_cached_rejections_dropped_total",
		"Such events not written (queue full, cluster unavailable, vshard frozen too long, router stopping): attempts missing from traces.", nil, nil)
)

// rejectedCollector reads the broker's counters of cache-answered
// duplicate and conflict events at scrape time.
type rejectedCollector struct{ b *broker.Broker }

func (c rejectedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRejectedWritten
	ch <- descRejectedDropped
}

func (c rejectedCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.b.RejectedTraceStats()
	ch <- prometheus.MustNewConstMetric(descRejectedWritten, prometheus.CounterValue, float64(s.Written))
	ch <- prometheus.MustNewConstMetric(descRejectedDropped, prometheus.CounterValue, float64(s.Dropped))
}
