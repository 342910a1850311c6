package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/replica"
	"github.com/shardmq/shardmq/store"
)

// Conn is one cluster's primary as the router holds it: its connection
// pool, its endpoint, its breaker-guarded call point and the Cluster over
// that call point.
type Conn struct {
	Name     string
	DSN      string
	Endpoint string // host:port, the breaker's and the logs' name
	Store    *store.Store
	Primary  *Primary
	Cluster  *Cluster
}

// SetConfig is what a Set builds its clusters with.
type SetConfig struct {
	// Options are a cluster's pool options.
	Options func(cluster string) store.Options
	// Breaker is an endpoint's breaker (circuit.Set.For).
	Breaker func(endpoint string) *circuit.Breaker
	// Observe, when not nil, gives a cluster's observer (metrics).
	Observe func(cluster string) Observer
	// Cluster tunes each cluster's group commits.
	Cluster Config
	Now     func() time.Time
	Log     *slog.Logger
}

// Set is the router's clusters: each cluster's primary pool — opened and
// migrated when the cluster first appears or its primary changes,
// checked before use, and closed when it is replaced (after the requests
// already routed to it are surely done) — with its breaker-guarded call
// point, which hands its calls over to the successor on failover
// (Primary.Retire), and the Cluster over it.
type Set struct {
	cfg SetConfig

	mu      sync.Mutex
	conns   map[string]*Conn // by cluster name
	leaving map[string]*Conn // left the topology; retired by Retain
}

// NewSet returns an empty set.
func NewSet(cfg SetConfig) *Set {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Set{cfg: cfg, conns: map[string]*Conn{}, leaving: map[string]*Conn{}}
}

// retiredPoolClose is how long a replaced pool stays open for the
// requests already routed to it.
const retiredPoolClose = 30 * time.Second

// Update opens pools for the clusters of primaries (cluster → primary
// DSN) that are new or whose primary changed, migrates them and runs
// check on each (is it writable?), then swaps them in: a changed
// primary's call point hands over to its successor, and the pools of
// primaries that left close once the requests routed to them are done
// (the call points of clusters that left the topology retire on Retain).
// On an error nothing changes. It returns every cluster in use.
func (s *Set) Update(ctx context.Context, primaries map[string]string, check func(ctx context.Context, cluster string, st *store.Store) error) (map[string]*Cluster, error) {
	s.mu.Lock()
	have := make(map[string]*Conn, len(s.conns))
	for k, v := range s.conns {
		have[k] = v
	}
	s.mu.Unlock()

	var mu sync.Mutex
	fresh := map[string]*store.Store{}
	g, gctx := errgroup.WithContext(ctx)
	for name, dsn := range primaries {
		if c, ok := have[name]; ok && c.DSN == dsn {
			continue
		}
		g.Go(func() error {
			st, err := store.Open(gctx, dsn, s.cfg.Options(name))
			if err != nil {
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := st.Migrate(gctx, s.cfg.Now()); err != nil {
				st.Close()
				return fmt.Errorf("cluster %s primary: %w", name, err)
			}
			if err := check(gctx, name, st); err != nil {
				st.Close()
				return err
			}
			if warn, err := st.DurabilityWarnings(gctx); err == nil {
				for _, w := range warn {
					s.cfg.Log.Warn("primary is not fully durable: acknowledged messages can be lost in a crash", "cluster", name, "setting", w)
				}
			}
			mu.Lock()
			fresh[name] = st
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		for _, st := range fresh {
			st.Close()
		}
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var retired []*store.Store
	for name, c := range s.conns {
		if _, still := primaries[name]; !still {
			retired = append(retired, c.Store)
			s.leaving[name] = c
			delete(s.conns, name)
		}
	}
	for name, st := range fresh {
		c := s.connect(name, primaries[name], st)
		if old, ok := s.conns[name]; ok {
			retired = append(retired, old.Store)
			old.Primary.Retire(c.Primary)
			s.cfg.Log.Info("cluster primary switched", "cluster", name, "from", old.Endpoint, "to", c.Endpoint)
		} else if old, ok := s.leaving[name]; ok {
			// Back before its call point retired: hand over to the new one.
			delete(s.leaving, name)
			old.Primary.Retire(c.Primary)
		}
		s.conns[name] = c
	}
	// Requests already routed to a retired pool finish on it; close it
	// once they are surely done.
	for _, st := range retired {
		time.AfterFunc(retiredPoolClose, func() { st.Close() })
	}
	out := make(map[string]*Cluster, len(s.conns))
	for name, c := range s.conns {
		out[name] = c.Cluster
	}
	return out, nil
}

// connect builds a cluster's call point and Cluster over its pool st.
func (s *Set) connect(name, dsn string, st *store.Store) *Conn {
	ep := replica.Addr(dsn)
	p := NewPrimary(st, s.cfg.Breaker(ep))
	var conn Caller = p
	if s.cfg.Observe != nil {
		conn = Observe(p, s.cfg.Observe(name))
	}
	return &Conn{Name: name, DSN: dsn, Endpoint: ep, Store: st, Primary: p, Cluster: New(name, conn, s.cfg.Cluster)}
}

// Retain retires the call points of the clusters that left the topology
// (calls on them then fail unavailable), once nothing routes to them any
// more.
func (s *Set) Retain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, c := range s.leaving {
		c.Primary.Retire(nil)
		delete(s.leaving, name)
	}
}

// Conn returns cluster's primary in use.
func (s *Set) Conn(cluster string) (*Conn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.conns[cluster]
	return c, ok
}

// Conns is a snapshot of the primaries in use, by cluster.
func (s *Set) Conns() map[string]*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*Conn, len(s.conns))
	for n, c := range s.conns {
		out[n] = c
	}
	return out
}

// Stores returns each cluster's primary pool by cluster name.
func (s *Set) Stores() map[string]*store.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*store.Store, len(s.conns))
	for k, v := range s.conns {
		out[k] = v.Store
	}
	return out
}

// Close closes every primary's pool in use.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Store.Close()
	}
}
