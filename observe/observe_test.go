package observe

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

func TestLabelsCapAndForget(t *testing.T) {
	t.Parallel()
	l := NewLabels(2)
	for _, c := range []struct {
		topic, sub   string
		wantT, wantS string
	}{
		{"a", "s1", "a", "s1"},
		{"a", "s2", "a", "s2"},
		{"a", "s3", Other, Other}, // pairs full
		{"b", "s1", Other, Other}, // topic b gets a place, its pair does not
		{"c", "s1", Other, Other},
		{"a", "s1", "a", "s1"},
	} {
		if gotT, gotS := l.Pair(c.topic, c.sub); gotT != c.wantT || gotS != c.wantS {
			t.Fatalf("Pair(%s, %s) = %s, %s; want %s, %s", c.topic, c.sub, gotT, gotS, c.wantT, c.wantS)
		}
	}
	if got := l.Topic("c"); got != Other {
		t.Fatalf("Topic(c) = %s", got)
	}
	if !l.Forget("a", "s2") || l.Forget("a", "s3") {
		t.Fatal("Forget must say whether the pair had a place")
	}
	if got := l.Topic("b"); got != "b" {
		t.Fatalf("Topic(b) = %s: b got its place with its first pair", got)
	}
	if gotT, gotS := l.Pair("b", "s1"); gotT != "b" || gotS != "s1" {
		t.Fatalf("a freed place is not reused: %s, %s", gotT, gotS)
	}
}

// fakeStats answers queue counts for many subscriptions (no database: this
// is about label bounds, not counting).
type fakeStats struct{ subs []store.QueueStats }

func (f fakeStats) Stats(context.Context) broker.Stats { return broker.Stats{Subscriptions: f.subs} }

type allExist struct{}

func (allExist) Get(context.Context, string, string) (subscription.Subscription, bool, error) {
	return subscription.Subscription{}, true, nil
}

// TestTenThousandTopicsStayBounded feeds every per-topic metric with
// 10,000 topics of two subscriptions each and checks the series count
// stays under its bound, with the excess summed into _other.
func TestTenThousandTopicsStayBounded(t *testing.T) {
	t.Parallel()
	const topics, cap = 10000, 200
	reg := prometheus.NewRegistry()
	labels := NewLabels(cap)
	msgs := NewMessages(reg, labels)
	base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	now := base.Add(time.Hour)
	ids := idgen.New(func() time.Time { return base })
	var stats []store.QueueStats
	for i := 0; i < topics; i++ {
		topic := fmt.Sprintf("t%05d", i)
		msgs.Produced(topic, "created", 3)
		msgs.Produced(topic, "duplicate", 1)
		for _, sub := range []string{"default", "audit"} {
			msgs.Claimed(topic, sub, 2)
			msgs.Acked(topic, sub, 1)
			msgs.Nacked(topic, sub, 1)
			msgs.Delivered(topic, sub, store.EventDeadLettered, 1)
			msgs.Delivered(topic, sub, store.EventLeaseExpired, 1)
			stats = append(stats, store.QueueStats{Topic: topic, Subscription: sub, Ready: 1, Dead: 1, OldestReady: ids.Next()})
		}
	}
	q := NewQueueHealth(time.Minute, fakeStats{stats}, allExist{}, labels, msgs, nil, func() time.Time { return now }, nil)
	reg.MustRegister(q)
	q.Refresh(context.Background())

	series, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Per metric: produced ≤ 2 statuses × (cap+1) topics; each pair metric
	// ≤ cap+1 pairs (cap own, one _other); queue: 5 states + the age per
	// pair; 5 facts of the count.
	pairs := cap + 1
	bound := 2*(cap+1) + 5*pairs + 6*pairs + 5
	if series > bound || series < 1000 {
		t.Fatalf("%d series for %d topics, bound %d", series, topics, bound)
	}
	t.Logf("%d series for %d topics (bound %d)", series, topics, bound)

	// Nothing was dropped: the totals over all series are the inputs'.
	sum := func(name string) float64 {
		fams, _ := reg.Gather()
		v := 0.0
		for _, f := range fams {
			if f.GetName() == name {
				for _, m := range f.GetMetric() {
					v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
		return v
	}
	for name, want := range map[string]float64{
		"shardmq_messages_produced_total":      4 * topics,
		"shardmq_messages_claimed_total":       2 * 2 * topics,
		"shardmq_messages_dead_lettered_total": 2 * topics,
		"shardmq_queue_messages":               2 * 2 * topics, // ready + dead
	} {
		if got := sum(name); got != want {
			t.Errorf("%s sums to %v, want %v", name, got, want)
		}
	}
	// _other's oldest ready message is the oldest of those it sums.
	other := testutil.ToFloat64(oneSeries(t, reg, "shardmq_queue_oldest_ready_age_seconds", Other, Other))
	// The first cap pairs (counted first) have places; ids grow, so the
	// oldest of the rest is the first of the rest.
	if want := now.Sub(idgen.Time(stats[cap].OldestReady)).Seconds(); other != want {
		t.Fatalf("_other age %v, want %v", other, want)
	}
}

// oneSeries picks one gauge series of a gathered family as a collector
// testutil can read.
func oneSeries(t *testing.T, g prometheus.Gatherer, name, topic, sub string) prometheus.Collector {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			lv := map[string]string{}
			for _, l := range m.GetLabel() {
				lv[l.GetName()] = l.GetValue()
			}
			if lv["topic"] == topic && lv["subscription"] == sub {
				return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x", Help: "x"}, func() float64 { return m.GetGauge().GetValue() })
			}
		}
	}
	t.Fatalf("no %s{topic=%s,subscription=%s}", name, topic, sub)
	return nil
}

func TestQueueHealthOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	leading := false
	q := NewQueueHealth(time.Minute, fakeStats{[]store.QueueStats{{Topic: "t", Subscription: "s", Ready: 3}}}, nil, NewLabels(10), nil,
		func() bool { return leading }, nil, nil)
	reg.MustRegister(q)
	q.Refresh(context.Background())
	if n, _ := testutil.GatherAndCount(reg, "shardmq_queue_messages"); n != 0 {
		t.Fatalf("a router that does not lead exported %d queue series", n)
	}
	leading = true
	q.Refresh(context.Background())
	if n, _ := testutil.GatherAndCount(reg, "shardmq_queue_messages"); n != 5 {
		t.Fatalf("the leading router exported %d queue series, want 5", n)
	}
}

func TestBuildInfo(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	RegisterRuntime(reg)
	for _, name := range []string{"shardmq_build_info", "go_goroutines", "process_resident_memory_bytes"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v", name, n, err)
		}
	}
	v, rev, gov := BuildInfo()
	if v == "" || rev == "" || gov == "" {
		t.Fatalf("BuildInfo() = %q, %q, %q", v, rev, gov)
	}
}
