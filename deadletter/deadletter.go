// Package deadletter runs the dead-letter upkeep of every subscription:
// the growth alarm (a warning log, metrics and an optional webhook when
// dead letters grow faster than the subscription allows) and the move of
// dead letters untouched for 30 days into the archive table.
package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/subscription"
)

// Broker is what the upkeep needs from the broker.
type Broker interface {
	CountDead(ctx context.Context, topic, sub string) (int64, error)
	ArchiveDead(ctx context.Context, topic, sub string, cutoff time.Time) (int64, error)
}

// Subscriptions lists the subscriptions to watch.
type Subscriptions interface {
	List(topic string) []subscription.Subscription
}

// Config tunes the upkeep. Zero fields take the defaults named.
type Config struct {
	// Every is how often dead letters are counted. Defaults to 1m.
	Every time.Duration
	// ArchiveAfter is how long a dead letter stays untouched before it is
	// archived. Defaults to 30 days.
	ArchiveAfter time.Duration
	// ArchiveEvery is how often the archive runs. Defaults to 1h.
	ArchiveEvery time.Duration
	// WebhookURL, when set, receives a JSON POST for every alert.
	WebhookURL string
	// WebhookTimeout bounds one POST. Defaults to 5s.
	WebhookTimeout time.Duration
	// WebhookAttempts is how many times a POST is tried. Defaults to 3.
	WebhookAttempts int
	// WebhookQueue bounds the alerts waiting to be posted; beyond it they
	// are dropped and counted, never blocking the upkeep. Defaults to 100.
	WebhookQueue int
}

func (c Config) withDefaults() Config {
	if c.Every <= 0 {
		c.Every = time.Minute
	}
	if c.ArchiveAfter <= 0 {
		c.ArchiveAfter = 30 * 24 * time.Hour
	}
	if c.ArchiveEvery <= 0 {
		c.ArchiveEvery = time.Hour
	}
	if c.WebhookTimeout <= 0 {
		c.WebhookTimeout = 5 * time.Second
	}
	if c.WebhookAttempts <= 0 {
		c.WebhookAttempts = 3
	}
	if c.WebhookQueue <= 0 {
		c.WebhookQueue = 100
	}
	return c
}

// Alert is what the webhook receives.
type Alert struct {
	Topic         string    `json:"topic"`
	Subscription  string    `json:"subscription"`
	DeadLetters   int64     `json:"dead_letters"`
	Before        int64     `json:"dead_letters_window_start"`
	GrowthPercent float64   `json:"growth_percent"`
	Threshold     float64   `json:"threshold_percent"`
	Window        string    `json:"window"`
	At            time.Time `json:"at"`
}

type sample struct {
	at    time.Time
	count int64
}

type subState struct {
	samples []sample
	firing  bool
	raised  Alert // while firing: the alert that raised it, its latest count
}

// Upkeep is the service. Start and Stop are safe to call twice.
type Upkeep struct {
	cfg     Config
	b       Broker
	subs    Subscriptions
	leading func() bool
	now     func() time.Time
	log     *slog.Logger
	client  *http.Client

	mu     sync.Mutex
	state  map[[2]string]*subState
	series map[[2]string]bool // subscriptions with metric series

	hooks   chan Alert
	dropped atomic.Int64
	posted  atomic.Int64
	failed  atomic.Int64

	deadGauge  *prometheus.GaugeVec
	firing     *prometheus.GaugeVec
	alerts     *prometheus.CounterVec
	archived   *prometheus.CounterVec
	startOnce  sync.Once
	stopOnce   sync.Once
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	lastArchiv time.Time
}

// New returns the upkeep; leading says whether this router runs the
// background jobs now (nil: always).
func New(cfg Config, b Broker, subs Subscriptions, leading func() bool, now func() time.Time, log *slog.Logger) *Upkeep {
	cfg = cfg.withDefaults()
	if leading == nil {
		leading = func() bool { return true }
	}
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Upkeep{cfg: cfg, b: b, subs: subs, leading: leading, now: now, log: log,
		client: &http.Client{Timeout: cfg.WebhookTimeout},
		state:  map[[2]string]*subState{},
		series: map[[2]string]bool{},
		hooks:  make(chan Alert, cfg.WebhookQueue),
		deadGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardmq_dead_letters",
			Help: "Dead letters of a subscription at the last count."}, []string{"topic", "subscription"}),
		firing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardmq_dead_letter_alarm_firing",
			Help: "1 while a subscription's dead letters grow faster than its alarm allows."}, []string{"topic", "subscription"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_dead_letter_alarms_total",
			Help: "Dead-letter growth alarms raised."}, []string{"topic", "subscription"}),
		archived: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_dead_letters_archived_total",
			Help: "Dead letters moved to the archive table."}, []string{"topic", "subscription"}),
	}
}

