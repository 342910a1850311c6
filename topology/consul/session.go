package consul

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
)

// RouterInfo is a router's registration, stored at <prefix>routers/<id>
// and held by the router's session: it disappears when the session ends.
type RouterInfo struct {
	ID string `json:"id"`
	// Applied is the shard-map version the router routes with; 0 until
	// it has loaded one.
	Applied int64 `json:"applied_version"`
	// Digest is the applied map's routing.Map.Digest, so that a map
	// rewritten under a version in use is caught at start-up.
	Digest string `json:"applied_digest,omitempty"`
	// Instance is where the router process runs (Config.Instance).
	Instance     string    `json:"instance,omitempty"`
	RegisteredAt time.Time `json:"registered_at"`
	UpdatedAt    time.Time `json:"updated_at"`
	// Session is the Consul session holding the registration.
	Session string `json:"-"`
}

// createSession opens a TTL session with no health checks: it lives while
// it is renewed. It returns the session and when it was asked for (the
// start of its first TTL).
func (s *Source) createSession(ctx context.Context, name, behavior string, lockDelay time.Duration) (string, time.Time, error) {
	sent := time.Now()
	id, _, err := s.api.Session().CreateNoChecks(&api.SessionEntry{
		Name: name, TTL: s.cfg.SessionTTL.String(), Behavior: behavior, LockDelay: lockDelay,
	}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", sent, fmt.Errorf("consul: create session: %w", err)
	}
	return id, sent, nil
}

// destroySession ends a session, even when ctx is already done.
func (s *Source) destroySession(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.api.Session().Destroy(id, (&api.WriteOptions{}).WithContext(dctx)); err != nil {
		s.log.Warn("consul: destroy session", "session", id, "err", err)
	}
}

// errSessionLost marks a session that is gone or could not be renewed for
// a whole TTL (so Consul may have invalidated it).
var errSessionLost = errors.New("consul session lost")

// keepAlive renews session id every third of the TTL until ctx is done
// (returning nil) or the session is lost. lastOK is when the last
// successful renewal (or the creation) was sent: Consul cannot invalidate
// the session before lastOK + TTL, so giving up at that moment keeps a
// leader from overlapping its successor.
func (s *Source) keepAlive(ctx context.Context, id string, lastOK time.Time) error {
	return s.keepAliveReporting(ctx, id, lastOK, nil)
}

// keepAliveReporting is keepAlive that calls renewed with the send time
// of every successful renewal.
func (s *Source) keepAliveReporting(ctx context.Context, id string, lastOK time.Time, renewed func(time.Time)) error {
	ttl := s.cfg.SessionTTL
	every := ttl / 3
	for {
		left := time.Until(lastOK.Add(ttl))
		if left <= 0 {
			return fmt.Errorf("%w: session %s not renewed for %s", errSessionLost, id, ttl)
		}
		if !sleep(ctx, min(every, left)) {
			return nil
		}
		if time.Until(lastOK.Add(ttl)) <= 0 {
			continue
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, lastOK.Add(ttl))
		entry, _, err := s.api.Session().Renew(id, (&api.WriteOptions{}).WithContext(rctx))
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.log.Debug("consul: renew session", "session", id, "err", err)
			every = max(ttl/10, time.Millisecond) // retry sooner while renewals fail
		case entry == nil:
			return fmt.Errorf("%w: session %s expired", errSessionLost, id)
		default:
			lastOK, every = sent, ttl/3
			if renewed != nil {
				renewed(sent)
			}
		}
	}
}

