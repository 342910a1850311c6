// Package circuit keeps one sick MySQL endpoint from taking the router down
// with it. Each endpoint (a primary or a replica, by host:port) has a
// circuit breaker (sony/gobreaker): after a run of failures it opens and
// calls to that endpoint fail at once with store.ErrUnavailable, so the
// vshards of a dead cluster are answered unavailable in microseconds while
// every other cluster serves as before; after OpenFor it lets a probe
// through (half-open) and closes again when the endpoint answers.
//
// Endpoint runs calls on an endpoint without failover of its own (a
// replica) through its breaker; a cluster's primary, which follows
// failover, is package cluster's Primary.
package circuit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/shardmq/shardmq/store"
)

// Config tunes every breaker of a set. Zero fields take the defaults named.
type Config struct {
	// Failures is how many consecutive failed calls open a breaker.
	// Defaults to 5.
	Failures uint32
	// OpenFor is how long an open breaker refuses calls before it lets a
	// probe through (half-open). Defaults to 2s.
	OpenFor time.Duration
	// Probes is how many calls a half-open breaker lets through; as many
	// successes close it, one failure opens it again. Defaults to 1.
	Probes uint32
	// CallTimeout bounds each call through a breaker, so that an endpoint
	// that stops answering (no RST: a partition, a stopped process) costs
	// a bounded time and counts as a failure. Defaults to 10s.
	CallTimeout time.Duration
	// OnStateChange, if set, is told every transition (logs, metrics).
	OnStateChange func(endpoint string, from, to string)
}

func (c Config) withDefaults() Config {
	if c.Failures == 0 {
		c.Failures = 5
	}
	if c.OpenFor <= 0 {
		c.OpenFor = 2 * time.Second
	}
	if c.Probes == 0 {
		c.Probes = 1
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 10 * time.Second
	}
	return c
}

// ErrOpen is wrapped (with store.ErrUnavailable) in the error of a call that
// a breaker refused.
var ErrOpen = errors.New("circuit breaker open")

// Breaker guards one endpoint.
type Breaker struct {
	endpoint string
	timeout  time.Duration
	cb       *gobreaker.CircuitBreaker[struct{}]
}

// failure and excluded carry a call's verdict through gobreaker.
type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

type excluded struct{ err error }

func (e excluded) Error() string { return e.err.Error() }
func (e excluded) Unwrap() error { return e.err }

func newBreaker(endpoint string, c Config) *Breaker {
	st := gobreaker.Settings{
		Name:        endpoint,
		MaxRequests: c.Probes,
		Timeout:     c.OpenFor,
		ReadyToTrip: func(n gobreaker.Counts) bool { return n.ConsecutiveFailures >= c.Failures },
		IsSuccessful: func(err error) bool {
			var f failure
			return !errors.As(err, &f)
		},
		IsExcluded: func(err error) bool {
			var e excluded
			return errors.As(err, &e)
		},
	}
	if c.OnStateChange != nil {
		st.OnStateChange = func(name string, from, to gobreaker.State) { c.OnStateChange(name, from.String(), to.String()) }
	}
	return &Breaker{endpoint: endpoint, timeout: c.CallTimeout, cb: gobreaker.NewCircuitBreaker[struct{}](st)}
}

// Endpoint is the host:port the breaker guards.
func (b *Breaker) Endpoint() string { return b.endpoint }

// State is "closed", "open" or "half-open".
func (b *Breaker) State() string { return b.cb.State().String() }

// Do runs fn through the breaker with a context bounded by CallTimeout. An
// error that says the endpoint is unreachable (store.ErrUnavailable, or
// the call's own timeout) counts as a failure; any other answer — not
// found, a constraint, a refusal by the shard fence (store.ErrFenced,
// though it is unavailable to the caller) — is the endpoint working and
// counts as a success;
// the caller giving up (its context ends) counts as neither. A refused
// call returns an error that wraps store.ErrUnavailable and ErrOpen.
func (b *Breaker) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return b.DoWithin(ctx, b.timeout, fn)
}

