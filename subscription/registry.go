package subscription

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Registry is a router's view of every subscription: a cache of a Store,
// refreshed in the background so that subscriptions made through another
// router are seen within RefreshEvery. Changes made through this router
// are seen at once. A topic without subscriptions has its implicit default
// one; the first produce to such a topic makes it a stored subscription.
type Registry struct {
	st    Store
	log   *slog.Logger
	now   func() time.Time
	every time.Duration

	mu     sync.RWMutex
	topics map[string]map[string]Subscription
	loaded bool
	// gen counts this router's own changes; a refresh that read the store
	// before one of them does not overwrite the cache with older news.
	gen uint64

	partial quietLog // reads that missed some clusters

	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}

	limits Limits
	// pending are the new subscriptions being stored now (topic → name →
	// how many requests store it), counted against the caps with the
	// stored ones, so that concurrent creations through this router never
	// pass a cap together; creators names who creates each pending topic.
	pending  map[string]map[string]int
	creators map[string]string
}

// Limits cap what the registry holds. Every subscription is a delivery row
// per message produced to its topic, and every topic a set of rows and
// metric series, so all are bounded. A router admits a new subscription
// only after reserving it under its lock, counting the stored ones and
// those other requests are storing, so creations through one router never
// pass a cap however many run at once. Routers check their own views
// (refreshed every second): routers of a fleet creating at the same
// instant may overshoot a cap by the few the others created in that
// second.
type Limits struct {
	// MaxTopics caps the topics that have stored subscriptions (a topic
	// gets its default one at its first produce). Defaults to 10,000; -1
	// removes the cap.
	MaxTopics int
	// MaxPerTopic caps the subscriptions of one topic. Defaults to 32 (a
	// produce of 1,000 messages then writes at most 32,000 delivery rows);
	// -1 removes the cap.
	MaxPerTopic int
	// MaxTopicsPerCreator caps the topics one token may create (by its
	// first produce to a topic, or its first subscription of one), so
	// that a producer scoped to some topics cannot use up MaxTopics for
	// everyone. Tokens with admin on every topic, and requests without a
	// token (an open router), are not counted. Defaults to 1,000; -1
	// removes the quota.
	MaxTopicsPerCreator int
}

// WithDefaults fills zero fields.
func (l Limits) WithDefaults() Limits {
	if l.MaxTopics == 0 {
		l.MaxTopics = 10000
	}
	if l.MaxPerTopic == 0 {
		l.MaxPerTopic = 32
	}
	if l.MaxTopicsPerCreator == 0 {
		l.MaxTopicsPerCreator = 1000
	}
	return l
}

type creatorKey struct{}

// WithCreator says in ctx which token makes the subscriptions (and so the
// topics) of a request, for the per-token topic quota
// (Limits.MaxTopicsPerCreator). A request whose ctx names none is not
// counted.
func WithCreator(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, creatorKey{}, token)
}

func creatorOf(ctx context.Context) string {
	s, _ := ctx.Value(creatorKey{}).(string)
	return s
}

// Errors of the caps, matched with errors.Is.
var (
	ErrTooManyTopics        = errors.New("too many topics")
	ErrTooManySubscriptions = errors.New("too many subscriptions on the topic")
)

// SetLimits sets the caps (zero fields take their defaults). Call it
// before the registry is used.
func (r *Registry) SetLimits(l Limits) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limits = l.WithDefaults()
}

// reserve admits a new subscription name on topic against the caps,
// counting those other requests are storing, and holds its place until
// the release it returns is called (after the store answered, whatever it
// answered). A subscription already stored needs no place.
func (r *Registry) reserve(topic, name, creator string) (release func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	subs := r.topics[topic]
	if _, exists := subs[name]; exists {
		return func() {}, nil
	}
	l := r.limits.WithDefaults()
	if r.pending[topic][name] == 0 { // a second request for the same name takes no more room
		newTopic := len(subs) == 0 && len(r.pending[topic]) == 0
		if newTopic && l.MaxTopics >= 0 && r.topicCount() >= l.MaxTopics {
			return nil, fmt.Errorf("%w: %d topics exist, the cap; topic %s would be one more", ErrTooManyTopics, r.topicCount(), topic)
		}
		if newTopic && creator != "" && l.MaxTopicsPerCreator >= 0 {
			if n := r.createdBy(creator); n >= l.MaxTopicsPerCreator {
				return nil, fmt.Errorf("%w: token %s has created %d topics, its quota (-max-topics-per-token); topic %s would be one more",
					ErrTooManyTopics, creator, n, topic)
			}
		}
		if n := r.subCount(topic); l.MaxPerTopic >= 0 && n >= l.MaxPerTopic {
			return nil, fmt.Errorf("%w: topic %s has %d subscriptions, the cap", ErrTooManySubscriptions, topic, n)
		}
		if newTopic && creator != "" {
			if r.creators == nil {
				r.creators = map[string]string{}
			}
			r.creators[topic] = creator
		}
	}
	if r.pending == nil {
		r.pending = map[string]map[string]int{}
	}
	if r.pending[topic] == nil {
		r.pending[topic] = map[string]int{}
	}
	r.pending[topic][name]++
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.pending[topic][name]--; r.pending[topic][name] <= 0 {
			delete(r.pending[topic], name)
		}
		if len(r.pending[topic]) == 0 {
			delete(r.pending, topic)
			delete(r.creators, topic)
		}
	}, nil
}

