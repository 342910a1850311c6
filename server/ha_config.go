package server

import (
	"log/slog"
	"time"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/replica"
)

// HAConfig tunes what keeps the router serving when an endpoint fails and
// off the primaries for reads: replica lag measurement and read routing,
// circuit breakers, failover, and reconciliation. Zero fields take the
// defaults their types name.
type HAConfig struct {
	// Replicas: heartbeat interval (Every, 250ms), lag limit for reads
	// (MaxLag, 5s), check timeout (1s). Now and Log are filled by the
	// router unless set; Pools always is (the router's ReplicaPools).
	Replicas replica.Config
	// ReplicaPools: the one connection pool per replica DSN that the lag
	// monitor, replica reads and durability waits share (24 connections,
	// of which at most 16 GTID waits).
	ReplicaPools replica.PoolConfig
	// Breakers: one per MySQL endpoint; 5 consecutive failures open it for
	// 2s, every call is bounded by 10s.
	Breakers circuit.Config
	// Lookups: scatter concurrency (8) and per-cluster timeout (2s).
	Lookups lookup.Config
	// Reconcile: window (48h), schedule (every 24h), page size, samples.
	// Subscriptions, Now and Log are filled by the router.
	Reconcile reconcile.Config
	// NoSchedule turns the daily reconciliation off (it still runs on
	// POST /v1/admin/reconcile).
	NoSchedule bool
	// WritableTimeout bounds the check that a newly named primary accepts
	// writes before the router switches to it. Defaults to 2s.
	WritableTimeout time.Duration
	// ReplicaReadTimeout bounds each trace and lookup read on a replica
	// (instead of the breakers' CallTimeout): a replica that stops
	// answering (a hung process, a partition) costs a read this long, the
	// timeout counts as a failure of its breaker, and the read goes to the
	// primary at once. Defaults to 1s.
	ReplicaReadTimeout time.Duration
}

// withDefaults fills the defaults, the router's clock and logger, and the
// replica pools the monitor uses (the router owns them: pools.go).
func (c HAConfig) withDefaults(log *slog.Logger, now func() time.Time, replicas *replica.Pools) HAConfig {
	c.Replicas.Pools = replicas
	if c.WritableTimeout <= 0 {
		c.WritableTimeout = 2 * time.Second
	}
	if c.ReplicaReadTimeout <= 0 {
		c.ReplicaReadTimeout = time.Second
	}
	if c.Replicas.Now == nil {
		c.Replicas.Now = now
	}
	if c.Replicas.Log == nil {
		c.Replicas.Log = log
	}
	if c.Lookups.Now == nil {
		c.Lookups.Now = now
	}
	if c.Reconcile.Now == nil {
		c.Reconcile.Now = now
	}
	if c.Reconcile.Log == nil {
		c.Reconcile.Log = log
	}
	if c.Breakers.OnStateChange == nil {
		c.Breakers.OnStateChange = func(endpoint, from, to string) {
			log.Warn("circuit breaker changed state", "endpoint", endpoint, "from", from, "to", to)
		}
	}
	return c
}
