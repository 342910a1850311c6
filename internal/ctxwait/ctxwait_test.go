package ctxwait

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := Sleep(ctx, 0); err != nil {
		t.Fatalf("no wait: %v", err)
	}
	if err := Sleep(ctx, time.Millisecond); err != nil {
		t.Fatalf("a wait that runs out: %v", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := Sleep(done, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait whose context ended: %v", err)
	}
	if err := Sleep(done, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("no wait, context ended: %v", err)
	}
}