// DoWithin is Do with the call bounded by timeout instead of CallTimeout:
// a read that has a cheaper place to go (a replica read, which falls back
// to the primary) waits less for a hung endpoint, and its timeout counts
// as the endpoint's failure all the same.
func (b *Breaker) DoWithin(ctx context.Context, timeout time.Duration, fn func(ctx context.Context) error) error {
	if timeout <= 0 {
		timeout = b.timeout
	}
	_, err := b.cb.Execute(func() (struct{}, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := fn(cctx)
		switch {
		case err == nil:
			return struct{}{}, nil
		case ctx.Err() != nil:
			return struct{}{}, excluded{err}
		case errors.Is(err, store.ErrFenced):
			// The endpoint answered: the caller's map is stale.
			return struct{}{}, err
		case errors.Is(err, store.ErrUnavailable) || cctx.Err() != nil:
			return struct{}{}, failure{err}
		}
		return struct{}{}, err
	})
	switch {
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests):
		return fmt.Errorf("%w: %w for %s (%v)", store.ErrUnavailable, ErrOpen, b.endpoint, err)
	}
	var f failure
	if errors.As(err, &f) {
		err = f.err
		if !errors.Is(err, store.ErrUnavailable) {
			err = fmt.Errorf("%w: %s did not answer in time: %v", store.ErrUnavailable, b.endpoint, err)
		}
		return err
	}
	var e excluded
	if errors.As(err, &e) {
		return e.err
	}
	return err
}

// Set holds the breakers of every endpoint the router uses, so that an
// endpoint keeps its breaker across topology reloads. Safe for concurrent
// use.
type Set struct {
	cfg Config
	mu  sync.Mutex
	bs  map[string]*Breaker
}

// NewSet returns an empty set whose breakers use cfg.
func NewSet(cfg Config) *Set {
	return &Set{cfg: cfg.withDefaults(), bs: map[string]*Breaker{}}
}

// For returns endpoint's breaker, creating it closed.
func (s *Set) For(endpoint string) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bs[endpoint]
	if !ok {
		b = newBreaker(endpoint, s.cfg)
		s.bs[endpoint] = b
	}
	return b
}

// Retain forgets the breakers of endpoints not in keep (retired by a
// topology change).
func (s *Set) Retain(keep map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ep := range s.bs {
		if !keep[ep] {
			delete(s.bs, ep)
		}
	}
}

// State is one breaker's state for admin and metrics.
type State struct {
	Endpoint string `json:"endpoint"`
	State    string `json:"state"`
	// ConsecutiveFailures in the current state.
	ConsecutiveFailures uint32 `json:"consecutive_failures"`
}

// States lists every breaker, by endpoint.
func (s *Set) States() []State {
	s.mu.Lock()
	bs := make([]*Breaker, 0, len(s.bs))
	for _, b := range s.bs {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	out := make([]State, len(bs))
	for i, b := range bs {
		out[i] = State{Endpoint: b.endpoint, State: b.State(), ConsecutiveFailures: b.cb.Counts().ConsecutiveFailures}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint < out[j].Endpoint })
	return out
}

// Endpoint is the call point of one endpoint that has no failover of its
// own — a replica, or a primary's reads for trace lookups and
// reconciliation: fn runs on S through the endpoint's breaker, bounded by
// Timeout (zero: the breaker's CallTimeout).
type Endpoint[S any] struct {
	S       S
	Breaker *Breaker
	Timeout time.Duration
}

// Do runs fn on e.S through the breaker. fn must use the context it is
// given.
func (e Endpoint[S]) Do(ctx context.Context, fn func(ctx context.Context, s S) error) error {
	return e.Breaker.DoWithin(ctx, e.Timeout, func(ctx context.Context) error { return fn(ctx, e.S) })
}
