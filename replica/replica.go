// Package replica measures how far each replica of each cluster lags behind
// its primary and picks the replica a read should go to.
//
// Every Every, per cluster, the monitor reads on each replica the heartbeat
// row this router last wrote on the primary, and the replica's replication
// status; then it writes a new heartbeat on the primary. A replica that has
// applied the router's newest heartbeat lags by less than one beat (lag 0);
// one that has not is at most now − (newest beat it has) behind — an upper
// bound, so a replica is never thought fresher than it is; one that has
// not applied even the first beat written on its primary is at least
// now − (first beat) behind. Seconds_Behind_Master is used only before the
// first beat is committed (start, failover). A replica whose SQL thread is
// stopped does not qualify whatever its heartbeat says.
//
// Reads (trace, lookups, reconciliation scans) go to the least-lagged
// replica under MaxLag (Pick) and to the primary when none qualifies; when
// the primary itself cannot be reached, Best offers the freshest reachable
// replica whatever its lag, so that an operator can still read, and is told
// how stale the answer may be.
//
// Pools (pools.go) is the router's one connection pool per replica DSN,
// which the monitor's checks, the reads it hands out and the router's
// replicated-durability waits share.
package replica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/store"
)

// Config tunes a Monitor. Zero fields take the defaults named.
type Config struct {
	// Every is the heartbeat and lag-check interval, and so the resolution
	// of the lag. Defaults to 250ms.
	Every time.Duration
	// MaxLag is the most a replica may lag to serve reads. Defaults to 5s.
	MaxLag time.Duration
	// Timeout bounds each check and each heartbeat write. Defaults to 1s.
	Timeout time.Duration
	// Router names this router's heartbeat row. Defaults to a random name:
	// rows of routers that stopped are purged after an hour.
	Router string
	// Pools are the replicas' connection pools, shared with every other
	// use of them (durability waits). The owner of a registry handed in
	// makes it follow the topology and closes it; the monitor only uses
	// it. Defaults to a registry of the monitor's own, which Update
	// follows and Stop closes.
	Pools *Pools
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Log defaults to discarding.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Every <= 0 {
		c.Every = 250 * time.Millisecond
	}
	if c.MaxLag <= 0 {
		c.MaxLag = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Router == "" {
		var b [6]byte
		rand.Read(b[:])
		c.Router = "r-" + hex.EncodeToString(b[:])
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Heartbeats is what the monitor does on a cluster's primary: write this
// router's heartbeat, and purge the rows of routers gone for an hour.
type Heartbeats interface {
	WriteHeartbeat(ctx context.Context, router string, at time.Time) error
	PurgeHeartbeats(ctx context.Context, before time.Time) error
}

// Primary is the call point of a cluster's primary: Do runs fn on it (the
// router's carries the endpoint's breaker, circuit.Endpoint). A Primary
// must be comparable: Update tells a replaced primary by it.
type Primary interface {
	Do(ctx context.Context, fn func(ctx context.Context, h Heartbeats) error) error
}

// Direct is a Primary with nothing between the monitor and the store.
type Direct struct{ Heartbeats }

// Do implements Primary.
func (d Direct) Do(ctx context.Context, fn func(ctx context.Context, h Heartbeats) error) error {
	return fn(ctx, d.Heartbeats)
}

// Cluster is what the monitor watches of one cluster.
type Cluster struct {
	Name     string
	Primary  Primary
	Replicas []string // DSNs
}

// Addr returns the host:port of a DSN (go-sql-driver form), the name of an
// endpoint in logs, admin and metrics; never the credentials.
func Addr(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "(unparsable DSN)"
	}
	return cfg.Addr
}

// Status is what the monitor knows of one replica.
type Status struct {
	Endpoint string `json:"endpoint"`
	// Lag is the measured lag; -1 when unknown.
	Lag time.Duration `json:"-"`
	// LagMS is Lag in milliseconds; -1 when unknown.
	LagMS         int64     `json:"lag_ms"`
	IORunning     bool      `json:"io_running"`
	SQLRunning    bool      `json:"sql_running"`
	SecondsBehind int       `json:"seconds_behind_master"`
	Eligible      bool      `json:"eligible"` // serves reads now
	Error         string    `json:"error,omitempty"`
	CheckedAt     time.Time `json:"checked_at"`
}

// Replica is a replica chosen for a read.
type Replica struct {
	Endpoint string
	Store    *store.Store
	Lag      time.Duration
}

type replicaState struct {
	dsn       string
	status    Status
	reachable bool // the last check got an answer
}

type clusterState struct {
	name      string
	primary   Primary
	replicas  map[string]*replicaState // by DSN
	order     []string                 // DSNs as the topology lists them
	lastBeat  time.Time                // newest heartbeat committed on the primary
	firstBeat time.Time                // first heartbeat committed on this primary
	beatErr   string
	purged    bool
	stop      context.CancelFunc
	done      chan struct{}
}

// Monitor keeps every cluster's replica lags fresh in the background. Safe
// for concurrent use; the zero value is not usable, call New.
type Monitor struct {
	cfg       Config
	pools     *Pools
	ownsPools bool // made by New: Update follows it, Stop closes it

	mu       sync.Mutex
	ctx      context.Context
	cancel   context.CancelFunc
	clusters map[string]*clusterState
	stopped  bool
}

// New returns a monitor; it watches nothing until Start and Update.
func New(cfg Config) *Monitor {
	m := &Monitor{cfg: cfg.withDefaults(), pools: cfg.Pools, clusters: map[string]*clusterState{}}
	if m.pools == nil {
		m.pools, m.ownsPools = NewPools(PoolConfig{}), true
	}
	return m
}

// Config returns the monitor's configuration with defaults filled.
func (m *Monitor) Config() Config { return m.cfg }

// Start lets the monitor run its checks until ctx is done or Stop. Clusters
// given to Update before Start begin at Start. Safe to call twice.
func (m *Monitor) Start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx != nil || m.stopped {
		return
	}
	m.ctx, m.cancel = context.WithCancel(ctx)
	for _, c := range m.clusters {
		m.run(c)
	}
}

// Stop ends every check and waits for them; it closes the replica pools
// when they are the monitor's own (Config.Pools). Safe to call twice.
func (m *Monitor) Stop() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.stopped = true
	if m.cancel != nil {
		m.cancel()
	}
	clusters := m.clusters
	m.clusters = map[string]*clusterState{}
	m.mu.Unlock()
	for _, c := range clusters {
		m.retire(c)
	}
	if m.ownsPools {
		m.pools.Close()
	}
}

