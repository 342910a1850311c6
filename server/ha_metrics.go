package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/reconcile"
)

// haCollector exports breaker states, replica lag and health, and the last
// reconciliation's counts, read from their owners at scrape time.
type haCollector struct {
	eps   *endpoints
	recon *reconcile.Runner
}

var (
	descBreaker = prometheus.NewDesc("shardmq_breaker_state",
		"Circuit breaker of a MySQL endpoint: 0 closed, 1 half-open, 2 open.", []string{"endpoint"}, nil)
	descLag = prometheus.NewDesc("shardmq_replica_lag_seconds",
		"Measured replica lag (heartbeat based); -1 when unknown.", []string{"cluster", "endpoint"}, nil)
	descServes = prometheus.NewDesc("shardmq_replica_serves_reads",
		"1 when the replica is within the lag limit and replicating.", []string{"cluster", "endpoint"}, nil)
	descSQL = prometheus.NewDesc("shardmq_replica_sql_running",
		"1 when the replica's SQL thread runs.", []string{"cluster", "endpoint"}, nil)
	descBeat = prometheus.NewDesc("shardmq_primary_heartbeat_ok",
		"1 when the last heartbeat write to the cluster's primary succeeded.", []string{"cluster"}, nil)
	descRecScanned = prometheus.NewDesc("shardmq_reconcile_scanned_messages",
		"Messages checked by the last reconciliation run.", nil, nil)
	descRecFound = prometheus.NewDesc("shardmq_reconcile_findings",
		"Findings of the last reconciliation run, by kind.", []string{"kind"}, nil)
	descRecRepaired = prometheus.NewDesc("shardmq_reconcile_repaired",
		"Repairs made by the last reconciliation run, by kind.", []string{"kind"}, nil)
	descRecFailed = prometheus.NewDesc("shardmq_reconcile_failed_clusters",
		"Clusters whose walk did not finish in the last reconciliation run.", nil, nil)
	descRecLast = prometheus.NewDesc("shardmq_reconcile_last_run_timestamp_seconds",
		"When the last reconciliation run finished.", nil, nil)
)

func (c haCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBreaker, descLag, descServes, descSQL, descBeat,
		descRecScanned, descRecFound, descRecRepaired, descRecFailed, descRecLast} {
		ch <- d
	}
}

func (c haCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.eps.breakers.States() {
		v := 0.0
		switch s.State {
		case "half-open":
			v = 1
		case "open":
			v = 2
		}
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, v, s.Endpoint)
	}
	b := func(ok bool) float64 {
		if ok {
			return 1
		}
		return 0
	}
	for _, cs := range c.eps.monitor.Status() {
		ch <- prometheus.MustNewConstMetric(descBeat, prometheus.GaugeValue, b(cs.HeartbeatError == "" && !cs.LastHeartbeat.IsZero()), cs.Cluster)
		for _, r := range cs.Replicas {
			lag := -1.0
			if r.Lag >= 0 {
				lag = r.Lag.Seconds()
			}
			ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, lag, cs.Cluster, r.Endpoint)
			ch <- prometheus.MustNewConstMetric(descServes, prometheus.GaugeValue, b(r.Eligible), cs.Cluster, r.Endpoint)
			ch <- prometheus.MustNewConstMetric(descSQL, prometheus.GaugeValue, b(r.SQLRunning), cs.Cluster, r.Endpoint)
		}
	}
	if c.recon == nil {
		return
	}
	rep := c.recon.Last()
	if rep == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descRecScanned, prometheus.GaugeValue, float64(rep.Scanned))
	ch <- prometheus.MustNewConstMetric(descRecFailed, prometheus.GaugeValue, float64(len(rep.Failed())))
	ch <- prometheus.MustNewConstMetric(descRecLast, prometheus.GaugeValue, float64(rep.FinishedAt.UnixMilli())/1000)
	for k, n := range rep.Found {
		ch <- prometheus.MustNewConstMetric(descRecFound, prometheus.GaugeValue, float64(n), k)
	}
	for k, n := range rep.Repaired {
		ch <- prometheus.MustNewConstMetric(descRecRepaired, prometheus.GaugeValue, float64(n), k)
	}
}