// Collectors are the upkeep's metrics, for the router's registry. The
// per-subscription series go with their subscription: each scrape first
// removes those of subscriptions that no longer exist (Prune).
func (u *Upkeep) Collectors() []prometheus.Collector {
	return []prometheus.Collector{pruned{u}, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "shardmq_dead_letter_webhooks_dropped_total", Help: "Alerts not posted because the webhook queue was full."},
		func() float64 { return float64(u.dropped.Load()) })}
}

// pruned collects the per-subscription series after Prune.
type pruned struct{ u *Upkeep }

func (p pruned) vecs() []prometheus.Collector {
	return []prometheus.Collector{p.u.deadGauge, p.u.firing, p.u.alerts, p.u.archived}
}

func (p pruned) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range p.vecs() {
		c.Describe(ch)
	}
}

func (p pruned) Collect(ch chan<- prometheus.Metric) {
	p.u.Prune()
	for _, c := range p.vecs() {
		c.Collect(ch)
	}
}

// Prune forgets the series and alarm state of subscriptions that no longer
// exist, so that a deleted subscription leaves nothing in /metrics (and
// one created again later starts afresh).
func (u *Upkeep) Prune() {
	live := map[[2]string]bool{}
	for _, s := range u.subs.List("") {
		live[[2]string{s.Topic, s.Name}] = true
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for k := range u.series {
		if live[k] {
			continue
		}
		for _, v := range []interface {
			DeleteLabelValues(...string) bool
		}{u.deadGauge, u.firing, u.alerts, u.archived} {
			v.DeleteLabelValues(k[0], k[1])
		}
		delete(u.series, k)
		delete(u.state, k)
	}
}

// labeled records that a subscription has series, for Prune.
func (u *Upkeep) labeled(topic, sub string) {
	u.mu.Lock()
	u.series[[2]string{topic, sub}] = true
	u.mu.Unlock()
}

// Start runs the count, archive and webhook loops until Stop or ctx ends.
func (u *Upkeep) Start(ctx context.Context) {
	u.startOnce.Do(func() {
		ctx, u.cancel = context.WithCancel(ctx)
		u.wg.Add(2)
		go u.loop(ctx)
		go u.poster(ctx)
	})
}

// Stop ends the loops and waits for them.
func (u *Upkeep) Stop() {
	u.stopOnce.Do(func() {
		if u.cancel != nil {
			u.cancel()
		}
		u.wg.Wait()
	})
}

func (u *Upkeep) loop(ctx context.Context) {
	defer u.wg.Done()
	t := time.NewTicker(u.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !u.leading() {
			continue
		}
		u.Check(ctx)
		if u.now().Sub(u.lastArchiv) >= u.cfg.ArchiveEvery {
			u.lastArchiv = u.now()
			u.Archive(ctx)
		}
	}
}

// Check counts every subscription's dead letters once and raises or clears
// its alarm: it fires when the count grew by more than the subscription's
// growth_percent since the oldest count within its window (from zero, any
// growth counts as growth from one). A steady count never fires; a firing
// alarm alerts once and clears when growth falls back under the limit.
func (u *Upkeep) Check(ctx context.Context) {
	now := u.now()
	for _, s := range u.subs.List("") {
		n, err := u.b.CountDead(ctx, s.Topic, s.Name)
		if err != nil {
			u.log.Warn("dead letters not counted", "topic", s.Topic, "subscription", s.Name, "err", err)
			continue
		}
		u.deadGauge.WithLabelValues(s.Topic, s.Name).Set(float64(n))
		window, err := time.ParseDuration(s.DeadLetterAlarm.Window)
		if err != nil || window <= 0 {
			window = time.Hour
		}
		u.observe(s, n, now, window)
		// After the series are set: a Prune racing a delete then removes
		// them at the latest on the next scrape.
		u.labeled(s.Topic, s.Name)
	}
}

func (u *Upkeep) observe(s subscription.Subscription, n int64, now time.Time, window time.Duration) {
	u.mu.Lock()
	k := [2]string{s.Topic, s.Name}
	st := u.state[k]
	if st == nil {
		st = &subState{}
		u.state[k] = st
	}
	// Keep the samples within the window plus the newest one older than
	// it, which is the base: growth is measured over a full window.
	from := 0
	for i, sm := range st.samples {
		if now.Sub(sm.at) > window {
			from = i
		}
	}
	st.samples = append(st.samples[from:], sample{at: now, count: n})
	base := st.samples[0].count
	first := len(st.samples) == 1
	threshold := s.DeadLetterAlarm.GrowthPercent
	growth := float64(n-base) / float64(max(base, 1)) * 100
	was := st.firing
	st.firing = !first && n > base && growth > threshold
	if st.firing {
		at := st.raised.At
		if !was {
			at = now.UTC()
		}
		st.raised = Alert{Topic: s.Topic, Subscription: s.Name, DeadLetters: n, Before: base, GrowthPercent: growth,
			Threshold: threshold, Window: s.DeadLetterAlarm.Window, At: at}
	}
	u.mu.Unlock()

	v := 0.0
	if st.firing {
		v = 1
	}
	u.firing.WithLabelValues(s.Topic, s.Name).Set(v)
	if !st.firing || was {
		return
	}
	a := Alert{Topic: s.Topic, Subscription: s.Name, DeadLetters: n, Before: base, GrowthPercent: growth,
		Threshold: threshold, Window: s.DeadLetterAlarm.Window, At: now.UTC()}
	u.alerts.WithLabelValues(s.Topic, s.Name).Inc()
	u.log.Warn("dead letters growing", "topic", s.Topic, "subscription", s.Name, "dead_letters", n,
		"window_start", base, "growth_percent", fmt.Sprintf("%.0f", growth), "threshold_percent", threshold, "window", s.DeadLetterAlarm.Window)
	if u.cfg.WebhookURL == "" {
		return
	}
	select {
	case u.hooks <- a:
	default:
		u.dropped.Add(1)
	}
}

// FiringAlarms lists the alarms raised now, by topic and subscription:
// each with the count and growth of its latest check and At, when it
// was raised. Only the leading router checks; on the others it is empty.
func (u *Upkeep) FiringAlarms() []Alert {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []Alert
	for _, st := range u.state {
		if st.firing {
			out = append(out, st.raised)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Subscription < out[j].Subscription
	})
	return out
}

// Firing says whether a subscription's alarm is raised.
func (u *Upkeep) Firing(topic, sub string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	st := u.state[[2]string{topic, sub}]
	return st != nil && st.firing
}

func (u *Upkeep) poster(ctx context.Context) {
	defer u.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-u.hooks:
			u.post(ctx, a)
		}
	}
}