// Register implements topology.Backend: the router holds
// <prefix>routers/<id> with a session of behavior delete, so its
// registration vanishes when it stops renewing. A registration lost while
// the router lives (Consul unreachable for a TTL) is made again.
func (s *Source) Register(ctx context.Context, id string) (topology.Registration, error) {
	if id == "" || strings.Contains(id, "/") {
		return nil, fmt.Errorf("consul: router id %q must be non-empty and without '/'", id)
	}
	now := time.Now().UTC()
	r := &registration{
		s: s, key: s.routersKey() + id,
		info: RouterInfo{ID: id, Instance: s.cfg.Instance, RegisteredAt: now},
		kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
	sid, sent, err := s.createSession(ctx, "shardmq router "+id, api.SessionBehaviorDelete, time.Millisecond)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		ok, err := r.write(ctx, sid)
		if err == nil && ok {
			break
		}
		if err == nil && attempt < 5 {
			// Refused: the key's lock-delay runs (its holder just
			// left), or another session holds it.
			var retry bool
			if retry, err = s.takeOver(ctx, r.key, id); err == nil && retry {
				continue
			}
		}
		s.destroySession(ctx, sid)
		if err == nil {
			err = fmt.Errorf("consul: router id %q is registered by another live router (instance %q); give each router its own -router-id", id, s.holderInstance(ctx, r.key))
		}
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go r.run(rctx, sid, sent)
	return r, nil
}

type registration struct {
	s      *Source
	key    string
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	// serving is set while a session holds the registration; renewedAt
	// is the send time (unix nanoseconds) of its last renewal or
	// creation. Current reads them.
	serving   atomic.Bool
	renewedAt atomic.Int64

	mu   sync.Mutex
	info RouterInfo
}

// Publish implements topology.Registration.
func (r *registration) Publish(v int64) { r.publish(v, "") }

// Current implements topology.SelfFencer: the registration is held and
// was renewed within two thirds of the session TTL (renewals go every
// third: one was missed). Past that the router cannot count on being
// among the live routers a resharding barrier waits for (Consul
// invalidates the session one TTL after its last renewal), so it stops
// writing, with a third of the TTL left to write its leases out, before
// a barrier can pass without it.
func (r *registration) Current(now time.Time) bool {
	return r.serving.Load() && now.Sub(time.Unix(0, r.renewedAt.Load())) < r.s.cfg.SessionTTL*2/3
}

// PublishMap implements topology.MapPublisher.
func (r *registration) PublishMap(m *routing.Map) { r.publish(m.Version(), m.Digest()) }

func (r *registration) publish(v int64, digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v < r.info.Applied || v == r.info.Applied && (digest == "" || digest == r.info.Digest) {
		return
	}
	r.info.Applied, r.info.Digest = v, digest
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Stop implements topology.Registration: the session is destroyed, which
// deletes the registration.
func (r *registration) Stop() {
	r.cancel()
	<-r.done
}

// write stores the registration under session sid; false when another
// session holds the key.
func (r *registration) write(ctx context.Context, sid string) (bool, error) {
	r.mu.Lock()
	r.info.UpdatedAt = time.Now().UTC()
	data, err := json.Marshal(r.info)
	r.mu.Unlock()
	if err != nil {
		return false, err
	}
	ok, _, err := r.s.api.KV().Acquire(&api.KVPair{Key: r.key, Value: data, Session: sid}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("consul: write router registration: %w", err)
	}
	return ok, nil
}

func (r *registration) run(ctx context.Context, sid string, lastOK time.Time) {
	defer close(r.done)
	for {
		err := r.serve(ctx, sid, lastOK)
		r.s.destroySession(ctx, sid)
		if ctx.Err() != nil {
			return
		}
		r.s.log.Warn("consul: router registration lost; registering again", "key", r.key, "err", err)
		r.s.ResetWatches()
		for n := 1; ; n++ {
			if !sleep(ctx, r.s.backoff(n)) {
				return
			}
			sid, lastOK, err = r.s.createSession(ctx, "shardmq router "+r.info.ID, api.SessionBehaviorDelete, time.Millisecond)
			if err != nil {
				continue
			}
			ok, err := r.write(ctx, sid)
			if err == nil && ok {
				break
			}
			r.s.destroySession(ctx, sid)
		}
		// The agent may have lost its data again while this router
		// registered: queries must not keep waiting on old indexes.
		r.s.ResetWatches()
	}
}

// serve keeps session sid alive and writes every published version, until
// ctx is done (nil) or the session is lost.
func (r *registration) serve(ctx context.Context, sid string, lastOK time.Time) error {
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 2)
	r.renewedAt.Store(lastOK.UnixNano())
	r.serving.Store(true)
	defer r.serving.Store(false)
	go func() {
		lost <- r.s.keepAliveReporting(kctx, sid, lastOK, func(at time.Time) { r.renewedAt.Store(at.UnixNano()) })
	}()
	go func() {
		if err := r.watchKey(kctx, sid); err != nil {
			lost <- err
		}
	}()
	var retry <-chan time.Time
	fails := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			return err
		case <-r.kick:
		case <-retry:
		}
		retry = nil
		ok, err := r.write(ctx, sid)
		switch {
		case err != nil && r.s.sessionGone(ctx, sid):
			return fmt.Errorf("%w: session %s ended: %v", errSessionLost, sid, err)
		case err != nil:
			fails++
			retry = time.After(r.s.backoff(fails))
		case !ok:
			return fmt.Errorf("%w: registration key held by another session", errSessionLost)
		default:
			fails = 0
		}
	}
}

