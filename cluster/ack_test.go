package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/cluster/clustertest"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/store"
)

// gatedShard holds its first AckMany until gate is closed and records how
// many groups each call carried.
type gatedShard struct {
	*clustertest.Store
	started chan struct{}
	gate    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	calls   []int
}

func (g *gatedShard) AckMany(ctx context.Context, groups []store.AckGroup, now time.Time) []store.AckResult {
	g.once.Do(func() {
		close(g.started)
		<-g.gate
	})
	g.mu.Lock()
	g.calls = append(g.calls, len(groups))
	g.mu.Unlock()
	return g.Store.AckMany(ctx, groups, now)
}

// Acks that arrive while the cluster's ack transaction runs go together
// in the next one, and each caller gets its own statuses.
func TestAckerCoalescesWaitingAcks(t *testing.T) {
	t.Parallel()
	st := clustertest.NewStore()
	ids := idgen.New(nil)
	var items []store.ProduceItem
	for i := range 30 {
		items = append(items, item(ids.Next(), fmt.Sprint("k", i)))
	}
	if _, err := st.Produce(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	var leases [3][]store.Lease
	for i := range leases {
		tok := ids.Next()
		many, err := st.ClaimMany(context.Background(), []store.ClaimRequest{{Topic: "t", Subscription: "default", Consumer: "w", Max: 10,
			Lease: time.Minute, Token: tok, MaxAttempts: 5, Now: time.Now()}})
		var got []store.Claimed
		if err == nil {
			got = many[0]
		}
		if err != nil || len(got) != 10 {
			t.Fatalf("claim %d: %d, %v", i, len(got), err)
		}
		for _, c := range got {
			leases[i] = append(leases[i], store.Lease{MessageID: c.Message.ID, Subscription: "default", Token: tok})
		}
	}
	leases[2][0].Token++ // one lost lease: that batch falls back per request

	g := &gatedShard{Store: st, started: make(chan struct{}), gate: make(chan struct{})}
	a := newAcker(direct{g})
	var wg sync.WaitGroup
	results := make([][]store.LeaseStatus, 3)
	errs := make([]error, 3)
	ack := func(i int) {
		defer wg.Done()
		results[i], errs[i] = a.ack(context.Background(), leases[i], time.Now())
	}
	wg.Add(1)
	go ack(0)
	<-g.started
	wg.Add(2)
	go ack(1)
	go ack(2)
	testtime.WithinState(t, 10*time.Second, "two acks queued", func() (bool, string) {
		n, _ := a.batch.Queued()
		return n == 2, fmt.Sprint(n, " queued")
	})
	close(g.gate)
	wg.Wait()
	if fmt.Sprint(g.calls) != "[1 2]" {
		t.Errorf("AckMany calls carried %v groups, want [1 2]", g.calls)
	}
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("ack %d: %v", i, errs[i])
		}
		for j, s := range results[i] {
			want := store.LeaseOK
			if i == 2 && j == 0 {
				want = store.LeaseLost
			}
			if s != want {
				t.Errorf("ack %d lease %d: %v, want %v", i, j, s, want)
			}
		}
	}
	st.Mu.Lock()
	left := len(st.Dels)
	st.Mu.Unlock()
	if left != 1 {
		t.Errorf("%d deliveries left, want 1 (the lost lease's)", left)
	}
	testtime.Within(t, 10*time.Second, "the worker stopping with nothing queued", func() bool {
		return !a.batch.Busy()
	})
}
