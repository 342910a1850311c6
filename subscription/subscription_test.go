package subscription

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run the registry's logic — the implicit default
// subscription, the first produce storing it, the caps, creation times,
// refreshes racing local changes — against a fake of the Store interface
// this package declares. MySQLStore and Mirrored are tested on real
// MariaDB through server/.

// fakeStore is a Store in memory. putErr fails Put while set; listGate,
// when set, holds each List after reading until it is closed.
type fakeStore struct {
	mu      sync.Mutex
	subs    map[[2]string]Subscription
	puts    int
	putErr  error
	listErr error

	listRead chan struct{}
	listGate chan struct{}
}

func newFakeStore(subs ...Subscription) *fakeStore {
	f := &fakeStore{subs: map[[2]string]Subscription{}}
	for _, s := range subs {
		f.subs[[2]string{s.Topic, s.Name}] = s
	}
	return f
}

func (f *fakeStore) List(context.Context) ([]Subscription, error) {
	f.mu.Lock()
	out := make([]Subscription, 0, len(f.subs))
	for _, s := range f.subs {
		out = append(out, s)
	}
	err, read, gate := f.listErr, f.listRead, f.listGate
	f.mu.Unlock()
	if gate != nil {
		read <- struct{}{}
		<-gate
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (f *fakeStore) Put(_ context.Context, s Subscription) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.puts++
	if f.putErr != nil {
		return f.putErr
	}
	f.subs[[2]string{s.Topic, s.Name}] = s
	return nil
}

func (f *fakeStore) Delete(_ context.Context, topic, name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.subs[[2]string{topic, name}]
	delete(f.subs, [2]string{topic, name})
	return ok, nil
}

func (f *fakeStore) set(fn func(f *fakeStore)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func newRegistry(t *testing.T, st Store) *Registry {
	t.Helper()
	r := NewRegistry(st, time.Hour, func() time.Time { return t0 }, nil)
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func TestWithDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	d := Subscription{Topic: "orders", Name: "billing"}.WithDefaults()
	if d.MaxAttempts != 5 || d.Backoff != (Backoff{InitialMS: 1000, MaxMS: 600000, Multiplier: 2}) ||
		d.DeadLetterAlarm != (Alarm{GrowthPercent: 50, Window: "1h"}) {
		t.Fatalf("defaults %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	cases := []struct {
		name string
		edit func(*Subscription)
		want string // in the error; "" for valid
	}{
		{"topic", func(s *Subscription) { s.Topic = "a b" }, "topic"},
		{"name", func(s *Subscription) { s.Name = strings.Repeat("n", 129) }, "name"},
		{"attempts low", func(s *Subscription) { s.MaxAttempts = -1 }, "max_attempts"},
		{"attempts high", func(s *Subscription) { s.MaxAttempts = 1001 }, "max_attempts"},
		{"attempts edge", func(s *Subscription) { s.MaxAttempts = 1000 }, ""},
		{"initial", func(s *Subscription) { s.Backoff.InitialMS = 86400001 }, "backoff.initial_ms"},
		{"max below initial", func(s *Subscription) { s.Backoff.MaxMS = 999 }, "backoff.max_ms"},
		{"max over a week", func(s *Subscription) { s.Backoff.MaxMS = 7*86400000 + 1 }, "backoff.max_ms"},
		{"multiplier", func(s *Subscription) { s.Backoff.Multiplier = 0.5 }, "backoff.multiplier"},
		{"jitter", func(s *Subscription) { s.Backoff.Jitter = 1.5 }, "backoff.jitter"},
		{"jitter edge", func(s *Subscription) { s.Backoff.Jitter = 1 }, ""},
		{"growth", func(s *Subscription) { s.DeadLetterAlarm.GrowthPercent = -1 }, "growth_percent"},
		{"window unparsable", func(s *Subscription) { s.DeadLetterAlarm.Window = "soon" }, "window"},
		{"window short", func(s *Subscription) { s.DeadLetterAlarm.Window = "59s" }, "window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := d
			tc.edit(&s)
			err := s.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid subscription refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want ErrInvalid naming %s", err, tc.want)
			}
		})
	}
}

func TestPolicyCarriesTheBackoff(t *testing.T) {
	t.Parallel()
	s := Subscription{Topic: "t", Name: "s", MaxAttempts: 3, Backoff: Backoff{InitialMS: 250, MaxMS: 4000, Multiplier: 3, Jitter: 0.1}}
	p := s.WithDefaults().Policy()
	if p.MaxAttempts != 3 || p.Initial != 250*time.Millisecond || p.Max != 4*time.Second || p.Multiplier != 3 || p.Jitter != 0.1 {
		t.Fatalf("policy %+v", p)
	}
}

func TestImplicitDefaultSubscription(t *testing.T) {
	t.Parallel()
	r := newRegistry(t, newFakeStore(Subscription{Topic: "has", Name: "billing", CreatedAt: t0}))
	cases := []struct {
		topic, name  string
		ok, implicit bool
	}{
		{"empty", Default, true, true},   // a topic without subscriptions has its default
		{"empty", "other", false, false}, // and nothing else
		{"has", Default, false, false},   // a topic with one has no implicit default
		{"has", "billing", true, false},
	}
	for _, tc := range cases {
		s, ok, err := r.Get(context.Background(), tc.topic, tc.name)
		if err != nil || ok != tc.ok || (ok && s.Implicit() != tc.implicit) {
			t.Errorf("Get(%s, %s) = %+v, %v, %v", tc.topic, tc.name, s, ok, err)
		}
		if ok && tc.implicit && (s.MaxAttempts != 5 || s.Topic != tc.topic) {
			t.Errorf("implicit default %+v lacks its defaults", s)
		}
	}
}

func TestFirstProduceStoresTheDefaultOnce(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	r := newRegistry(t, st)
	for range 3 {
		subs, err := r.ForProduce(context.Background(), "orders")
		if err != nil || !slices.Equal(subs, []string{Default}) {
			t.Fatalf("ForProduce = %v, %v", subs, err)
		}
	}
	if st.puts != 1 {
		t.Fatalf("default stored %d times, want once", st.puts)
	}
	s, ok, _ := r.Get(context.Background(), "orders", Default)
	if !ok || s.Implicit() || !s.CreatedAt.Equal(t0) {
		t.Fatalf("stored default %+v", s)
	}
}

func TestFirstProduceRetriesAFailedDefaultWrite(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	st.putErr = errors.New("cluster down")
	r := newRegistry(t, st)
	subs, err := r.ForProduce(context.Background(), "orders")
	if err != nil || !slices.Equal(subs, []string{Default}) {
		t.Fatalf("ForProduce while the store fails = %v, %v; want the default and no error", subs, err)
	}
	st.set(func(f *fakeStore) { f.putErr = nil })
	if _, err := r.ForProduce(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ForProduce(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	if st.puts != 2 {
		t.Fatalf("%d writes, want the failed one and one more", st.puts)
	}
}

// A subscription another router made since the last refresh receives the
// topic's messages instead of a default this router would make up.
func TestFirstProduceSeesAnotherRoutersSubscription(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	r := newRegistry(t, st)
	st.set(func(f *fakeStore) {
		f.subs[[2]string{"orders", "billing"}] = Subscription{Topic: "orders", Name: "billing", CreatedAt: t0}
		f.subs[[2]string{"orders", "audit"}] = Subscription{Topic: "orders", Name: "audit", CreatedAt: t0}
	})
	subs, err := r.ForProduce(context.Background(), "orders")
	if err != nil || !slices.Equal(subs, []string{"audit", "billing"}) {
		t.Fatalf("ForProduce = %v, %v", subs, err)
	}
	if st.puts != 0 {
		t.Fatal("a default was stored next to another router's subscriptions")
	}
}

func TestCaps(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		limits  Limits
		have    []Subscription
		put     Subscription
		produce string // a topic to produce to instead of put
		want    error
	}{
		{"per topic", Limits{MaxPerTopic: 2}, subsOf("a", "x", "y"), Subscription{Topic: "a", Name: "z"}, "", ErrTooManySubscriptions},
		{"replacing is not one more", Limits{MaxPerTopic: 2}, subsOf("a", "x", "y"), Subscription{Topic: "a", Name: "y", MaxAttempts: 9}, "", nil},
		{"per topic off", Limits{MaxPerTopic: -1}, subsOf("a", "x", "y"), Subscription{Topic: "a", Name: "z"}, "", nil},
		{"topics", Limits{MaxTopics: 1}, subsOf("a", "x"), Subscription{Topic: "b", Name: "x"}, "", ErrTooManyTopics},
		{"a known topic is not one more", Limits{MaxTopics: 1}, subsOf("a", "x"), Subscription{Topic: "a", Name: "w"}, "", nil},
		{"topics by produce", Limits{MaxTopics: 1}, subsOf("a", "x"), Subscription{}, "b", ErrTooManyTopics},
		{"topics off", Limits{MaxTopics: -1}, subsOf("a", "x"), Subscription{}, "b", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := newFakeStore(tc.have...)
			r := newRegistry(t, st)
			r.SetLimits(tc.limits)
			var err error
			if tc.produce != "" {
				_, err = r.ForProduce(context.Background(), tc.produce)
			} else {
				_, _, err = r.Put(context.Background(), tc.put)
			}
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if tc.want != nil && st.puts != 0 {
				t.Fatal("a refused subscription was written")
			}
		})
	}
}

func subsOf(topic string, names ...string) []Subscription {
	var out []Subscription
	for _, n := range names {
		out = append(out, Subscription{Topic: topic, Name: n, CreatedAt: t0.Add(-time.Hour)}.WithDefaults())
	}
	return out
}

func TestPutReportsNewAndKeepsCreationTime(t *testing.T) {
	t.Parallel()
	st := newFakeStore(subsOf("a", "x")...)
	r := newRegistry(t, st)
	cases := []struct {
		sub         Subscription
		wantNew     bool
		wantCreated time.Time
		wantErr     error
	}{
		{Subscription{Topic: "a", Name: "x", MaxAttempts: 9}, false, t0.Add(-time.Hour), nil},
		{Subscription{Topic: "a", Name: "y"}, true, t0, nil},
		{Subscription{Topic: "b", Name: Default}, true, t0, nil}, // an implicit default is new once stored
		{Subscription{Topic: "a", Name: "z", MaxAttempts: 5000}, false, time.Time{}, ErrInvalid},
	}
	for _, tc := range cases {
		got, isNew, err := r.Put(context.Background(), tc.sub)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Fatalf("Put(%s/%s): %v, want %v", tc.sub.Topic, tc.sub.Name, err, tc.wantErr)
		}
		if err != nil {
			continue
		}
		if isNew != tc.wantNew || !got.CreatedAt.Equal(tc.wantCreated) {
			t.Errorf("Put(%s/%s) new=%v created %v, want %v and %v", tc.sub.Topic, tc.sub.Name, isNew, got.CreatedAt, tc.wantNew, tc.wantCreated)
		}
		if stored, ok, _ := r.Get(context.Background(), tc.sub.Topic, tc.sub.Name); !ok || stored.MaxAttempts != got.MaxAttempts {
			t.Errorf("cache has %+v after Put", stored)
		}
	}
	if got := fmt.Sprint(names(r.List(""))); got != "[a/x a/y b/default]" {
		t.Errorf("List = %s", got)
	}
	if got := fmt.Sprint(names(r.List("a"))); got != "[a/x a/y]" {
		t.Errorf("List(a) = %s", got)
	}
}

