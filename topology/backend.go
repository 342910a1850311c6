package topology

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardmq/shardmq/routing"
)

// Backend is what a fleet of routers and the resharding job coordinate
// through: the topology itself (Source), check-and-set writes of the shard
// map, router registrations that publish the shard-map version each router
// has applied (the resharding barrier waits on them), and the lock that
// elects one router to run the background jobs.
//
// Two backends implement it: the static file (FileBackend, one router) and
// Consul (package topology/consul, many routers). Both pass the suite in
// package topology/topologytest.
type Backend interface {
	Source
	// ShardMap returns the stored shard map: the one routers are moving
	// to, not necessarily one that any router has applied yet.
	ShardMap(ctx context.Context) (*routing.Map, error)
	// UpdateShardMap replaces the stored map, which the caller read at
	// version prev, by next. It is a check-and-set: when the stored
	// version is no longer prev the write is refused with a
	// *ConflictError and nothing changes. next must be valid and its
	// version above prev (ErrInvalid otherwise) and above every version
	// a live router applied (ErrBehind otherwise): writers take it from
	// NextVersion, or write through WriteShardMap.
	UpdateShardMap(ctx context.Context, prev int64, next *routing.Map) error
	// Applied lists what every live router reports routing with.
	Applied(ctx context.Context) ([]AppliedMap, error)
	// Register counts this router, named id, among the live routers until
	// the Registration is stopped, ctx is done or the router dies. A new
	// registration has applied version 0, so a router registers before it
	// loads the topology and cannot slip past a barrier while it starts.
	Register(ctx context.Context, id string) (Registration, error)
	// WaitApplied returns once every live router has published an applied
	// shard-map version ≥ version, or when ctx is done. Routers that died
	// (their registration expired) do not hold it up.
	WaitApplied(ctx context.Context, version int64) error
	// Leader returns the election of the router that runs background
	// jobs; id names this router in it. It does nothing until Start.
	Leader(id string) Leader
}

// Registration is one router's presence among the live routers.
type Registration interface {
	// Publish records that the router now routes with shard-map version
	// v. It does not block: the backend writes it as soon as it can, and
	// a lower version than one already published is ignored.
	Publish(v int64)
	// Stop removes the router from the live routers. Safe to call twice.
	Stop()
}

// SelfFencer is a Registration that can tell whether the router still
// counts among the live routers (Consul: its session renewed recently).
// A router whose registration is not current self-fences: it stops
// writing and hands its in-memory leases to the table, so that a
// resharding barrier that no longer waits for it cannot pass while it
// still writes (docs/consul.md, "Self-fencing").
type SelfFencer interface {
	Current(now time.Time) bool
}

// Leader is the election of the one router that runs the background jobs
// (partition upkeep, retention, reconciliation, dead-letter alarms,
// resharding steps). It is declared here, beside Source, because every
// topology backend provides one: Consul elects with a session lock, the
// static file has a single router which always leads (SoleLeader).
//
// A job runner loops on Leading:
//
//	for {
//		lost, err := leader.Leading(ctx)
//		if err != nil {
//			return // ctx done
//		}
//		runJobsUntil(ctx, lost)
//	}
type Leader interface {
	// Start campaigns until Stop or ctx is done.
	Start(ctx context.Context)
	// Stop resigns (handing the lock to another router at once) and stops
	// campaigning. Safe to call twice.
	Stop()
	// IsLeader says whether this router leads now.
	IsLeader() bool
	// Leading blocks until this router leads, then returns a channel that
	// is closed when it stops leading. It returns ctx's error if ctx is
	// done first.
	Leading(ctx context.Context) (<-chan struct{}, error)
}

// ErrConflict marks a check-and-set write refused because the stored value
// changed since the writer read it.
var ErrConflict = errors.New("check-and-set conflict")

// ConflictError is a refused shard-map write: the writer expected to replace
// version Want, the store holds version Have (0 when no valid map is
// stored). It unwraps to ErrConflict.
type ConflictError struct {
	Want, Have int64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("shard map: expected to replace version %d, but the stored version is %d", e.Want, e.Have)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// CheckNext validates next as the successor of the map at version prev.
func CheckNext(prev int64, next *routing.Map) error {
	switch {
	case next == nil:
		return fmt.Errorf("%w: shard map is nil", ErrInvalid)
	case next.Version() <= prev:
		return fmt.Errorf("%w: new shard map version %d must be above %d", ErrInvalid, next.Version(), prev)
	}
	return nil
}

// SoleLeader is the Leader of a router that runs alone (the static
// topology): it leads from Start until Stop.
type SoleLeader struct {
	mu      sync.Mutex
	leading bool
	stopped bool
	lost    chan struct{} // closed when leadership ends
	gained  chan struct{} // closed when leadership starts
}

var _ Leader = (*SoleLeader)(nil)

// NewSoleLeader returns a leader that leads once started.
func NewSoleLeader() *SoleLeader {
	return &SoleLeader{lost: make(chan struct{}), gained: make(chan struct{})}
}

// Start implements Leader.
func (l *SoleLeader) Start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.leading {
		return
	}
	l.leading = true
	close(l.gained)
	go func() {
		select {
		case <-ctx.Done():
			l.Stop()
		case <-l.lost:
		}
	}()
}

// Stop implements Leader.
func (l *SoleLeader) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	l.stopped, l.leading = true, false
	close(l.lost)
}

// IsLeader implements Leader.
func (l *SoleLeader) IsLeader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Leading implements Leader. After Stop it never leads again.
func (l *SoleLeader) Leading(ctx context.Context) (<-chan struct{}, error) {
	select {
	case <-l.gained:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if !l.IsLeader() { // stopped: it never leads again
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.lost, nil
}

// Publishing wraps src so that while it is watched, reg publishes the
// shard map the router actually routes with (its version, and its digest
// when reg is a MapPublisher), read from applied: at
// the start of Watch, after every topology handed to the router, and every
// publishEvery in case the router applied one later (after a retry) or
// kept its map. The caller publishes once more after building the router
// from Load, if it wants the barrier to see the router before it serves.
func Publishing(src Source, reg Registration, applied func() *routing.Map) Source {
	return &publishing{Source: src, reg: reg, applied: applied}
}

const publishEvery = 250 * time.Millisecond

type publishing struct {
	Source
	reg     Registration
	applied func() *routing.Map
}

func (p *publishing) Watch(ctx context.Context, apply func(*Topology)) {
	PublishMap(p.reg, p.applied())
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		defer close(done)
		t := time.NewTicker(publishEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				PublishMap(p.reg, p.applied())
			}
		}
	}()
	p.Source.Watch(ctx, func(t *Topology) {
		apply(t)
		PublishMap(p.reg, p.applied())
	})
}

// Stale passes the wrapped source's staleness through (false when it has
// no such notion).
func (p *publishing) Stale() (bool, error) {
	if s, ok := p.Source.(interface{ Stale() (bool, error) }); ok {
		return s.Stale()
	}
	return false, nil
}
