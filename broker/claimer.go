package broker

import (
	"context"
	"sync"
	"time"

	"github.com/shardmq/shardmq/store"
)

// Claim coalescing. Consumers of one subscription that claim at the same
// time through this router are served by one transaction per cluster: one
// FOR UPDATE SKIP LOCKED walk of the index head for all of them, each
// request keeping its own lease and claim token. Without it, N consumers
// run N walks that skip each other's locked rows, and throughput falls as
// consumers are added (measured here: 4 workers 17.4k/s, 16 workers on one
// subscription 4.6k/s).

// maxCoalescedClaim caps the rows one coalesced claim transaction leases.
const maxCoalescedClaim = 1000

type claimKey struct {
	shard     *clusterShard
	topic     string
	sub       string
	ordered   bool
	dead      bool
	errorCode string
}

type claimCall struct {
	req  store.ClaimRequest
	done chan claimAnswer // buffered 1
}

type claimAnswer struct {
	got []store.Claimed
	err error
}

// claimers runs one worker per claimKey while claims for it keep coming;
// a worker idle for a while exits and is recreated on demand.
type claimers struct {
	mu      sync.Mutex
	workers map[claimKey]chan *claimCall
	idle    time.Duration
}

func newClaimers() *claimers {
	return &claimers{workers: map[claimKey]chan *claimCall{}, idle: 10 * time.Second}
}

// claim queues req and waits for its share of a coalesced claim.
func (c *claimers) claim(ctx context.Context, k claimKey, req store.ClaimRequest) ([]store.Claimed, error) {
	call := &claimCall{req: req, done: make(chan claimAnswer, 1)}
	c.mu.Lock()
	in, ok := c.workers[k]
	if !ok {
		in = make(chan *claimCall, 256)
		c.workers[k] = in
		go c.work(k, in)
	}
	c.mu.Unlock()
	select {
	case in <- call:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The claim runs to the end even if ctx ends meanwhile: its leases are
	// then simply not delivered and expire into a new attempt.
	a := <-call.done
	return a.got, a.err
}

func (c *claimers) work(k claimKey, in chan *claimCall) {
	timer := time.NewTimer(c.idle)
	defer timer.Stop()
	for {
		var first *claimCall
		select {
		case first = <-in:
		case <-timer.C:
			// Exit only if nothing raced in: a caller holds the map lock
			// while it finds this channel, so check and delete under it.
			c.mu.Lock()
			if len(in) > 0 {
				c.mu.Unlock()
				timer.Reset(c.idle)
				continue
			}
			delete(c.workers, k)
			c.mu.Unlock()
			// A caller that found the channel before the delete may
			// still send; serve it, then stop.
			for {
				select {
				case call := <-in:
					c.run(k, []*claimCall{call})
				default:
					return
				}
			}
		}
		calls := []*claimCall{first}
		n := first.req.Max
	drain:
		for n < maxCoalescedClaim {
			select {
			case call := <-in:
				calls = append(calls, call)
				n += call.req.Max
			default:
				break drain
			}
		}
		c.run(k, calls)
		timer.Reset(c.idle)
	}
}

func (c *claimers) run(k claimKey, calls []*claimCall) {
	reqs := make([]store.ClaimRequest, len(calls))
	for i, call := range calls {
		reqs[i] = call.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := k.shard.ClaimMany(ctx, reqs)
	for i, call := range calls {
		if err != nil {
			call.done <- claimAnswer{err: err}
			continue
		}
		call.done <- claimAnswer{got: got[i]}
	}
}
