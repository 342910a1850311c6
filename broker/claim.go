package broker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// ClaimRequest asks for up to Max deliveries of topic/sub.
type ClaimRequest struct {
	Topic, Subscription, Consumer string
	Max                           int
	// MaxBytes caps the message bytes (payload, headers and keys) of one
	// answer; 0: no cap. The first message is always delivered, even when
	// it alone exceeds the cap, so that a big message cannot get stuck.
	MaxBytes int
	Lease    time.Duration
	Wait     time.Duration
	// Dead claims from the dead-letter channel (only ErrorCode's when set).
	Dead      bool
	ErrorCode string
}

// Delivery is a leased message.
type Delivery struct {
	store.Claimed
	Receipt string
}

// Claim leases up to Max deliveries from all clusters, starting at a
// rotating cluster so that none starves. When none is ready it long-polls
// up to Wait: it wakes at once when this router produces to the topic and
// otherwise re-polls with a backoff from PollMin to PollMax. If every
// cluster failed it returns ErrUnavailable rather than an empty answer.
//
// A claim on the implicit default subscription of a topic that has no
// stored subscription (nothing was ever produced to it, or only through
// another router within the last subscription refresh) reads the
// databases once; while it waits it re-polls them only once this router
// produces to the topic or the topic's default subscription appears in
// the registry. Claims on made-up topic names thus cost no database
// round trips while they wait, and still see a topic produced later.
//
// If ctx ends while deliveries are being leased, they are released at
// once (ready again, the attempt not counted) instead of waiting for
// their lease to expire.
func (b *Broker) Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	sub, ok, err := b.subs.Get(ctx, req.Topic, req.Subscription)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrUnknownSubscription
	}
	implicit := sub.Implicit()
	deadline := time.Now().Add(req.Wait)
	poll := b.cfg.PollMin
	pk := pollKey{topic: req.Topic, sub: req.Subscription, dead: req.Dead, errorCode: req.ErrorCode}
	// A claim that may wait skips its first poll when another found the
	// subscription empty within PollMin (longpoll.go).
	// Implicit subscriptions (made-up topic names) are not remembered:
	// they never re-poll on a timer, and their names must leave nothing.
	readDB := req.Wait <= 0 || implicit || !b.polls.fresh(pk, time.Now(), b.cfg.PollMin)
	for {
		woken, release := b.wake.wait(req.Topic)
		var out []Delivery
		if readDB {
			if req.Dead {
				out, err = b.claimOnce(ctx, req, sub)
			} else {
				out, err = b.claimOwned(ctx, req, sub)
			}
			if err == nil && !implicit {
				b.polls.polled(pk, time.Now(), len(out) > 0, b.cfg.PollMax)
			}
		}
		if len(out) > 0 && ctx.Err() != nil {
			release()
			b.release(req, out)
			return nil, ctx.Err()
		}
		left := time.Until(deadline)
		if len(out) > 0 || err != nil || left <= 0 {
			release()
			if err != nil {
				return nil, err
			}
			if out == nil {
				out = []Delivery{}
			}
			return out, nil
		}
		timer := time.NewTimer(min(poll, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			release()
			return []Delivery{}, nil
		case <-b.draining:
			timer.Stop()
			release()
			return []Delivery{}, nil
		case <-woken:
			timer.Stop()
			poll = b.cfg.PollMin
			readDB = true
		case <-timer.C:
			// Another waiting claim's poll within this interval stands
			// for this one's.
			readDB = !implicit && !b.polls.fresh(pk, time.Now(), poll)
			poll = min(2*poll, b.cfg.PollMax)
		}
		release()
		if implicit {
			// A produce stores the topic's default subscription first:
			// once it is there, deliveries may be too.
			if s, ok, err := b.subs.Get(ctx, req.Topic, req.Subscription); err == nil && ok && !s.Implicit() {
				sub, implicit, readDB = s, false, true
			}
		}
	}
}