// watchKey follows the registration key with blocking queries and returns
// as soon as it is no longer held by session sid: deleted by hand, or
// gone with the agent's data. The router then registers again at once,
// publishing the map it routes with, instead of staying invisible to
// writers and starting routers until its next renewal. It returns nil
// when ctx is done.
func (r *registration) watchKey(ctx context.Context, sid string) error {
	var index uint64
	for fails := 0; ctx.Err() == nil; {
		pair, meta, err := r.s.api.KV().Get(r.key, (&api.QueryOptions{WaitIndex: index, WaitTime: r.s.cfg.Wait}).WithContext(ctx))
		if err != nil {
			fails++
			sleep(ctx, r.s.backoff(fails))
			index = 0
			continue
		}
		fails = 0
		if pair == nil || pair.Session != sid {
			return fmt.Errorf("%w: registration key %s no longer held by session %s", errSessionLost, r.key, sid)
		}
		index = nextIndex(index, meta.LastIndex)
	}
	return nil
}

// takeOver decides what a refused registration of router id does next: it
// retries (true) when the key is free but under its lock-delay, and when
// it ended the session holding it because that registration is this
// router's own predecessor: same id and
// the same non-empty Config.Instance (host and listen address, which two
// live processes cannot share). A router restarted after a crash then
// registers at once instead of waiting for its old session's TTL. The
// predecessor's hold on the leader lock, if any, ends with it. It reports
// whether it ended a session.
func (s *Source) takeOver(ctx context.Context, key, id string) (bool, error) {
	pair, _, err := s.api.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, fmt.Errorf("consul: read router registration: %w", err)
	}
	if pair == nil || pair.Session == "" {
		// Free, but its previous holder left a moment ago: the
		// registration sessions' lock-delay (1ms) runs.
		sleep(ctx, 5*time.Millisecond)
		return true, nil
	}
	if s.cfg.Instance == "" {
		return false, nil
	}
	var old RouterInfo
	if json.Unmarshal(pair.Value, &old) != nil || old.ID != id || old.Instance != s.cfg.Instance {
		return false, nil
	}
	s.log.Warn("consul: taking over the registration of this router's previous process", "router", id, "instance", old.Instance, "session", pair.Session)
	if _, err := s.api.Session().Destroy(pair.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return false, fmt.Errorf("consul: end the previous process's session: %w", err)
	}
	if lp, _, err := s.api.KV().Get(s.leaderKey(), (&api.QueryOptions{}).WithContext(ctx)); err == nil && lp != nil && lp.Session != "" && string(lp.Value) == id {
		if info, _, err := s.api.Session().Info(lp.Session, (&api.QueryOptions{}).WithContext(ctx)); err == nil && info != nil && info.Name == "shardmq leader "+id {
			s.api.Session().Destroy(lp.Session, (&api.WriteOptions{}).WithContext(ctx))
		}
	}
	// The registration session's lock-delay is 1ms.
	sleep(ctx, 5*time.Millisecond)
	return true, nil
}