// Update makes the monitor watch clusters and only them: new clusters and
// replicas are added, those no longer listed are dropped, and a cluster's
// primary is replaced. When the pools are the monitor's own, they follow
// (the pools of dropped replicas close).
func (m *Monitor) Update(clusters []Cluster) {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	var gone []*clusterState
	keep := map[string]bool{}
	for _, c := range clusters {
		keep[c.Name] = true
		cs, ok := m.clusters[c.Name]
		if !ok {
			cs = &clusterState{name: c.Name, replicas: map[string]*replicaState{}}
			m.clusters[c.Name] = cs
			if m.ctx != nil {
				defer m.run(cs)
			}
		}
		if cs.primary != c.Primary {
			cs.primary, cs.lastBeat, cs.firstBeat, cs.purged = c.Primary, time.Time{}, time.Time{}, false
		}
		listed := map[string]bool{}
		cs.order = append(cs.order[:0], c.Replicas...)
		for _, dsn := range c.Replicas {
			listed[dsn] = true
			if _, ok := cs.replicas[dsn]; !ok {
				cs.replicas[dsn] = &replicaState{dsn: dsn, status: Status{Endpoint: Addr(dsn), Lag: -1, LagMS: -1, SecondsBehind: -1, Error: "not checked yet"}}
			}
		}
		for dsn := range cs.replicas {
			if !listed[dsn] {
				delete(cs.replicas, dsn)
			}
		}
	}
	for name, cs := range m.clusters {
		if !keep[name] {
			delete(m.clusters, name)
			gone = append(gone, cs)
		}
	}
	m.mu.Unlock()
	if m.ownsPools {
		follow := make(map[string][]string, len(clusters))
		for _, c := range clusters {
			follow[c.Name] = c.Replicas
		}
		m.pools.Follow(follow)
	}
	for _, cs := range gone {
		go m.retire(cs)
	}
}