// release gives back deliveries a claim leased but cannot hand over.
func (b *Broker) release(req ClaimRequest, out []Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	receipts := make([]Receipt, 0, len(out))
	for _, d := range out {
		r, err := b.cfg.Receipts.Decode(d.Receipt)
		if err == nil {
			receipts = append(receipts, r)
		}
	}
	if !req.Dead {
		receipts = b.releaseOwned(ctx, req, receipts)
	}
	b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		leases := make([]store.Lease, len(idx))
		for j, i := range idx {
			leases[j] = receipts[i].Lease
		}
		_, err := cs.conn.Release(ctx, leases, !req.Dead, b.now().UTC())
		if err != nil {
			b.log.Warn("leases of an abandoned claim not released; they become claimable when they expire",
				"cluster", name, "topic", req.Topic, "subscription", req.Subscription, "leases", len(leases), "err", err)
		}
	})
}

func (b *Broker) claimOnce(ctx context.Context, req ClaimRequest, sub subscription.Subscription) ([]Delivery, error) {
	if b.selfFenced.Load() {
		return nil, errSelfFenced
	}
	ordered := sub.Ordered && !req.Dead
	if b.claimsStopped.Load() {
		return nil, cluster.ErrClaimsStopped // before a peek could answer "nothing to claim"
	}
	m, release := b.pin()
	defer release()
	ctx = store.WithFence(ctx, store.Fence{MapVersion: m.Version()}) // claims write leases
	exclude := m.FrozenVShards()
	names := m.Clusters()
	clusters := *b.clusters.Load()
	start := int(b.rr.Add(1))
	order := make([]string, len(names))
	for k := range names {
		order[k] = names[(start+k)%len(names)]
	}
	var plan claimPlan
	if len(order) > 1 {
		plan = b.planClaim(ctx, req, order, clusters, exclude)
		if plan.empty() {
			return []Delivery{}, nil
		}
		order = plan.order
	}
	var out []Delivery
	bytes := 0
	failed := map[string]bool{}
	for name := range plan.failed {
		failed[name] = true
	}
	var lastErr error = plan.err
	claimFrom := func(name string, max int) {
		if req.MaxBytes > 0 && bytes >= req.MaxBytes {
			return
		}
		s, ok := clusters[name]
		if !ok {
			failed[name] = true
			return
		}
		token := rand.Uint64() | 1
		key := cluster.ClaimKey{Topic: req.Topic, Sub: req.Subscription, Ordered: ordered, Dead: req.Dead, ErrorCode: req.ErrorCode,
			MapVersion: m.Version()}
		sreq := store.ClaimRequest{Topic: req.Topic, Subscription: req.Subscription, Consumer: req.Consumer,
			Max: max, Lease: req.Lease, Token: token, MaxAttempts: sub.Policy().MaxAttempts, Now: b.now().UTC(),
			Ordered: ordered, Dead: req.Dead, ErrorCode: req.ErrorCode, ExcludeVShards: exclude}
		if req.MaxBytes > 0 {
			sreq.MaxBytes, sreq.AllowOversize = req.MaxBytes-bytes, len(out) == 0
		}
		got, err := s.conn.Claim(ctx, key, sreq)
		if err != nil {
			failed[name] = true
			lastErr = err
			b.log.Warn("claim failed on cluster", "cluster", name, "err", err)
			return
		}
		delete(failed, name)
		for _, c := range got {
			r := Receipt{VShard: shard.ID(c.Message.VShard), Topic: req.Topic,
				Lease: store.Lease{MessageID: c.Message.ID, Subscription: req.Subscription, Token: c.Token, Ordered: ordered}}
			out = append(out, Delivery{Claimed: c, Receipt: b.cfg.Receipts.Encode(r)})
			bytes += domain.EncodedSize(c.Message)
		}
	}
	for _, name := range order {
		if len(out) >= req.Max {
			break
		}
		want := req.Max - len(out)
		if plan.quota != nil {
			q, known := plan.quota[name]
			if known && q == 0 {
				continue
			}
			if known {
				want = min(want, q)
			}
		}
		claimFrom(name, want)
	}
	if plan.quota != nil {
		// Rows the peek saw may have gone to other claimers meanwhile (or
		// stay parked behind their order key): fill up from the clusters
		// that showed more than their share.
		for _, name := range order {
			if len(out) >= req.Max {
				break
			}
			if q, known := plan.quota[name]; known && plan.seen[name] > q {
				claimFrom(name, req.Max-len(out))
			}
		}
	}
	if len(out) == 0 && len(failed) == len(names) && len(names) > 0 {
		return nil, noClusterAnswered(lastErr)
	}
	inClaimOrder(out)
	return out, nil
}