// post sends one alert, retrying with a growing pause.
func (u *Upkeep) post(ctx context.Context, a Alert) {
	body, _ := json.Marshal(a)
	var err error
	for i := 0; i < u.cfg.WebhookAttempts; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(i) * 500 * time.Millisecond):
			}
		}
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, u.cfg.WebhookURL, bytes.NewReader(body))
		if err != nil {
			break
		}
		req.Header.Set("Content-Type", "application/json")
		var resp *http.Response
		resp, err = u.client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				u.posted.Add(1)
				return
			}
			err = fmt.Errorf("webhook answered %s", resp.Status)
		}
	}
	u.failed.Add(1)
	u.log.Error("dead-letter alarm webhook failed", "url", u.cfg.WebhookURL, "topic", a.Topic, "subscription", a.Subscription, "err", err)
}

// Archive moves every subscription's dead letters untouched for
// ArchiveAfter into the archive table.
func (u *Upkeep) Archive(ctx context.Context) {
	cutoff := u.now().Add(-u.cfg.ArchiveAfter)
	for _, s := range u.subs.List("") {
		n, err := u.b.ArchiveDead(ctx, s.Topic, s.Name, cutoff)
		if n > 0 {
			u.archived.WithLabelValues(s.Topic, s.Name).Add(float64(n))
			u.labeled(s.Topic, s.Name)
			u.log.Info("dead letters archived", "topic", s.Topic, "subscription", s.Name, "count", n)
		}
		if err != nil {
			u.log.Warn("dead letters not all archived", "topic", s.Topic, "subscription", s.Name, "err", err)
		}
	}
}
