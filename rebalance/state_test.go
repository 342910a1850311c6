package rebalance

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/shardmq/shardmq/topology/topologytest"
)

// memDoc is a StateDoc in memory, held to the backends' suite.
type memDoc struct {
	mu   sync.Mutex
	data []byte
	rev  uint64
}

func (d *memDoc) Get(ctx context.Context) ([]byte, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return d.data, d.rev, nil
}

func (d *memDoc) CompareAndSwap(ctx context.Context, rev uint64, data []byte) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if rev != d.rev {
		return false, nil
	}
	d.data, d.rev = append([]byte(nil), data...), d.rev+1
	return true, nil
}

func TestMemDocSuite(t *testing.T) {
	t.Parallel()
	topologytest.RunDoc(t, func(*testing.T) topologytest.Doc { return &memDoc{} })
}

// The jobs are saved only by a writer that read their version.
func TestStateCheckAndSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := stateStore{doc: &memDoc{}}
	js, err := st.Load(ctx)
	if err != nil || js.Version != 0 || len(js.Jobs) != 0 {
		t.Fatalf("empty: %+v %v", js, err)
	}
	js.Jobs = []*Job{{ID: "rs-1", State: StatePending}}
	if err := st.Save(ctx, 0, js); err != nil {
		t.Fatal(err)
	}
	if err := st.Save(ctx, 0, &Jobs{}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale write: %v", err)
	}
	got, err := st.Load(ctx)
	if err != nil || got.Version != 1 || len(got.Jobs) != 1 || got.Jobs[0].ID != "rs-1" {
		t.Fatalf("after one write: %+v %v", got, err)
	}
	got.Jobs[0].State = StateCopying
	if err := st.Save(ctx, 1, got); err != nil {
		t.Fatal(err)
	}
	if again, _ := st.Load(ctx); again.Version != 2 || again.Jobs[0].State != StateCopying {
		t.Fatalf("after two writes: %+v", again)
	}
}

// A write that loses the document's check-and-set to another writer
// between its read and its write is a conflict too.
func TestStateLostRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	doc := &racingDoc{memDoc: &memDoc{}}
	st := stateStore{doc: doc}
	doc.before = func() { doc.memDoc.CompareAndSwap(ctx, doc.memDoc.rev, []byte(`{"version":0}`)) }
	if err := st.Save(ctx, 0, &Jobs{}); !errors.Is(err, ErrConflict) {
		t.Fatalf("write that lost the race: %v", err)
	}
}

// racingDoc runs before ahead of every CompareAndSwap.
type racingDoc struct {
	*memDoc
	before func()
}

func (d *racingDoc) CompareAndSwap(ctx context.Context, rev uint64, data []byte) (bool, error) {
	d.before()
	return d.memDoc.CompareAndSwap(ctx, rev, data)
}
