package deadletter

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/subscription"
)

// counts is a Broker whose dead-letter counts the test sets: what is under
// test here is the alarm's arithmetic over time, not MySQL.
type counts struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *counts) set(sub string, n int64) { c.mu.Lock(); c.n[sub] = n; c.mu.Unlock() }
func (c *counts) CountDead(_ context.Context, _, sub string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[sub], nil
}
func (c *counts) ArchiveDead(context.Context, string, string, time.Time) (int64, error) {
	return 0, nil
}

type subs []subscription.Subscription

func (s subs) List(string) []subscription.Subscription { return s }

func TestAlarmFiresOnBurstNotOnSteadyState(t *testing.T) {
	t.Parallel()
	got := make(chan Alert, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a Alert
		json.NewDecoder(r.Body).Decode(&a)
		got <- a
	}))
	defer hook.Close()
	c := &counts{n: map[string]int64{}}
	list := subs{
		subscription.Subscription{Topic: "t", Name: "steady"}.WithDefaults(),
		subscription.Subscription{Topic: "t", Name: "burst"}.WithDefaults(),
	}
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	u := New(Config{WebhookURL: hook.URL}, c, list, nil, func() time.Time { return at }, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u.Start(ctx)
	defer u.Stop()

	c.set("steady", 200)
	c.set("burst", 100)
	for i := 0; i < 60; i++ { // an hour of steady counts, once a minute
		u.Check(ctx)
		at = at.Add(time.Minute)
	}
	if u.Firing("t", "steady") || u.Firing("t", "burst") {
		t.Fatal("an alarm fired on a steady count")
	}
	c.set("steady", 240) // +20 %: under the default 50 %
	c.set("burst", 180)  // +80 % within the hour
	u.Check(ctx)
	if u.Firing("t", "steady") {
		t.Fatal("20 % growth fired the 50 % alarm")
	}
	if !u.Firing("t", "burst") {
		t.Fatal("80 % growth within the window did not fire")
	}
	select {
	case a := <-got:
		if a.Subscription != "burst" || a.DeadLetters != 180 || a.Before != 100 {
			t.Fatalf("webhook got %+v", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no webhook POST")
	}
	raisedAt := at
	// Still firing a minute later: no second alert; the list of firing
	// alarms keeps when it was raised and shows the latest count. An
	// hour later the count is steady again at 180: the alarm clears.
	at = at.Add(time.Minute)
	c.set("burst", 190)
	u.Check(ctx)
	if f := u.FiringAlarms(); len(f) != 1 || f[0].Subscription != "burst" || f[0].DeadLetters != 190 || f[0].Before != 100 || !f[0].At.Equal(raisedAt) {
		t.Fatalf("firing alarms: %+v, want burst at 190, raised at %v", f, raisedAt)
	}
	for i := 0; i < 62; i++ {
		at = at.Add(time.Minute)
		u.Check(ctx)
	}
	if u.Firing("t", "burst") || len(u.FiringAlarms()) != 0 {
		t.Fatalf("the alarm did not clear once the count was steady for a window: %+v", u.FiringAlarms())
	}
	select {
	case a := <-got:
		t.Fatalf("a second alert for one burst: %+v", a)
	default:
	}
}

func TestAlarmFromZero(t *testing.T) {
	t.Parallel()
	c := &counts{n: map[string]int64{}}
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	u := New(Config{}, c, subs{subscription.Subscription{Topic: "t", Name: "s"}.WithDefaults()}, nil, func() time.Time { return at }, nil)
	u.Check(context.Background())
	at = at.Add(time.Minute)
	c.set("s", 5)
	u.Check(context.Background())
	if !u.Firing("t", "s") {
		t.Fatal("dead letters appearing from none did not fire")
	}
}

func TestWebhookNeverBlocksAndCountsDrops(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	defer func() { close(block); hook.Close() }()
	c := &counts{n: map[string]int64{}}
	var list subs
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		list = append(list, subscription.Subscription{Topic: "t", Name: n}.WithDefaults())
	}
	at := time.Now()
	u := New(Config{WebhookURL: hook.URL, WebhookQueue: 1, WebhookTimeout: time.Second, WebhookAttempts: 1}, c, list, nil, func() time.Time { return at }, nil)
	u.Start(context.Background())
	defer u.Stop()
	u.Check(context.Background())
	for _, s := range list {
		c.set(s.Name, 10)
	}
	at = at.Add(time.Minute)
	done := make(chan struct{})
	go func() { u.Check(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Check blocked on a slow webhook")
	}
	if u.dropped.Load() == 0 {
		t.Fatal("alerts beyond the queue were not counted as dropped")
	}
}

// listed is a subscription list the test changes.
type listed struct {
	mu   sync.Mutex
	subs []subscription.Subscription
}

func (l *listed) List(string) []subscription.Subscription {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]subscription.Subscription(nil), l.subs...)
}

// A deleted subscription's series leave /metrics at the next scrape.
func TestSeriesGoWithTheirSubscription(t *testing.T) {
	t.Parallel()
	c := &counts{n: map[string]int64{"gone": 3, "kept": 1}}
	l := &listed{subs: []subscription.Subscription{
		subscription.Subscription{Topic: "t", Name: "gone"}.WithDefaults(),
		subscription.Subscription{Topic: "t", Name: "kept"}.WithDefaults(),
	}}
	u := New(Config{}, c, l, nil, nil, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(u.Collectors()...)
	u.Check(context.Background())
	series := func() map[string]int {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "subscription" {
						out[lp.GetValue()]++
					}
				}
			}
		}
		return out
	}
	if got := series(); got["gone"] == 0 || got["kept"] == 0 {
		t.Fatalf("series before the delete: %v", got)
	}
	l.mu.Lock()
	l.subs = l.subs[1:]
	l.mu.Unlock()
	if got := series(); got["gone"] != 0 || got["kept"] == 0 {
		t.Fatalf("series after the delete: %v, want none of gone", got)
	}
}
