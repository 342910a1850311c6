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
}

// Limits cap what the registry holds. Every subscription is a delivery row
// per message produced to its topic, and every topic a set of rows and
// metric series, so both are bounded. Each router checks its own view
// (refreshed every second), so routers creating at the same instant may
// overshoot a cap by the few they created together.
type Limits struct {
	// MaxTopics caps the topics that have stored subscriptions (a topic
	// gets its default one at its first produce). Defaults to 10,000; -1
	// removes the cap.
	MaxTopics int
	// MaxPerTopic caps the subscriptions of one topic. Defaults to 32 (a
	// produce of 1,000 messages then writes at most 32,000 delivery rows);
	// -1 removes the cap.
	MaxPerTopic int
}

// WithDefaults fills zero fields.
func (l Limits) WithDefaults() Limits {
	if l.MaxTopics == 0 {
		l.MaxTopics = 10000
	}
	if l.MaxPerTopic == 0 {
		l.MaxPerTopic = 32
	}
	return l
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

// checkCaps says whether a new subscription name on topic fits the caps;
// r.mu is held.
func (r *Registry) checkCaps(topic, name string) error {
	l := r.limits.WithDefaults()
	subs, known := r.topics[topic]
	if _, exists := subs[name]; exists {
		return nil
	}
	if (!known || len(subs) == 0) && l.MaxTopics >= 0 && r.topicCount() >= l.MaxTopics {
		return fmt.Errorf("%w: %d topics exist, the cap; topic %s would be one more", ErrTooManyTopics, r.topicCount(), topic)
	}
	if l.MaxPerTopic >= 0 && len(subs) >= l.MaxPerTopic {
		return fmt.Errorf("%w: topic %s has %d subscriptions, the cap", ErrTooManySubscriptions, topic, len(subs))
	}
	return nil
}

// topicCount counts topics with at least one subscription; r.mu is held.
func (r *Registry) topicCount() int {
	n := 0
	for _, subs := range r.topics {
		if len(subs) > 0 {
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
	def.CreatedAt = r.now().UTC()
	r.mu.RLock()
	err := r.checkCaps(topic, Default)
	r.mu.RUnlock()
	if err != nil {
		return nil, err
	}
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
		r.mu.RLock()
		err := r.checkCaps(s.Topic, s.Name)
		r.mu.RUnlock()
		if err != nil {
			return s, false, err
		}
	}
	if existed && stored {
		s.CreatedAt = old.CreatedAt
		if s.Queue == nil {
			s.Queue = old.Queue // a native PUT does not drop what SQS keeps
		}
	} else {
		s.CreatedAt = r.now().UTC()
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
