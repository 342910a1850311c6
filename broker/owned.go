package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
)

// The owned consume path (docs/consume.md, "Owners"). A subscription's
// deliveries on one cluster — a unit — are handed out by the unit's
// owner, one router at a time (delivery.Manager): first attempts from its
// memory, every later attempt durably. A claim reserves candidates on
// every cluster's owner, takes the best of them in claim order, and
// answers; an ack, nack or extend goes to the owner of its receipt's
// unit, and to the table (the durable path, as before) when the owner
// holds no such lease in memory.

// Owners is the broker's owner manager (metrics, traces, the page).
func (b *Broker) Owners() *delivery.Manager { return b.owners }

// claimPart is one cluster's share of an owned claim.
type claimPart struct {
	name  string
	owner *delivery.Owner
	addr  string // the unit's owner is another router there
	cands []store.Candidate
	err   error
}

// claimOwned serves one poll of a claim on live deliveries (see Claim).
func (b *Broker) claimOwned(ctx context.Context, req ClaimRequest, sub subscription.Subscription) ([]Delivery, error) {
	if b.selfFenced.Load() {
		return nil, errSelfFenced
	}
	if b.claimsStopped.Load() {
		return nil, cluster.ErrClaimsStopped
	}
	m, release := b.pin()
	defer release()
	ctx = store.WithFence(ctx, store.Fence{MapVersion: m.Version()}) // durable claims write
	spec := delivery.ClaimSpec{Consumer: req.Consumer, Lease: req.Lease, Ordered: sub.Ordered, MaxAttempts: sub.Policy().MaxAttempts,
		Exclude: m.FrozenVShards()}
	names := m.Clusters()
	parts := make([]claimPart, len(names))
	var wg sync.WaitGroup
	for k, name := range names {
		parts[k].name = name
		wg.Go(func() {
			p := &parts[k]
			u := delivery.Unit{Cluster: name, Topic: req.Topic, Subscription: req.Subscription}
			take := true
			if sub.Implicit() {
				// A topic nobody produced to (through this router, within
				// the last refresh): no unit is taken, so that made-up
				// names leave nothing behind, unless the table has
				// something to claim.
				take, p.err = b.anyClaimable(ctx, name, req.Topic, req.Subscription, spec.Exclude)
			}
			if p.err == nil {
				p.owner, p.addr, p.err = b.owners.Route(ctx, u, take, 0)
			}
			if p.err == nil && p.owner != nil {
				p.cands, p.err = p.owner.Reserve(ctx, req.Max, spec)
			}
		})
	}
	wg.Wait()

	// The best req.Max of every local owner's candidates, in claim order.
	type ranked struct {
		c    store.Candidate
		part int
	}
	n := 0
	for _, p := range parts {
		n += len(p.cands)
	}
	all := make([]ranked, 0, n)
	for k, p := range parts {
		for _, c := range p.cands {
			all = append(all, ranked{c, k})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, c := all[i].c, all[j].c
		return claimedBefore(a.Priority, a.MessageID, c.Priority, c.MessageID)
	})
	chosen := make([][]store.Candidate, len(parts))
	left := make([][]store.Candidate, len(parts)) // past req.Max: given back
	var order []int                               // parts by their best chosen candidate
	for i, r := range all {
		if i >= req.Max {
			left[r.part] = append(left[r.part], r.c)
			continue
		}
		if len(chosen[r.part]) == 0 {
			order = append(order, r.part)
			chosen[r.part] = make([]store.Candidate, 0, len(parts[r.part].cands))
		}
		chosen[r.part] = append(chosen[r.part], r.c)
	}
	for k, cs := range left {
		if len(cs) > 0 {
			parts[k].owner.Release(cs)
		}
	}

	out := make([]Delivery, 0, min(n, req.Max))
	bytes := 0
	failed := 0
	var lastErr error
	for k := range parts {
		if parts[k].err != nil {
			failed++
			lastErr = parts[k].err
			b.log.Warn("claim failed on cluster", "cluster", parts[k].name, "err", parts[k].err)
		}
	}
	room := func() int {
		if req.MaxBytes <= 0 {
			return 0
		}
		return max(req.MaxBytes-bytes, 0)
	}
	for _, k := range order {
		p := &parts[k]
		if req.MaxBytes > 0 && bytes >= req.MaxBytes {
			p.owner.Release(chosen[k])
			continue
		}
		got, err := p.owner.Take(ctx, chosen[k], spec, room(), len(out) == 0, domain.EncodedSize)
		if err != nil {
			failed++
			lastErr = err
			b.log.Warn("claim failed on cluster", "cluster", p.name, "err", err)
			continue
		}
		epoch := p.owner.Epoch()
		for _, c := range got {
			r := Receipt{VShard: shard.ID(c.Message.VShard), Topic: req.Topic, Epoch: epoch,
				Lease: store.Lease{MessageID: c.Message.ID, Subscription: req.Subscription, Token: c.Token, Ordered: sub.Ordered}}
			out = append(out, Delivery{Claimed: c.Claimed, Receipt: b.cfg.Receipts.Encode(r)})
			bytes += domain.EncodedSize(c.Message)
		}
	}
	// Clusters whose unit another router owns are asked last, for what
	// is left.
	for k := range parts {
		p := &parts[k]
		if p.err != nil || p.addr == "" || len(out) >= req.Max || (req.MaxBytes > 0 && bytes >= req.MaxBytes) {
			continue
		}
		if b.peer == nil {
			failed++
			lastErr = fmt.Errorf("%w: the owner of %s on cluster %s is another router and this router forwards nothing", ErrUnavailable, req.Topic, p.name)
			continue
		}
		fwd := req
		fwd.Max, fwd.MaxBytes, fwd.Wait = req.Max-len(out), room(), 0
		got, err := b.peer.Claim(ctx, p.addr, p.name, fwd)
		if err != nil {
			failed++
			lastErr = err
			b.log.Warn("claim forwarded to the owner failed", "cluster", p.name, "owner", p.addr, "err", err)
			continue
		}
		for _, d := range got {
			out = append(out, d)
			bytes += domain.EncodedSize(d.Message)
		}
	}
	if len(out) == 0 && failed == len(parts) && len(parts) > 0 {
		return nil, noClusterAnswered(lastErr)
	}
	inClaimOrder(out)
	if out == nil {
		out = []Delivery{}
	}
	return out, nil
}