// subCount counts topic's subscriptions, stored or being stored (one a
// refresh already read from the store while its request still holds its
// place counts once); r.mu is held.
func (r *Registry) subCount(topic string) int {
	n := len(r.topics[topic])
	for name := range r.pending[topic] {
		if _, stored := r.topics[topic][name]; !stored {
			n++
		}
	}
	return n
}

// topicCount counts topics with at least one subscription, stored or
// being stored; r.mu is held.
func (r *Registry) topicCount() int {
	n := 0
	for _, subs := range r.topics {
		if len(subs) > 0 {
			n++
		}
	}
	for t := range r.pending {
		if len(r.topics[t]) == 0 {
			n++
		}
	}
	return n
}

// createdBy counts the topics token created: those with a subscription
// it made, and those it is creating now; r.mu is held.
func (r *Registry) createdBy(token string) int {
	n := 0
	for t, subs := range r.topics {
		for _, s := range subs {
			if s.CreatedBy == token {
				n++
				break
			}
		}
		if c, ok := r.creators[t]; ok && c == token && len(subs) == 0 {
			n++
		}
	}
	for t, c := range r.creators {
		if _, known := r.topics[t]; !known && c == token {
			n++
		}
	}
	return n
}

// NewRegistry returns a registry over st, refreshed every every (defaults
// to 1s) once Start is called.
func NewRegistry(st Store, every time.Duration, now func() time.Time, log *slog.Logger) *Registry {
	if every <= 0 {
		every = time.Second
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{st: st, log: log, now: now, every: every, topics: map[string]map[string]Subscription{}}
}

// Refresh reloads the cache from the store.
func (r *Registry) Refresh(ctx context.Context) error {
	r.mu.RLock()
	gen := r.gen
	r.mu.RUnlock()
	list, err := r.st.List(ctx)
	if err != nil && len(list) == 0 {
		return fmt.Errorf("refresh subscriptions: %w", err)
	}
	r.partial.report(r.log, r.now(), err, "subscriptions read from part of the clusters only")
	topics := map[string]map[string]Subscription{}
	for _, s := range list {
		if topics[s.Topic] == nil {
			topics[s.Topic] = map[string]Subscription{}
		}
		topics[s.Topic][s.Name] = s
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen {
		return nil // a change of ours raced the read; the next refresh sees it
	}
	r.topics = topics
	r.loaded = true
	return nil
}

// Start loads the registry and keeps it fresh until Stop. The first load
// must succeed: a router that cannot know its subscriptions would fan out
// wrongly.
func (r *Registry) Start(ctx context.Context) error {
	if err := r.Refresh(ctx); err != nil {
		return err
	}
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.every)
		defer t.Stop()
		var quiet quietLog
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				err := r.Refresh(ctx)
				if ctx.Err() == nil {
					quiet.report(r.log, r.now(), err, "subscriptions not refreshed; keeping the last ones")
				}
			}
		}
	}()
	return nil
}

// Stop ends the refresh loop. Safe to call twice, and without Start.
func (r *Registry) Stop() {
	r.stopOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
			<-r.done
		}
	})
}

// implicitDefault is the default subscription a topic without any has.
func (r *Registry) implicitDefault(topic string) Subscription {
	return Subscription{Topic: topic, Name: Default}.WithDefaults()
}

// Get returns a subscription; the default subscription of a topic without
// subscriptions exists implicitly.
func (r *Registry) Get(_ context.Context, topic, name string) (Subscription, bool, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if s, ok := r.topics[topic][name]; ok {
		return s, true, nil
	}
	if name == Default && len(r.topics[topic]) == 0 {
		return r.implicitDefault(topic), true, nil
	}
	return Subscription{}, false, nil
}