func names(subs []Subscription) []string {
	out := make([]string, len(subs))
	for i, s := range subs {
		out[i] = s.Topic + "/" + s.Name
	}
	return out
}

func TestDelete(t *testing.T) {
	t.Parallel()
	st := newFakeStore(subsOf("a", "x")...)
	r := newRegistry(t, st)
	if err := r.Delete(context.Background(), "a", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of an unknown subscription: %v", err)
	}
	if err := r.Delete(context.Background(), "a", "x"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.Get(context.Background(), "a", "x"); ok {
		t.Fatal("deleted subscription still cached")
	}
	if _, ok := st.subs[[2]string{"a", "x"}]; ok {
		t.Fatal("deleted subscription still stored")
	}
	if s, ok, _ := r.Get(context.Background(), "a", Default); !ok || !s.Implicit() {
		t.Fatal("a topic whose last subscription was deleted has no implicit default")
	}
}

// A refresh that read the store before a change made through this router
// must not put the older list back in the cache.
func TestRefreshDoesNotUndoALocalChange(t *testing.T) {
	t.Parallel()
	st := newFakeStore(subsOf("a", "x")...)
	r := newRegistry(t, st)
	read, gate := make(chan struct{}), make(chan struct{})
	st.set(func(f *fakeStore) { f.listRead, f.listGate = read, gate })
	done := make(chan error, 1)
	go func() { done <- r.Refresh(context.Background()) }()
	<-read // the refresh has read the old list
	st.set(func(f *fakeStore) { f.listGate, f.listRead = nil, nil })
	if _, _, err := r.Put(context.Background(), Subscription{Topic: "a", Name: "y"}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := r.Get(context.Background(), "a", "y"); !ok {
		t.Fatal("a refresh that started before Put removed the new subscription from the cache")
	}
	// The next refresh reads the store as it is now.
	if err := r.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(names(r.List("a"))); got != "[a/x a/y]" {
		t.Fatalf("after a clean refresh: %s", got)
	}
}

func TestRefreshKeepsTheCacheWhenTheStoreFails(t *testing.T) {
	t.Parallel()
	st := newFakeStore(subsOf("a", "x")...)
	r := newRegistry(t, st)
	st.set(func(f *fakeStore) { f.listErr = errors.New("consul down") })
	if err := r.Refresh(context.Background()); err == nil {
		t.Fatal("a failed refresh reported no error")
	}
	if _, ok, _ := r.Get(context.Background(), "a", "x"); !ok {
		t.Fatal("a failed refresh emptied the cache")
	}
	st2 := newFakeStore()
	st2.listErr = errors.New("consul down")
	if err := NewRegistry(st2, 0, nil, nil).Start(context.Background()); err == nil {
		t.Fatal("Start succeeded without a first load")
	}
}