// anyClaimable says whether a subscription has a claimable delivery on a
// cluster, reading without a unit's owner.
func (b *Broker) anyClaimable(ctx context.Context, name, topic, sub string, exclude []uint16) (bool, error) {
	cs, ok := (*b.clusters.Load())[name]
	if !ok {
		return false, fmt.Errorf("%w: cluster %s is not connected", ErrUnavailable, name)
	}
	return cs.conn.AnyClaimable(ctx, topic, sub, b.now().UTC(), exclude)
}

// ClaimCluster serves a claim forwarded by another router: one cluster's
// share, on a unit this router owns (or takes now, being the router it
// belongs to). It never forwards again: a unit owned elsewhere answers
// ErrNotOwner, and the caller reads the records again.
func (b *Broker) ClaimCluster(ctx context.Context, cluster string, req ClaimRequest) ([]Delivery, error) {
	// A self-fenced router hands out nothing, to another router's clients
	// either: every ack of a lease it handed out now would be refused
	// (the writes are), and the delivery would come round again until it
	// was dead.
	if b.selfFenced.Load() {
		return nil, errSelfFenced
	}
	sub, ok, err := b.subs.Get(ctx, req.Topic, req.Subscription)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrUnknownSubscription
	}
	m, release := b.pin()
	defer release()
	u := delivery.Unit{Cluster: cluster, Topic: req.Topic, Subscription: req.Subscription}
	o, addr, err := b.owners.Route(ctx, u, true, 0)
	if err != nil {
		return nil, ownership(err)
	}
	if o == nil {
		return nil, fmt.Errorf("%w: %w: %s is owned by the router at %s", ErrUnavailable, delivery.ErrNotOwner, u, addr)
	}
	spec := delivery.ClaimSpec{Consumer: req.Consumer, Lease: req.Lease, Ordered: sub.Ordered, MaxAttempts: sub.Policy().MaxAttempts,
		Exclude: m.FrozenVShards()}
	cands, err := o.Reserve(ctx, req.Max, spec)
	if err != nil {
		return nil, ownership(err)
	}
	got, err := o.Take(ctx, cands, spec, req.MaxBytes, true, domain.EncodedSize)
	if err != nil {
		return nil, ownership(err)
	}
	out := make([]Delivery, 0, len(got))
	for _, c := range got {
		r := Receipt{VShard: shard.ID(c.Message.VShard), Topic: req.Topic, Epoch: o.Epoch(),
			Lease: store.Lease{MessageID: c.Message.ID, Subscription: req.Subscription, Token: c.Token, Ordered: sub.Ordered}}
		out = append(out, Delivery{Claimed: c.Claimed, Receipt: b.cfg.Receipts.Encode(r)})
	}
	return out, nil
}

