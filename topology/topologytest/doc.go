package topologytest

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
)

// Doc is a document replaced with check-and-set, as a backend keeps the
// resharding jobs (rebalance.StateDoc declares it; topology does not
// import its user).
type Doc interface {
	Get(ctx context.Context) ([]byte, uint64, error)
	CompareAndSwap(ctx context.Context, rev uint64, data []byte) (bool, error)
}

// RunDoc is the suite every Doc passes (the static file's, Consul's, the
// fake of rebalance's tests). newDoc makes an empty document; documents
// are JSON, which a backend may reformat.
func RunDoc(t *testing.T, newDoc func(t *testing.T) Doc) {
	t.Run("CheckAndSet", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		d := newDoc(t)
		data, rev, err := d.Get(ctx)
		if err != nil || data != nil || rev != 0 {
			t.Fatalf("empty document: %q rev %d, %v", data, rev, err)
		}
		if ok, err := d.CompareAndSwap(ctx, 0, []byte(`{"v":1}`)); !ok || err != nil {
			t.Fatalf("first write: %v %v", ok, err)
		}
		if ok, err := d.CompareAndSwap(ctx, 0, []byte(`{"v":"stale"}`)); ok || err != nil {
			t.Fatalf("second create: %v %v, want refused", ok, err)
		}
		data, rev1, err := d.Get(ctx)
		if err != nil || rev1 == 0 || !sameJSON(data, `{"v":1}`) {
			t.Fatalf("after one write: %q rev %d, %v", data, rev1, err)
		}
		if ok, err := d.CompareAndSwap(ctx, rev1, []byte(`{"v":2}`)); !ok || err != nil {
			t.Fatalf("write at the current revision: %v %v", ok, err)
		}
		if ok, err := d.CompareAndSwap(ctx, rev1, []byte(`{"v":"stale"}`)); ok || err != nil {
			t.Fatalf("write at a stale revision: %v %v, want refused", ok, err)
		}
		data, rev2, err := d.Get(ctx)
		if err != nil || rev2 == rev1 || !sameJSON(data, `{"v":2}`) {
			t.Fatalf("after two writes: %q rev %d (was %d), %v", data, rev2, rev1, err)
		}
	})
	t.Run("OneWriterPerRevision", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		d := newDoc(t)
		if ok, err := d.CompareAndSwap(ctx, 0, []byte(`{"v":0}`)); !ok || err != nil {
			t.Fatalf("first write: %v %v", ok, err)
		}
		const writers = 8
		var read, wrote sync.WaitGroup
		read.Add(writers)
		wrote.Add(writers)
		wins := make(chan int, writers)
		for i := range writers {
			go func() {
				defer wrote.Done()
				_, rev, err := d.Get(ctx)
				read.Done()
				read.Wait() // every writer read the same revision
				if err != nil {
					t.Error(err)
					return
				}
				ok, err := d.CompareAndSwap(ctx, rev, []byte(`{"v":`+string(rune('1'+i))+`}`))
				if err != nil {
					t.Error(err)
				}
				if ok {
					wins <- i
				}
			}()
		}
		wrote.Wait()
		close(wins)
		if n := len(wins); n != 1 {
			t.Fatalf("%d writers of one revision succeeded, want 1", n)
		}
		won := <-wins
		if data, _, _ := d.Get(ctx); !sameJSON(data, `{"v":`+string(rune('1'+won))+`}`) {
			t.Fatalf("stored %q, the winner was writer %d", data, won)
		}
	})
}

func sameJSON(got []byte, want string) bool {
	var a, b bytes.Buffer
	return json.Compact(&a, got) == nil && json.Compact(&b, []byte(want)) == nil && bytes.Equal(a.Bytes(), b.Bytes())
}