// claimedBefore says whether a delivery of priority pa and message id a
// goes before one of pb and b in a claim: higher priority first, then
// older (ids are router-generated and grow with time).
func claimedBefore(pa int, a uint64, pb int, b uint64) bool {
	if pa != pb {
		return pa > pb
	}
	return a < b
}

// inClaimOrder sorts a claim's answer, gathered over several clusters,
// into one claim order.
func inClaimOrder(out []Delivery) {
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Message, out[j].Message
		return claimedBefore(a.Priority, a.ID, b.Priority, b.ID)
	})
}

// noClusterAnswered is the error of a claim that no cluster answered:
// unavailable, with the last cluster's error.
func noClusterAnswered(lastErr error) error {
	if errors.Is(lastErr, ErrUnavailable) {
		return lastErr
	}
	return fmt.Errorf("%w: no cluster answered the claim: %w", ErrUnavailable, lastErr)
}

// claimPlan is how a claim spanning clusters shares its max among them so
// that it takes the highest priority, then the oldest, deliveries of all
// of them (DESIGN §6 "Delay and priority"), and not the best of whichever
// cluster it happens to start with.
type claimPlan struct {
	order  []string       // clusters by the rank of their best claimable delivery; unknown ones last
	quota  map[string]int // deliveries to take from each cluster whose peek answered
	seen   map[string]int // claimable deliveries each such cluster showed
	failed map[string]bool
	err    error // the last peek error
}

// empty says that every cluster answered and none has anything to claim.
func (p claimPlan) empty() bool {
	if p.quota == nil || len(p.failed) > 0 {
		return false
	}
	for _, n := range p.seen {
		if n > 0 {
			return false
		}
	}
	return true
}

// planClaim peeks at every cluster's claim order (no locks) and merges
// them: the first req.Max of the merged order say how many to take from
// each cluster. A cluster whose peek failed is claimed last, for what is
// left.
func (b *Broker) planClaim(ctx context.Context, req ClaimRequest, order []string, clusters map[string]*clusterConn, exclude []uint16) claimPlan {
	type peeked struct {
		heads []store.ClaimHead
		err   error
	}
	res := make([]peeked, len(order))
	now := b.now().UTC()
	var wg sync.WaitGroup
	for k, name := range order {
		cs, ok := clusters[name]
		if !ok {
			res[k].err = fmt.Errorf("%w: cluster %s is not connected", ErrUnavailable, name)
			continue
		}
		wg.Go(func() {
			res[k].heads, res[k].err = cs.conn.PeekClaimable(ctx, req.Topic, req.Subscription, now, req.Max, req.Dead, req.ErrorCode, exclude)
		})
	}
	wg.Wait()
	plan := claimPlan{quota: map[string]int{}, seen: map[string]int{}, failed: map[string]bool{}}
	type ranked struct {
		head    store.ClaimHead
		cluster int
	}
	var all []ranked
	for k, p := range res {
		if p.err != nil {
			plan.failed[order[k]], plan.err = true, p.err
			continue
		}
		plan.quota[order[k]] = 0
		plan.seen[order[k]] = len(p.heads)
		for _, h := range p.heads {
			all = append(all, ranked{h, k})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].head, all[j].head
		return claimedBefore(a.Priority, a.MessageID, b.Priority, b.MessageID)
	})
	placed := map[string]bool{}
	for i, r := range all {
		name := order[r.cluster]
		if i < req.Max {
			plan.quota[name]++
		}
		if !placed[name] {
			placed[name] = true
			plan.order = append(plan.order, name)
		}
	}
	for _, name := range order {
		if !placed[name] {
			plan.order = append(plan.order, name) // empty (quota 0) or unknown
		}
	}
	return plan
}