// ownership marks a unit that changed hands under a request (this router
// no longer owns it, or its epoch moved on) as unavailable: the caller
// retries and finds the new owner. Not a cluster failure: only the
// answer's status changes, no breaker counts it.
func ownership(err error) error {
	if !errors.Is(err, ErrUnavailable) && (errors.Is(err, delivery.ErrNotOwner) || errors.Is(err, store.ErrStaleOwner)) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// Peer is what forwarding needs: the router at addr runs one cluster's
// share of an operation on a unit it owns.
type Peer interface {
	Claim(ctx context.Context, addr, cluster string, req ClaimRequest) ([]Delivery, error)
	Ack(ctx context.Context, addr string, receipts []Receipt) ([]LeaseResult, error)
	Nack(ctx context.Context, addr string, items []NackItem) ([]NackResult, error)
	Extend(ctx context.Context, addr string, receipts []Receipt, lease time.Duration) ([]LeaseResult, error)
}

// unitGroups groups receipt indexes idx by (topic, subscription), the
// highest epoch of each group alongside.
func unitGroups(receipts []Receipt, idx []int) map[[2]string][]int {
	g := map[[2]string][]int{}
	for _, i := range idx {
		k := [2]string{receipts[i].Topic, receipts[i].Subscription}
		g[k] = append(g[k], i)
	}
	return g
}

func maxEpoch(receipts []Receipt, idx []int) uint64 {
	var e uint64
	for _, i := range idx {
		e = max(e, receipts[i].Epoch)
	}
	return e
}

// ownedOps runs one cluster's share of an ack, nack or extend: each unit's
// receipts go to its owner here (local), or to the router that owns it
// (forward, when forwarding), and those no owner holds in memory are
// answered durable, for the table.
func (b *Broker) ownedOps(ctx context.Context, name string, receipts []Receipt, idx []int, forwarding bool,
	local func(o *delivery.Owner, idx []int) []delivery.Outcome, forward func(addr string, idx []int) error,
	apply func(i int, oc delivery.Outcome)) (durable []int) {
	fail := func(ids []int, err error) {
		for _, i := range ids {
			apply(i, delivery.Outcome{Held: true, Status: domain.LeaseUnavailable, NackStatus: domain.NackUnavailable, Err: err})
		}
	}
	for k, ids := range unitGroups(receipts, idx) {
		u := delivery.Unit{Cluster: name, Topic: k[0], Subscription: k[1]}
		o, addr, err := b.owners.Route(ctx, u, false, maxEpoch(receipts, ids))
		switch {
		case err != nil:
			fail(ids, err)
		case o != nil:
			for j, oc := range local(o, ids) {
				if oc.Held {
					apply(ids[j], oc)
				} else {
					durable = append(durable, ids[j])
				}
			}
		case addr == "":
			durable = append(durable, ids...)
		case !forwarding || b.peer == nil:
			fail(ids, fmt.Errorf("%w: %s is owned by the router at %s", ErrUnavailable, u, addr))
		default:
			if err := forward(addr, ids); err != nil {
				fail(ids, fmt.Errorf("%w: forwarded to the owner of %s at %s: %w", ErrUnavailable, u, addr, err))
			}
		}
	}
	return durable
}

// ops are the owner's view of receipts idx (with nacks' items).
func ops(receipts []Receipt, idx []int, rid string, items []NackItem) []delivery.Op {
	out := make([]delivery.Op, len(idx))
	for j, i := range idx {
		r := receipts[i]
		out[j] = delivery.Op{MessageID: r.MessageID, Token: r.Token, RequestID: rid, Ordered: r.Ordered}
		if items != nil {
			it := items[i]
			out[j].ErrorCode, out[j].Error, out[j].RetryAfter, out[j].RetryNow = it.ErrorCode, it.Error, it.RetryAfter, it.RetryNow
		}
	}
	return out
}

// pick returns receipts idx.
func pick(receipts []Receipt, idx []int) []Receipt {
	out := make([]Receipt, len(idx))
	for j, i := range idx {
		out[j] = receipts[i]
	}
	return out
}

// releaseOwned gives back deliveries a claim took but could not hand
// over: leases in memory are forgotten (ready again, the attempt not
// counted); durable ones are released in the table.
func (b *Broker) releaseOwned(ctx context.Context, req ClaimRequest, receipts []Receipt) []Receipt {
	// dispatch runs fn for each cluster at once: durable is shared.
	var mu sync.Mutex
	var durable []Receipt
	keep := func(r Receipt) {
		mu.Lock()
		durable = append(durable, r)
		mu.Unlock()
	}
	b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		for k, ids := range unitGroups(receipts, idx) {
			u := delivery.Unit{Cluster: name, Topic: k[0], Subscription: k[1]}
			o, _, err := b.owners.Route(ctx, u, false, 0)
			if err != nil || o == nil {
				for _, i := range ids {
					keep(receipts[i])
				}
				continue
			}
			for j, held := range o.Unlease(ops(receipts, ids, "", nil)) {
				if !held {
					keep(receipts[ids[j]])
				}
			}
		}
	})
	return durable
}

// nackPolicy is the retry policy an owner applies to a nack (a deleted
// subscription's deliveries are being dropped: the default policy serves
// until they are gone).
func (b *Broker) nackPolicy(ctx context.Context, topic, sub string) store.RetryPolicy {
	s, ok, err := b.subs.Get(ctx, topic, sub)
	if err != nil || !ok {
		return subscription.Subscription{}.WithDefaults().Policy()
	}
	return s.Policy()
}
