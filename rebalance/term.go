package rebalance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/shardmq/shardmq/store"
)

// A leader's term. Each time a router starts to lead, it takes the next
// epoch in the jobs' document (check-and-set, so two leaders never share
// one) and uses, on every cluster, connections of its own registered
// under that epoch (store/reshard_session.go). Opening them takes the
// cluster over: the connections of older epochs are killed first, so a
// leader that stalled inside a step — stopped with a transaction open and
// rows locked — holds nothing once its successor touches the cluster. A
// stalled leader that wakes finds its connections gone and new ones
// refused (store.ErrSuperseded); it stops running jobs until its election
// says it lost and won again.

// Session is a cluster's primary as one leader's jobs use it: its own
// connections, registered under the leader's epoch, under the statement
// and lock-wait limits of a reshard.
type Session interface {
	Mover
	Close() error
}

// OpenSession opens the session of leader epoch on cluster, ending the
// transactions of older epochs there first.
type OpenSession func(ctx context.Context, cluster string, epoch int64) (Session, error)

// terms holds the current term's epoch and sessions.
type terms struct {
	open OpenSession
	log  *slog.Logger

	mu         sync.Mutex
	epoch      int64
	sessions   map[string]Session
	superseded chan struct{} // closed when a cluster refused this term
}

// begin starts the term of epoch.
func (t *terms) begin(epoch int64) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.epoch, t.sessions, t.superseded = epoch, map[string]Session{}, make(chan struct{})
	return t.superseded
}

// end closes the term's sessions.
func (t *terms) end() {
	t.mu.Lock()
	ss := t.sessions
	t.sessions = nil
	t.mu.Unlock()
	for _, s := range ss {
		s.Close()
	}
}

// supersede records that a newer leader took over: the term's jobs stop.
func (t *terms) supersede(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.superseded == nil {
		return
	}
	select {
	case <-t.superseded:
	default:
		t.log.Warn("reshard: a newer leader took over a cluster; this router stops running jobs until it leads again", "epoch", t.epoch, "err", err)
		close(t.superseded)
	}
}

// session returns the term's session on cluster, opening it on first use.
// The lock is held while it opens: the takeover of a cluster happens once.
func (t *terms) session(ctx context.Context, cluster string) (Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions == nil {
		return nil, fmt.Errorf("reshard: no leader term is running")
	}
	if s, ok := t.sessions[cluster]; ok {
		return s, nil
	}
	s, err := t.open(ctx, cluster, t.epoch)
	if err != nil {
		return nil, fmt.Errorf("take over cluster %s for leader epoch %d: %w", cluster, t.epoch, err)
	}
	t.sessions[cluster] = s
	return s, nil
}

// newEpoch takes the next leader epoch in the jobs' document.
func (m *Manager) newEpoch(ctx context.Context) (int64, error) {
	for attempt := 0; ; attempt++ {
		js, err := m.state.Load(ctx)
		if err != nil {
			return 0, err
		}
		js.LeaderEpoch++
		err = m.state.Save(ctx, js.Version, js)
		if err == nil {
			return js.LeaderEpoch, nil
		}
		if !errors.Is(err, ErrConflict) || attempt >= 20 {
			return 0, fmt.Errorf("take the next leader epoch: %w", err)
		}
	}
}

// superseded reports an error that says a newer leader took over.
func superseded(err error) bool { return errors.Is(err, store.ErrSuperseded) }
