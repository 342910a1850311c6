package store

import (
	"context"
	"errors"
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
)

// What the broker's group committer relies on when it splits a batch to
// isolate a bad item (broker.committer.produceIsolated): an item the
// database refuses fails its whole transaction, with nothing of the batch
// applied, and with an error that is not ErrUnavailable (which would make
// the committer give up instead of splitting); a value too long for its
// column is ErrInvalidData, which the broker answers "rejected".
func TestProduceRefusedItemFailsItsWholeBatch(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	ctx := context.Background()

	a, b := f.item("t", "a", `1`), f.item("t", "b", `1`)
	clash := f.item("t", "clash", `1`)
	clash.Msg.ID = a.Msg.ID // an id already taken in the same batch
	_, err := f.st.Produce(ctx, []ProduceItem{a, b, clash})
	if err == nil || errors.Is(err, ErrUnavailable) {
		t.Fatalf("batch with a taken id: %v, want a refusal that is not unavailable", err)
	}
	if n := f.count(t, "SELECT COUNT(*) FROM message_key WHERE topic = 't'"); n != 0 {
		t.Fatalf("%d keys registered by a refused batch: half-applied", n)
	}

	long := f.item("t", "too-long-headers", `1`)
	long.Msg.Headers = make([]byte, MaxHeadersBytes+1)
	if _, err := f.st.Produce(ctx, []ProduceItem{long}); !errors.Is(err, ErrInvalidData) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("headers one byte over the column: %v, want ErrInvalidData", err)
	}
	fits := f.item("t", "headers-filling-the-column", `1`)
	fits.Msg.Headers = make([]byte, MaxHeadersBytes)
	if res, err := f.st.Produce(ctx, []ProduceItem{fits}); err != nil || res[0].Status != Created {
		t.Fatalf("headers of exactly the column's size: %v %v", res, err)
	}
}
