package replica

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/shardmq/shardmq/store"
)

// PoolConfig tunes Pools. Zero fields take the defaults named.
type PoolConfig struct {
	// MaxOpen caps the connections a router holds to one replica, for
	// every use of it together: lag checks, reads and durability waits.
	// Defaults to 24 (the 8 of the lag monitor's and the 16 of the
	// durability waits' pools it replaces).
	MaxOpen int
	// MaxWaits caps the GTID waits (Hold) in flight on one replica, each
	// of which keeps a connection for up to the durability timeout, so
	// that waits never take the connections the lag checks and reads
	// need. Defaults to 16; at most MaxOpen-1.
	MaxWaits int
	// Open connects to a replica. Defaults to store.Open with MaxOpen.
	Open func(ctx context.Context, dsn string) (*store.Store, error)
}

func (c PoolConfig) withDefaults() PoolConfig {
	if c.MaxOpen <= 1 {
		c.MaxOpen = 24
	}
	if c.MaxWaits <= 0 {
		c.MaxWaits = 16
	}
	c.MaxWaits = min(c.MaxWaits, c.MaxOpen-1)
	if c.Open == nil {
		maxOpen := c.MaxOpen
		c.Open = func(ctx context.Context, dsn string) (*store.Store, error) {
			return store.Open(ctx, dsn, store.Options{MaxOpen: maxOpen})
		}
	}
	return c
}

// Pools is the router's one connection pool per replica DSN: the lag
// monitor's checks, the reads it hands out (Pick, Best) and the
// replicated-durability waits all go through it, so that a replica sees
// one pool from a router, not one per use. A pool is opened on the first
// Get of a DSN the topology lists (Follow) and kept; it is closed when the
// DSN leaves the topology, and every pool is closed by Close. Safe for
// concurrent use.
type Pools struct {
	cfg PoolConfig

	mu     sync.Mutex
	listed map[string][]string // cluster → its replicas' DSNs, topology order
	member map[string]bool     // every listed DSN
	open   map[string]*pool    // by DSN, only listed ones
	closed bool
}

type pool struct {
	st    *store.Store
	waits chan struct{} // one token per GTID wait in flight (Hold)
}

// NewPools returns an empty registry; it lists no replica until Follow.
func NewPools(cfg PoolConfig) *Pools {
	return &Pools{cfg: cfg.withDefaults(), listed: map[string][]string{}, member: map[string]bool{}, open: map[string]*pool{}}
}

// ErrNotListed: the DSN is not a replica of the topology in use (it left,
// or has not been applied yet).
var ErrNotListed = errors.New("replica is not in the topology in use")

// errClosed: the registry is closed (the router is shutting down).
var errClosed = errors.New("replica pools are closed")

// Follow makes the registry list exactly replicas (cluster → DSNs): the
// pools of DSNs no longer listed are closed once the calls already using
// them return (database/sql's Close waits for them).
func (p *Pools) Follow(replicas map[string][]string) {
	listed := make(map[string][]string, len(replicas))
	member := map[string]bool{}
	for c, dsns := range replicas {
		listed[c] = append([]string(nil), dsns...)
		for _, dsn := range dsns {
			member[dsn] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.listed, p.member = listed, member
	for dsn, pl := range p.open {
		if !member[dsn] {
			delete(p.open, dsn)
			go pl.st.Close()
		}
	}
}

// Replicas returns cluster's replica DSNs in topology order.
func (p *Pools) Replicas(cluster string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listed[cluster]
}

// Get returns the pool of a listed replica, opening it on first use. A
// replica that cannot be reached is tried again on a later call.
func (p *Pools) Get(ctx context.Context, dsn string) (*store.Store, error) {
	pl, err := p.get(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return pl.st, nil
}

// Hold is Get for a GTID wait, which keeps its connection for long: it
// waits until fewer than MaxWaits waits are in flight on the replica, and
// release gives the slot back.
func (p *Pools) Hold(ctx context.Context, dsn string) (st *store.Store, release func(), err error) {
	pl, err := p.get(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	select {
	case pl.waits <- struct{}{}:
		return pl.st, func() { <-pl.waits }, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

func (p *Pools) get(ctx context.Context, dsn string) (*pool, error) {
	if pl, err := p.lookup(dsn); pl != nil || err != nil {
		return pl, err
	}
	st, err := p.cfg.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", Addr(dsn), err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		st.Close()
		return nil, errClosed
	case !p.member[dsn]:
		st.Close() // left while it was being opened
		return nil, fmt.Errorf("replica %s: %w", Addr(dsn), ErrNotListed)
	case p.open[dsn] != nil:
		st.Close() // opened twice at once; keep the first
		return p.open[dsn], nil
	}
	pl := &pool{st: st, waits: make(chan struct{}, p.cfg.MaxWaits)}
	p.open[dsn] = pl
	return pl, nil
}

// lookup returns dsn's open pool, or nil and no error when it is listed
// but not open yet.
func (p *Pools) lookup(dsn string) (*pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, errClosed
	case !p.member[dsn]:
		return nil, fmt.Errorf("replica %s: %w", Addr(dsn), ErrNotListed)
	}
	return p.open[dsn], nil
}

// Peek returns dsn's pool if it is listed and open, without opening it.
func (p *Pools) Peek(dsn string) (*store.Store, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl := p.open[dsn]; pl != nil {
		return pl.st, true
	}
	return nil, false
}

// DBs returns every open pool by replica DSN (tests; a DSN carries
// credentials, so it is no metric label).
func (p *Pools) DBs() map[string]*sql.DB {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]*sql.DB, len(p.open))
	for dsn, pl := range p.open {
		out[dsn] = pl.st.DB()
	}
	return out
}

// Close closes every pool and refuses later calls; it returns once the
// calls using them have returned. Safe to call twice.
func (p *Pools) Close() {
	p.mu.Lock()
	open := p.open
	p.closed, p.open = true, map[string]*pool{}
	p.listed, p.member = map[string][]string{}, map[string]bool{}
	p.mu.Unlock()
	for _, pl := range open { // outside the lock: Close waits for the calls in flight
		pl.st.Close()
	}
}