// holderInstance names the instance holding a registration key, for
// error messages.
func (s *Source) holderInstance(ctx context.Context, key string) string {
	pair, _, err := s.api.KV().Get(key, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil || pair == nil {
		return ""
	}
	var info RouterInfo
	json.Unmarshal(pair.Value, &info)
	return info.Instance
}

// sessionGone reports whether Consul says session id no longer exists
// (destroyed or expired). A real agent answers a write with a dead
// session by 500 "invalid session", which looks like any other failure;
// asking for the session tells them apart without reading error text.
func (s *Source) sessionGone(ctx context.Context, id string) bool {
	entry, _, err := s.api.Session().Info(id, (&api.QueryOptions{}).WithContext(ctx))
	return err == nil && entry == nil
}

// Applied implements topology.Backend from the live registrations.
func (s *Source) Applied(ctx context.Context) ([]topology.AppliedMap, error) {
	routers, err := s.Routers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]topology.AppliedMap, 0, len(routers))
	for _, r := range routers {
		out = append(out, topology.AppliedMap{Router: r.ID, Version: r.Applied, Digest: r.Digest})
	}
	return out, nil
}

// Routers lists the live routers' registrations, by id.
func (s *Source) Routers(ctx context.Context) ([]RouterInfo, error) {
	pairs, _, err := s.api.KV().List(s.routersKey(), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul: list routers: %w", err)
	}
	return s.liveRouters(pairs), nil
}

