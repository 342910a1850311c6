package observe

import (
	"database/sql"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descPoolOpen = prometheus.NewDesc("shardmq_pool_open_connections",
		"Connections open to a cluster's primary (in use and idle).", []string{"cluster"}, nil)
	descPoolInUse = prometheus.NewDesc("shardmq_pool_in_use_connections",
		"Connections to a cluster's primary in use now.", []string{"cluster"}, nil)
	descPoolIdle = prometheus.NewDesc("shardmq_pool_idle_connections",
		"Idle connections to a cluster's primary.", []string{"cluster"}, nil)
	descPoolMax = prometheus.NewDesc("shardmq_pool_max_open_connections",
		"The pool's cap on connections to a cluster's primary (-pool-max-open).", []string{"cluster"}, nil)
	descPoolWaits = prometheus.NewDesc("shardmq_pool_waits_total",
		"Times a request waited for a free connection to a cluster's primary.", []string{"cluster"}, nil)
	descPoolWaited = prometheus.NewDesc("shardmq_pool_wait_seconds_total",
		"Time spent waiting for a free connection to a cluster's primary.", []string{"cluster"}, nil)
)

// PoolCollector reads every cluster's connection pool (sql.DB.Stats) at
// scrape time; pools returns the pools in use by cluster name.
type PoolCollector struct {
	pools func() map[string]*sql.DB
}

// NewPoolCollector returns the collector of pools.
func NewPoolCollector(pools func() map[string]*sql.DB) PoolCollector { return PoolCollector{pools} }

// Describe implements prometheus.Collector.
func (c PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPoolOpen, descPoolInUse, descPoolIdle, descPoolMax, descPoolWaits, descPoolWaited} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c PoolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, db := range c.pools() {
		st := db.Stats()
		ch <- prometheus.MustNewConstMetric(descPoolOpen, prometheus.GaugeValue, float64(st.OpenConnections), name)
		ch <- prometheus.MustNewConstMetric(descPoolInUse, prometheus.GaugeValue, float64(st.InUse), name)
		ch <- prometheus.MustNewConstMetric(descPoolIdle, prometheus.GaugeValue, float64(st.Idle), name)
		ch <- prometheus.MustNewConstMetric(descPoolMax, prometheus.GaugeValue, float64(st.MaxOpenConnections), name)
		ch <- prometheus.MustNewConstMetric(descPoolWaits, prometheus.CounterValue, float64(st.WaitCount), name)
		ch <- prometheus.MustNewConstMetric(descPoolWaited, prometheus.CounterValue, st.WaitDuration.Seconds(), name)
	}
}
