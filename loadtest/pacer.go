package loadtest

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
)

// Pacer is the open-loop schedule of a group of workers: request n is
// meant to be sent at start + n/rate, whoever sends it. A worker takes the
// next slot with Next, which waits until the slot's time; a worker that is
// late (every worker was busy when the slot came) gets the slot at once,
// with its intended time in the past. Latency measured from the intended
// time therefore includes the time a request waited for a free worker:
// a stall of the system under test shows in the percentiles instead of
// quietly lowering the offered load (coordinated omission).
//
// A Pacer with rate 0 is closed loop: Next returns at once with now as
// the intended time, so each worker sends as soon as it is free.
type Pacer struct {
	rate  float64
	start time.Time
	end   time.Time
	next  atomic.Int64
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// NewPacer schedules rate requests a second from start, none at or after
// end.
func NewPacer(rate float64, start, end time.Time) *Pacer {
	return &Pacer{rate: max(rate, 0), start: start, end: end, now: time.Now, sleep: ctxwait.Sleep}
}

// slot is the intended time of request n.
func (p *Pacer) slot(n int64) time.Time {
	return p.start.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
}

// Next takes the next slot, waits until its time and returns it. ok is
// false once end has passed (slots still due then are never sent) or ctx
// is done: the worker stops.
func (p *Pacer) Next(ctx context.Context) (intended time.Time, ok bool) {
	if ctx.Err() != nil {
		return time.Time{}, false
	}
	if p.rate == 0 {
		now := p.now()
		if !now.Before(p.end) {
			return time.Time{}, false
		}
		return now, true
	}
	if !p.now().Before(p.end) {
		// Slots still due at the end are never sent: Behind counts them.
		return time.Time{}, false
	}
	at := p.slot(p.next.Add(1) - 1)
	if !at.Before(p.end) {
		return time.Time{}, false
	}
	if err := p.sleep(ctx, at.Sub(p.now())); err != nil {
		return time.Time{}, false
	}
	return at, true
}

// Behind is how many slots are due by now but not yet taken: the backlog
// of requests the workers could not send on time. Always 0 closed loop.
func (p *Pacer) Behind() int64 {
	if p.rate == 0 {
		return 0
	}
	now := p.now()
	if now.After(p.end) {
		now = p.end
	}
	// Slots intended by now, of those before the end.
	due := min(int64(now.Sub(p.start).Seconds()*p.rate)+1, int64(math.Ceil(p.end.Sub(p.start).Seconds()*p.rate)))
	return max(0, due-p.next.Load())
}

// Taken is how many slots were handed out.
func (p *Pacer) Taken() int64 { return p.next.Load() }
