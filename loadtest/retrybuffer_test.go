package loadtest

import (
	"context"
	"testing"
	"time"
)

// Producers take no new messages while the retry queue is full, go on
// once the retriers stored some, and stop waiting when production ends.
func TestProducersWaitForRoomInTheRetryBuffer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limit   int
		queued  int
		drain   bool // the retriers store some while the producer waits
		endsIn  time.Duration
		want    bool
		waitsAt time.Duration
	}{
		{"below the limit", 10, 9, false, time.Minute, true, 0},
		{"unbounded", -1, 1000, false, time.Minute, true, 0},
		{"full until the retriers store some", 10, 10, true, time.Minute, true, 50 * time.Millisecond},
		{"full until production ends", 10, 10, false, 100 * time.Millisecond, false, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &phase{cfg: &Config{RetryBuffer: tc.limit}, end: time.Now().Add(tc.endsIn)}
			p.retry.add(0, make([]Message, tc.queued))
			if tc.drain {
				time.AfterFunc(50*time.Millisecond, func() { p.retry.take(5) })
			}
			began := time.Now()
			if got := p.roomToProduce(context.Background()); got != tc.want {
				t.Fatalf("room: %v, want %v", got, tc.want)
			}
			if waited := time.Since(began); waited < tc.waitsAt {
				t.Fatalf("returned after %v, before the %v it had to wait", waited, tc.waitsAt)
			}
		})
	}
}
