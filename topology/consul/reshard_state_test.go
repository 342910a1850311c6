package consul_test

import (
	"errors"
	"testing"

	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/rebalance"
)

// The job document is replaced only by a writer that read its version.
func TestReshardStateCheckAndSet(t *testing.T) {
	t.Parallel()
	e := newDoubleEnv(t)
	st := e.source(t, e.config(t)).ReshardState()
	ctx := testtime.Context(t)
	js, err := st.Load(ctx)
	if err != nil || js.Version != 0 || len(js.Jobs) != 0 {
		t.Fatalf("empty store: %+v %v", js, err)
	}
	js.Jobs = append(js.Jobs, &rebalance.Job{ID: "rs-1", State: rebalance.StatePending})
	if err := st.Save(ctx, 0, js); err != nil {
		t.Fatal(err)
	}
	stale := &rebalance.Jobs{Jobs: []*rebalance.Job{{ID: "rs-2"}}}
	if err := st.Save(ctx, 0, stale); !errors.Is(err, rebalance.ErrConflict) {
		t.Fatalf("stale write: %v, want a conflict", err)
	}
	got, err := st.Load(ctx)
	if err != nil || got.Version != 1 || len(got.Jobs) != 1 || got.Jobs[0].ID != "rs-1" {
		t.Fatalf("after one write: %+v %v", got, err)
	}
	got.Jobs[0].State = rebalance.StateCopying
	if err := st.Save(ctx, 1, got); err != nil {
		t.Fatal(err)
	}
	if again, _ := st.Load(ctx); again.Version != 2 || again.Jobs[0].State != rebalance.StateCopying {
		t.Fatalf("after two writes: %+v", again)
	}
}