// List returns a topic's subscriptions sorted by name ("" lists all).
func (r *Registry) List(topic string) []Subscription {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []Subscription
	for t, subs := range r.topics {
		if topic != "" && t != topic {
			continue
		}
		for _, s := range subs {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// ForProduce lists the subscriptions a message produced to topic now is
// delivered to. The first produce to a topic without any stores its
// default subscription, so that every router fans out to it from then on;
// if that write fails the produce still goes to the default subscription
// and the write is tried again on the next produce.
func (r *Registry) ForProduce(ctx context.Context, topic string) ([]string, error) {
	r.mu.RLock()
	subs := r.topics[topic]
	names := make([]string, 0, len(subs))
	for n := range subs {
		names = append(names, n)
	}
	r.mu.RUnlock()
	if len(names) > 0 {
		sort.Strings(names)
		return names, nil
	}
	// Before storing a default subscription, make sure no other router
	// created a subscription since the last refresh: that one, not a
	// default, must receive this topic's messages.
	if err := r.Refresh(ctx); err == nil {
		r.mu.RLock()
		for n := range r.topics[topic] {
			names = append(names, n)
		}
		r.mu.RUnlock()
		if len(names) > 0 {
			sort.Strings(names)
			return names, nil
		}
	}
	def := r.implicitDefault(topic)
	def.CreatedAt, def.CreatedBy = r.now().UTC(), creatorOf(ctx)
	release, err := r.reserve(topic, Default, def.CreatedBy)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := r.st.Put(ctx, def); err != nil {
		r.log.Warn("default subscription not stored yet", "topic", topic, "err", err)
		return []string{Default}, nil
	}
	r.remember(def)
	return []string{Default}, nil
}

func (r *Registry) remember(s Subscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	if r.topics[s.Topic] == nil {
		r.topics[s.Topic] = map[string]Subscription{}
	}
	r.topics[s.Topic][s.Name] = s
}

// Put creates or replaces a subscription after validating it, and reports
// whether it is new. A new subscription receives the messages produced
// after it exists; a replaced one keeps its creation time (and its SQS
// queue state when s has none), and its new
// retry policy applies to the next attempts.
func (r *Registry) Put(ctx context.Context, s Subscription) (Subscription, bool, error) {
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return s, false, err
	}
	old, existed, _ := r.Get(ctx, s.Topic, s.Name)
	r.mu.RLock()
	_, stored := r.topics[s.Topic][s.Name]
	r.mu.RUnlock()
	if !stored {
		release, err := r.reserve(s.Topic, s.Name, creatorOf(ctx))
		if err != nil {
			return s, false, err
		}
		defer release()
	}
	if existed && stored {
		s.CreatedAt, s.CreatedBy = old.CreatedAt, old.CreatedBy
		if s.Queue == nil {
			s.Queue = old.Queue // a native PUT does not drop what SQS keeps
		}
	} else {
		s.CreatedAt, s.CreatedBy = r.now().UTC(), creatorOf(ctx)
	}
	if err := r.st.Put(ctx, s); err != nil {
		return s, false, err
	}
	r.remember(s)
	return s, !stored, nil
}

// ErrNotFound: no such subscription.
var ErrNotFound = errors.New("subscription not found")

// Delete removes a subscription from the store and the cache.
func (r *Registry) Delete(ctx context.Context, topic, name string) error {
	r.mu.RLock()
	_, ok := r.topics[topic][name]
	r.mu.RUnlock()
	if !ok {
		return ErrNotFound
	}
	if _, err := r.st.Delete(ctx, topic, name); err != nil {
		return err
	}
	r.mu.Lock()
	r.gen++
	delete(r.topics[topic], name)
	r.mu.Unlock()
	return nil
}

// quietLog keeps a failure that repeats every refresh from logging every
// time: the first failure is logged, then one line a minute with the
// number of failures since, and the recovery. Safe for concurrent use.
type quietLog struct {
	mu      sync.Mutex
	failing bool
	last    time.Time // when a failure was last logged
	missed  int       // failures since then
}

const quietEvery = time.Minute

func (q *quietLog) report(log *slog.Logger, now time.Time, err error, msg string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case err == nil && q.failing:
		log.Info(msg+": over", "failures", q.missed)
		q.failing, q.missed = false, 0
	case err == nil:
	case !q.failing || now.Sub(q.last) >= quietEvery:
		log.Warn(msg, "err", err, "failures_since_last_log", q.missed)
		q.failing, q.last, q.missed = true, now, 0
	default:
		q.missed++
	}
}