func (s *Source) liveRouters(pairs api.KVPairs) []RouterInfo {
	var out []RouterInfo
	for _, p := range pairs {
		if p.Session == "" {
			continue
		}
		var info RouterInfo
		if err := json.Unmarshal(p.Value, &info); err != nil {
			// A live router whose registration cannot be read counts as
			// having applied nothing: it must not let a barrier pass.
			info = RouterInfo{ID: strings.TrimPrefix(p.Key, s.routersKey())}
		}
		info.Session = p.Session
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// WaitApplied implements topology.Backend with a blocking query on the
// registrations: it returns as soon as every live router has published
// version or above. A router that died stops counting when Consul
// invalidates its session (after its TTL, up to twice that on a real
// Consul).
func (s *Source) WaitApplied(ctx context.Context, version int64) error {
	var index uint64
	var behind []string
	for fails := 0; ; {
		pairs, meta, err := s.api.KV().List(s.routersKey(), (&api.QueryOptions{WaitIndex: index, WaitTime: s.cfg.Wait}).WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("wait for shard map %d: routers behind: %v: %w", version, behind, ctx.Err())
			}
			fails++
			if !sleep(ctx, s.backoff(fails)) {
				return fmt.Errorf("wait for shard map %d: %w (last: %v)", version, ctx.Err(), err)
			}
			index = 0
			continue
		}
		fails = 0
		behind = behind[:0]
		for _, r := range s.liveRouters(pairs) {
			if r.Applied < version {
				behind = append(behind, fmt.Sprintf("%s at %d", r.ID, r.Applied))
			}
		}
		if len(behind) == 0 {
			return nil
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// Leader implements topology.Backend: the router holding the KV lock
// <prefix>leader (its value is the holder's id) with a live session leads.
func (s *Source) Leader(id string) topology.Leader {
	return &leader{s: s, id: id, gained: make(chan struct{}), done: make(chan struct{})}
}

type leader struct {
	s  *Source
	id string

	mu      sync.Mutex
	leading bool
	lost    chan struct{} // closed when the current term ends
	gained  chan struct{} // closed when a term starts
	cancel  context.CancelFunc
	stopped bool
	done    chan struct{}
}

var _ topology.Leader = (*leader)(nil)

// Start implements topology.Leader.
func (l *leader) Start(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cancel != nil || l.stopped {
		return
	}
	lctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	go l.run(lctx)
}

// Stop implements topology.Leader: it steps down, releases the lock (so
// the next router takes it at once, without lock-delay) and ends the
// session.
func (l *leader) Stop() {
	l.mu.Lock()
	cancel := l.cancel
	l.stopped = true
	l.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-l.done
}

// IsLeader implements topology.Leader.
func (l *leader) IsLeader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Leading implements topology.Leader.
func (l *leader) Leading(ctx context.Context) (<-chan struct{}, error) {
	for {
		l.mu.Lock()
		if l.leading {
			lost := l.lost
			l.mu.Unlock()
			return lost, nil
		}
		gained := l.gained
		l.mu.Unlock()
		select {
		case <-gained:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (l *leader) becomeLeader() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leading {
		return
	}
	l.leading, l.lost = true, make(chan struct{})
	close(l.gained)
	l.gained = make(chan struct{})
	l.s.log.Info("consul: leading background jobs", "router", l.id)
}

func (l *leader) stepDown(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leading {
		return
	}
	l.leading = false
	close(l.lost)
	l.s.log.Warn("consul: stopped leading background jobs", "router", l.id, "why", why)
}

func (l *leader) run(ctx context.Context) {
	defer close(l.done)
	for fails := 0; ctx.Err() == nil; {
		sid, lastOK, err := l.s.createSession(ctx, "shardmq leader "+l.id, api.SessionBehaviorRelease, l.s.cfg.LockDelay)
		if err != nil {
			fails++
			l.s.log.Warn("consul: leader election", "err", err)
			sleep(ctx, l.s.backoff(fails))
			continue
		}
		fails = 0
		err = l.campaign(ctx, sid, lastOK)
		held := l.IsLeader()
		l.stepDown(fmt.Sprint(err))
		if held && ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			l.s.api.KV().Release(&api.KVPair{Key: l.s.leaderKey(), Value: []byte(l.id), Session: sid}, (&api.WriteOptions{}).WithContext(rctx))
			cancel()
		}
		l.s.destroySession(ctx, sid)
		if ctx.Err() == nil {
			l.s.log.Warn("consul: leader session lost; campaigning again", "err", err)
			// Routers blocked on the lock see it free first and, if
			// the lock-delay refused them, retry after
			// max(LockDelay, MinBackoff): the router whose session just
			// ended waits twice that, so it does not win the lock
			// straight back.
			sleep(ctx, 2*min(max(l.s.cfg.LockDelay, l.s.cfg.MinBackoff), time.Second))
		}
	}
}

// campaign holds or waits for the lock with session sid until ctx is done
// or the session is lost (returning why).
func (l *leader) campaign(ctx context.Context, sid string, lastOK time.Time) error {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if err := l.s.keepAlive(cctx, sid, lastOK); err != nil {
			cancel(err)
		}
	}()
	kv := l.s.api.KV()
	key := l.s.leaderKey()
	var index uint64
	free, fails := true, 0
	for cctx.Err() == nil {
		if free {
			ok, _, err := kv.Acquire(&api.KVPair{Key: key, Value: []byte(l.id), Session: sid}, (&api.WriteOptions{}).WithContext(cctx))
			switch {
			case err != nil && l.s.sessionGone(cctx, sid):
				// Consul refuses a dead session's acquire (500 "invalid
				// session"): campaign again with a new one at once.
				cancel(fmt.Errorf("%w: session %s ended: %v", errSessionLost, sid, err))
				continue
			case err != nil:
				fails++
				sleep(cctx, l.s.backoff(fails))
				continue
			case ok:
				l.becomeLeader()
			case index != 0:
				// Free at the last read but refused: the lock-delay
				// of a dead holder runs, or another router was
				// faster. Pause, then read the key without blocking.
				sleep(cctx, min(max(l.s.cfg.LockDelay, l.s.cfg.MinBackoff), time.Second))
				index = 0
			}
		}
		pair, meta, err := kv.Get(key, (&api.QueryOptions{WaitIndex: index, WaitTime: l.s.cfg.Wait}).WithContext(cctx))
		if err != nil {
			if cctx.Err() != nil {
				break
			}
			fails++
			sleep(cctx, l.s.backoff(fails))
			index, free = 0, false
			continue
		}
		fails = 0
		index = nextIndex(index, meta.LastIndex)
		holder := ""
		if pair != nil {
			holder = pair.Session
		}
		switch holder {
		case sid:
			free = false
			l.becomeLeader()
		case "":
			l.stepDown("lock released")
			free = true
		default:
			l.stepDown("lock held by another session")
			free = false
		}
	}
	return context.Cause(cctx)
}