// run starts c's check loop; m.mu is held.
func (m *Monitor) run(c *clusterState) {
	ctx, cancel := context.WithCancel(m.ctx)
	c.stop, c.done = cancel, make(chan struct{})
	go func() {
		defer close(c.done)
		tick := time.NewTicker(m.cfg.Every)
		defer tick.Stop()
		for {
			m.check(ctx, c)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// retire stops c's loop and waits for it.
func (m *Monitor) retire(c *clusterState) {
	if c.stop != nil {
		c.stop()
		<-c.done
	}
}

// check measures every replica of c, then writes the next heartbeat.
func (m *Monitor) check(ctx context.Context, c *clusterState) {
	m.mu.Lock()
	reps := make([]*replicaState, 0, len(c.replicas))
	for _, r := range c.replicas {
		reps = append(reps, r)
	}
	primary, lastBeat, firstBeat, purged := c.primary, c.lastBeat, c.firstBeat, c.purged
	m.mu.Unlock()

	var wg sync.WaitGroup
	for _, r := range reps {
		wg.Go(func() { m.checkReplica(ctx, c, r, firstBeat, lastBeat) })
	}
	wg.Wait()
	if primary == nil || ctx.Err() != nil {
		return
	}
	at := m.cfg.Now().UTC().Truncate(time.Microsecond)
	wctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	err := primary.Do(wctx, func(ctx context.Context, h Heartbeats) error { return h.WriteHeartbeat(ctx, m.cfg.Router, at) })
	if err == nil && !purged {
		// Rows of routers gone for an hour; best effort. Update resets
		// purged when the primary changes, so it is read and written under
		// the lock and kept only for the primary it was done on.
		purge := func(ctx context.Context, h Heartbeats) error { return h.PurgeHeartbeats(ctx, at.Add(-time.Hour)) }
		if perr := primary.Do(wctx, purge); perr == nil {
			m.mu.Lock()
			if c.primary == primary {
				c.purged = true
			}
			m.mu.Unlock()
		}
	}
	cancel()
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.primary != primary {
		return // failed over meanwhile: this beat was for the old primary
	}
	if err != nil {
		if c.beatErr == "" {
			m.cfg.Log.Warn("heartbeat write failed", "cluster", c.name, "err", err)
		}
		c.beatErr = err.Error()
		return
	}
	c.beatErr = ""
	c.lastBeat = at
	if c.firstBeat.IsZero() {
		c.firstBeat = at
	}
}

func (m *Monitor) checkReplica(ctx context.Context, c *clusterState, r *replicaState, firstBeat, lastBeat time.Time) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	st := Status{Endpoint: Addr(r.dsn), Lag: -1, LagMS: -1, SecondsBehind: -1}
	reachable := false
	set := func() {
		st.CheckedAt = m.cfg.Now().UTC()
		if st.Lag >= 0 {
			st.LagMS = st.Lag.Milliseconds()
		}
		st.Eligible = st.Error == "" && st.SQLRunning && st.Lag >= 0 && st.Lag <= m.cfg.MaxLag
		m.mu.Lock()
		defer m.mu.Unlock()
		if cur, ok := c.replicas[r.dsn]; ok && cur == r {
			r.status, r.reachable = st, reachable
		}
	}
	pool, err := m.pools.Get(ctx, r.dsn)
	if err != nil {
		st.Error = fmt.Sprintf("connect: %v", err)
		set()
		return
	}
	rs, err := pool.ReplicationStatus(ctx)
	if err != nil {
		st.Error = err.Error()
		set()
		return
	}
	reachable = true
	st.IORunning, st.SQLRunning, st.SecondsBehind = rs.IORunning, rs.SQLRunning, rs.SecondsBehind
	if !rs.Replicating {
		st.Error = "not replicating from any primary"
	} else if rs.LastError != "" && !rs.SQLRunning {
		st.Error = "replication stopped: " + rs.LastError
	}
	beat, err := pool.ReadHeartbeat(ctx, m.cfg.Router)
	switch {
	case err == nil && !lastBeat.IsZero() && !beat.Before(lastBeat):
		st.Lag = 0
	case err == nil && !lastBeat.IsZero():
		st.Lag = max(m.cfg.Now().Sub(beat), 0)
	case errors.Is(err, store.ErrNotFound) && !firstBeat.IsZero() && m.cfg.Now().Sub(firstBeat) > m.cfg.Every:
		// It has not applied our first beat: at least that far behind.
		st.Lag = m.cfg.Now().Sub(firstBeat)
	case errors.Is(err, store.ErrNotFound) || err == nil:
		// No beat of ours committed yet (start, failover): the server's
		// own, coarser measure.
		if rs.SecondsBehind >= 0 {
			st.Lag = time.Duration(rs.SecondsBehind) * time.Second
		}
	default:
		st.Error = err.Error()
	}
	set()
}

// Pick returns the least-lagged replica of cluster that serves reads now
// (SQL thread running, lag measured and at most MaxLag); false when none
// does.
func (m *Monitor) Pick(cluster string) (Replica, bool) {
	return m.choose(cluster, func(r *replicaState) bool { return r.status.Eligible })
}

// Best returns the least-lagged reachable replica of cluster whatever its
// lag (unknown lag last): the read of last resort when the primary is down.
func (m *Monitor) Best(cluster string) (Replica, bool) {
	return m.choose(cluster, func(r *replicaState) bool { return r.reachable })
}

func (m *Monitor) choose(cluster string, ok func(*replicaState) bool) (Replica, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, found := m.clusters[cluster]
	if !found {
		return Replica{}, false
	}
	var best *replicaState
	var bestStore *store.Store
	for _, dsn := range c.order {
		r := c.replicas[dsn]
		if r == nil || !ok(r) {
			continue
		}
		// Only a pool open and still listed: one that left the topology
		// (closed) is never handed out.
		st, open := m.pools.Peek(dsn)
		if !open {
			continue
		}
		if best == nil || lagKey(r.status.Lag) < lagKey(best.status.Lag) {
			best, bestStore = r, st
		}
	}
	if best == nil {
		return Replica{}, false
	}
	return Replica{Endpoint: best.status.Endpoint, Store: bestStore, Lag: best.status.Lag}, true
}

func lagKey(l time.Duration) time.Duration {
	if l < 0 {
		return 1<<63 - 1
	}
	return l
}

// ClusterStatus is what the monitor knows of one cluster.
type ClusterStatus struct {
	Cluster string `json:"cluster"`
	// LastHeartbeat is the newest heartbeat committed on the primary.
	LastHeartbeat  time.Time `json:"last_heartbeat,omitzero"`
	HeartbeatError string    `json:"heartbeat_error,omitempty"`
	Replicas       []Status  `json:"replicas"`
}

// Status reports every cluster, sorted by name, replicas in topology order.
func (m *Monitor) Status() []ClusterStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ClusterStatus, 0, len(m.clusters))
	for _, c := range m.clusters {
		cs := ClusterStatus{Cluster: c.name, LastHeartbeat: c.lastBeat, HeartbeatError: c.beatErr, Replicas: []Status{}}
		for _, dsn := range c.order {
			if r := c.replicas[dsn]; r != nil {
				cs.Replicas = append(cs.Replicas, r.status)
			}
		}
		out = append(out, cs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out
}
