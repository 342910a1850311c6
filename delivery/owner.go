package delivery

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// Unit names one unit of delivery state: a subscription on one cluster.
type Unit struct {
	Cluster, Topic, Subscription string
}

func (u Unit) String() string { return u.Cluster + "/" + u.Topic + "/" + u.Subscription }

// Errors callers match with errors.Is.
var (
	// ErrNotOwner: this router does not own the unit (any more); the
	// caller finds the current owner and asks it.
	ErrNotOwner = errors.New("not the owner of this unit")
)

// lease is a first attempt held in the owner's memory.
type lease struct {
	c                  store.Candidate
	token              uint64
	consumer           string
	claimedAt, expires time.Time
	ordered            bool
	// finishing is set while an outcome of the lease (ack, nack, or its
	// write to the table) waits for its flush, and closed when the flush
	// is over; the lease is then gone or, if the flush failed, held
	// again.
	finishing chan struct{}
	at        int // index in the expiry heap, -1 when not in it
}

// Owner is one unit this router owns: its leases in memory and its scan
// position. Safe for concurrent use.
type Owner struct {
	unit Unit
	m    *Manager
	cl   *clusterState

	scanMu sync.Mutex // one scan of the unit at a time

	mu        sync.Mutex
	epoch     uint64
	waitUntil time.Time // hand nothing out before (a previous owner's horizon)
	lost      bool      // taken over, released, or stale: refuse everything
	releasing bool      // being handed over: hand nothing new out
	leases    map[uint64]*lease
	reserved  map[uint64]bool
	keys      map[string]int // order keys of leases (ordered subscriptions)
	expiry    leaseHeap
	cursor    *store.ClaimCursor
	lastTop   time.Time
	// ahead holds claimable deliveries a scan read past what its claim
	// took, in claim order, for the next claims of an unordered
	// subscription to take without a scan (see readAhead); aheadIDs are
	// their ids. They all stand before the cursor. aheadExclude is the
	// claim's Exclude they were read with.
	ahead        []store.Candidate
	aheadIDs     map[uint64]bool
	aheadExclude []uint16
	// gen counts leases that left memory; done remembers when each did
	// while a scan runs, since the scan may have read its row before (an
	// acked delivery not yet deleted when the scan read it).
	gen      uint64
	done     map[uint64]uint64
	scanning bool
}

func newOwner(m *Manager, cl *clusterState, u Unit, epoch uint64, waitUntil time.Time) *Owner {
	return &Owner{unit: u, m: m, cl: cl, epoch: epoch, waitUntil: waitUntil,
		leases: map[uint64]*lease{}, reserved: map[uint64]bool{}, keys: map[string]int{}, done: map[uint64]uint64{}, aheadIDs: map[uint64]bool{}}
}

// Unit is the unit owned.
func (o *Owner) Unit() Unit { return o.unit }

// Epoch is the owner's epoch.
func (o *Owner) Epoch() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.epoch
}

// handingOver says whether a hand-over of the unit is under way (or it is
// lost already): the upkeep does not start, or log, another.
func (o *Owner) handingOver() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lost || o.releasing
}

func (o *Owner) storeUnit() store.OwnedUnit {
	return store.OwnedUnit{Topic: o.unit.Topic, Subscription: o.unit.Subscription, Epoch: o.epoch}
}

// ClaimSpec is what a claim asks of one unit.
type ClaimSpec struct {
	Consumer    string
	Lease       time.Duration
	Ordered     bool
	MaxAttempts int
	// Exclude are vshards not to hand out (frozen for a cut-over).
	Exclude []uint16
}

// Reserve picks up to n claimable deliveries in claim order (priority,
// then age) without handing them out: the caller merges several units'
// reservations and then Takes or Releases each. Nothing is reserved
// before the previous owner's horizon, while the unit is handed over, or
// once the router's cap on leases in memory is reached.
func (o *Owner) Reserve(ctx context.Context, n int, spec ClaimSpec) ([]store.Candidate, error) {
	o.scanMu.Lock()
	defer o.scanMu.Unlock()
	now := o.m.now()
	o.expireNow(ctx, now)
	o.mu.Lock()
	if o.lost {
		o.mu.Unlock()
		return nil, ErrNotOwner
	}
	if o.releasing || now.Before(o.waitUntil) || !o.cl.leaseValid(now) {
		o.mu.Unlock()
		return nil, nil
	}
	top := o.cursor == nil || now.Sub(o.lastTop) >= o.m.cfg.TopScanEvery
	if top || spec.Ordered || !slices.Equal(spec.Exclude, o.aheadExclude) {
		// What was read ahead is read again: from the head (it may
		// have moved: retries, delays, higher priorities), or with this
		// claim's rules (a vshard frozen for a cut-over is not handed
		// out).
		o.dropAhead()
		o.aheadExclude = slices.Clone(spec.Exclude)
	}
	var taken []store.Candidate
	if !spec.Ordered {
		taken = o.takeAhead(n)
		if len(taken) == n {
			o.mu.Unlock()
			return taken, nil
		}
	}
	from := o.cursor
	if top {
		from = nil
	}
	known := len(o.leases) + len(o.reserved)
	began := o.gen
	// Scans run one at a time: what left memory before this one began is
	// in the table as it is now.
	clear(o.done)
	o.scanning = true
	// A scan from the head walks past every lease in flight (the table
	// still shows them claimable): it reads their positions only. Past
	// a few scans' worth of leases, copying their ids would cost more
	// than reading the rows a scan can reach.
	var skip map[uint64]bool
	if from == nil && known > 0 && known <= 4*o.m.cfg.MaxScan {
		skip = make(map[uint64]bool, known)
		for id := range o.leases {
			skip[id] = true
		}
		for id := range o.reserved {
			skip[id] = true
		}
	}
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.scanning = false
		o.mu.Unlock()
	}()

	// An unordered claim reads ahead of what it takes: the rest waits in
	// o.ahead for the next claims, which then read nothing (a scan per
	// claim per unit was most of a drain's statements).
	ahead := 0
	if !spec.Ordered {
		ahead = min(readAhead*n, maxAhead)
	}
	var park []store.OwnedPark
	for pass := 0; pass < 3 && len(taken) < n; pass++ {
		need := n - len(taken)
		limit := min(max(need+16, ahead), o.m.cfg.MaxScan)
		if from == nil {
			limit = min(max(need+16, ahead)+known, o.m.cfg.MaxScan)
		}
		var sc store.Scan
		err := o.cl.conn.Do(ctx, OpScan, func(ctx context.Context, s Store) (err error) {
			if from == nil && skip != nil {
				sc, err = s.ScanClaimableSkipping(ctx, o.unit.Topic, o.unit.Subscription, now.UTC(), nil, limit, spec.Exclude, skip)
				return err
			}
			rows, err := s.ScanClaimable(ctx, o.unit.Topic, o.unit.Subscription, now.UTC(), from, limit, spec.Exclude)
			sc = store.ScanOf(rows, nil)
			return err
		})
		rows := sc.Candidates
		var heads map[string]uint64
		if err == nil && spec.Ordered {
			heads, err = o.heads(ctx, rows)
		}
		if err != nil {
			o.unreserve(taken)
			return nil, err
		}
		o.mu.Lock()
		if from == nil {
			o.lastTop = now
		}
		var last *store.ClaimCursor
		var extra []store.Candidate // read past what is taken: kept ahead
		for _, c := range rows {
			if len(taken) == n && ahead == 0 {
				break
			}
			pos := store.ClaimCursor{Priority: c.Priority, MessageID: c.MessageID}
			last = &pos
			if _, ok := o.leases[c.MessageID]; ok || o.reserved[c.MessageID] || o.aheadIDs[c.MessageID] || o.done[c.MessageID] > began {
				continue
			}
			if spec.Ordered && c.OrderKey != "" {
				if o.keys[c.OrderKey] > 0 {
					continue // its key has a delivery in flight from memory
				}
				if h, ok := heads[c.OrderKey]; ok && h != c.MessageID {
					// Behind its key's head: parked, so that scans skip it
					// until the head is done.
					park = append(park, store.OwnedPark{MessageID: c.MessageID, OrderKey: c.OrderKey})
					continue
				}
			}
			if len(taken) == n {
				extra = append(extra, c)
				continue
			}
			o.reserved[c.MessageID] = true
			taken = append(taken, c)
		}
		o.keepAhead(extra)
		if (len(taken) < n || ahead > 0) && sc.Last != nil {
			// Walked to the end of what was read, the skipped leases too.
			last = sc.Last
		}
		if last != nil {
			o.cursor = last
		}
		end := sc.Read < limit
		o.mu.Unlock()
		for _, c := range taken {
			if skip != nil {
				skip[c.MessageID] = true // a later pass from the head walks past it
			}
		}
		switch {
		case end && from == nil:
			pass = 3 // read to the end from the top: nothing more
		case end && now.Sub(o.lastTop) < o.m.cfg.TopScanEvery:
			// The cursor reached the end and the top was read lately:
			// nothing more now. Reading from the top again re-read every
			// lease in flight on each claim of a consumer that keeps up.
			pass = 3
		case end:
			from = nil // the cursor reached the end: once more from the top
		default:
			from = last // all it read was taken or in flight: read on
		}
	}
	if len(park) > 0 {
		o.submit(flushItem{owner: o, parks: park}) // not waited for: parking only spares later scans
	}
	return taken, nil
}

// heads reads the heads of the order keys of rows.
func (o *Owner) heads(ctx context.Context, rows []store.Candidate) (map[string]uint64, error) {
	var keys []string
	seen := map[string]bool{}
	for _, c := range rows {
		if c.OrderKey != "" && !seen[c.OrderKey] {
			seen[c.OrderKey] = true
			keys = append(keys, c.OrderKey)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	var heads map[string]uint64
	err := o.cl.conn.Do(ctx, OpScan, func(ctx context.Context, s Store) (err error) {
		heads, err = s.OrderHeads(ctx, o.unit.Topic, o.unit.Subscription, keys)
		return err
	})
	return heads, err
}

// Release gives reserved deliveries back unclaimed.
func (o *Owner) Release(cs []store.Candidate) { o.unreserve(cs) }

func (o *Owner) unreserve(cs []store.Candidate) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var back []store.Candidate
	for _, c := range cs {
		if !o.reserved[c.MessageID] {
			continue
		}
		delete(o.reserved, c.MessageID)
		if _, leased := o.leases[c.MessageID]; !leased {
			back = append(back, c)
		}
	}
	o.giveBack(back)
}

// readAhead is how many claims' worth an unordered scan reads: the
// claims after it take the rest from o.ahead. maxAhead caps the rows one
// such scan reads, and so what a unit keeps (about 64 bytes each: 64 KiB
// per unit in use at most).
const (
	readAhead = 4
	maxAhead  = 1024
)

// claimsBefore says a comes before b in claim order (priority, then age).
func claimsBefore(a, b store.ClaimCursor) bool {
	return a.Priority > b.Priority || (a.Priority == b.Priority && a.MessageID < b.MessageID)
}

func position(c store.Candidate) store.ClaimCursor {
	return store.ClaimCursor{Priority: c.Priority, MessageID: c.MessageID}
}

// giveBack returns candidates reserved but not handed out (o.mu held):
// into o.ahead, in claim order, those the cursor is past (no scan from
// the cursor reads them again); a scan from the cursor reads the others.
// One on a vshard the claims now exclude (a claim routed with the map
// before a freeze gives back) is not kept: the next read from the head
// after the freeze finds it.
func (o *Owner) giveBack(cs []store.Candidate) {
	if o.cursor == nil {
		return
	}
	back := cs[:0:0]
	for _, c := range cs {
		if c.MessageID == 0 || claimsBefore(*o.cursor, position(c)) || o.aheadIDs[c.MessageID] || slices.Contains(o.aheadExclude, c.VShard) {
			continue
		}
		back = append(back, c)
	}
	slices.SortFunc(back, claimOrder)
	o.keepAhead(back)
}

// claimOrder compares candidates in claim order.
func claimOrder(a, b store.Candidate) int {
	switch {
	case claimsBefore(position(a), position(b)):
		return -1
	case a.MessageID == b.MessageID:
		return 0
	}
	return 1
}

// keepAhead merges cs, in claim order and in none of o.ahead, o.reserved
// or o.leases, into o.ahead (o.mu held). A merge, not an append: a
// give-back may have put earlier candidates there meanwhile.
func (o *Owner) keepAhead(cs []store.Candidate) {
	if len(cs) == 0 {
		return
	}
	for _, c := range cs {
		o.aheadIDs[c.MessageID] = true
	}
	if len(o.ahead) == 0 || claimOrder(o.ahead[len(o.ahead)-1], cs[0]) < 0 {
		o.ahead = append(o.ahead, cs...)
		return
	}
	merged := make([]store.Candidate, 0, len(o.ahead)+len(cs))
	i, j := 0, 0
	for i < len(o.ahead) && j < len(cs) {
		if claimOrder(cs[j], o.ahead[i]) < 0 {
			merged = append(merged, cs[j])
			j++
		} else {
			merged = append(merged, o.ahead[i])
			i++
		}
	}
	merged = append(merged, o.ahead[i:]...)
	o.ahead = append(merged, cs[j:]...)
}

// takeAhead reserves up to n of o.ahead, in claim order (o.mu held).
func (o *Owner) takeAhead(n int) []store.Candidate {
	k := min(n, len(o.ahead))
	if k == 0 {
		return nil
	}
	// Capped: an append to taken copies it, and o.ahead only grows at
	// its end.
	taken := o.ahead[:k:k]
	o.ahead = o.ahead[k:]
	for _, c := range taken {
		delete(o.aheadIDs, c.MessageID)
		o.reserved[c.MessageID] = true
	}
	return taken
}

// dropAhead forgets what was read ahead (o.mu held): the cursor moves
// back before it, so that the next scan reads it again.
func (o *Owner) dropAhead() {
	if len(o.ahead) == 0 {
		return
	}
	first := o.ahead[0]
	o.ahead = o.ahead[:0]
	clear(o.aheadIDs)
	o.rewindTo(first)
}

// rewind moves the cursor back before c (ready again, and behind the
// cursor), so that the next scan sees it; what was read ahead is read
// again with it, in claim order.
func (o *Owner) rewind(c store.Candidate) {
	o.dropAhead()
	o.rewindTo(c)
}

func (o *Owner) rewindTo(c store.Candidate) {
	if o.cursor == nil || c.MessageID == 0 {
		return
	}
	if !claimsBefore(*o.cursor, position(c)) {
		o.cursor = &store.ClaimCursor{Priority: c.Priority, MessageID: c.MessageID - 1}
	}
}

// Claimed is one delivery handed out.
type Claimed struct {
	store.Claimed
	// Memory: the lease is held in the owner's memory (a first attempt);
	// else it is a durable lease in the table.
	Memory bool
}

// Take hands out reserved deliveries cs (in claim order) to one
// consumer, up to maxBytes of encoded messages (size tells; 0: no cap;
// with oversize the first is handed out whatever its size). A first
// attempt becomes a lease in memory; any other is claimed durably, its
// attempt counted in the table first. What is not handed out is
// released.
func (o *Owner) Take(ctx context.Context, cs []store.Candidate, spec ClaimSpec, maxBytes int, oversize bool, size func(*store.Message) int) ([]Claimed, error) {
	defer o.unreserve(cs)
	if len(cs) == 0 {
		return nil, nil
	}
	bodies, miss := o.m.cfg.Bodies.take(o.unit.Topic, cs)
	if len(miss) > 0 {
		var read map[uint64]*store.Message
		err := o.cl.conn.Do(ctx, OpBodies, func(ctx context.Context, s Store) (err error) {
			read, err = s.Messages(ctx, miss)
			return err
		})
		if err != nil {
			return nil, err
		}
		for id, m := range read {
			bodies[id] = m
		}
	}
	now := o.m.now()
	expires := now.Add(spec.Lease)
	fresh := make([]store.Candidate, 0, len(cs))
	var durable []store.Candidate
	used := 0
	for i, c := range cs {
		m, ok := bodies[c.MessageID]
		if !ok {
			continue // a delivery without its message: reconciliation reports it
		}
		sz := size(m)
		if maxBytes > 0 && used+sz > maxBytes && !(oversize && i == 0) {
			break
		}
		used += sz
		if c.Fresh() {
			fresh = append(fresh, c)
		} else {
			durable = append(durable, c)
		}
	}
	if len(fresh) > 0 {
		if err := o.cl.coverHorizon(ctx, now, spec.Lease); err != nil {
			return nil, err
		}
		fresh = fresh[:o.m.admit(len(fresh))]
	}
	token := rand.Uint64() | 1
	out := make([]Claimed, 0, len(cs))
	o.mu.Lock()
	if o.lost || o.releasing {
		o.mu.Unlock()
		o.m.unadmit(len(fresh))
		return nil, ErrNotOwner
	}
	for _, c := range fresh {
		l := &lease{c: c, token: token, consumer: spec.Consumer, claimedAt: now, expires: expires, ordered: spec.Ordered, at: -1}
		o.leases[c.MessageID] = l
		heap.Push(&o.expiry, l)
		if spec.Ordered && c.OrderKey != "" {
			o.keys[c.OrderKey]++
		}
		out = append(out, Claimed{Memory: true, Claimed: store.Claimed{Message: bodies[c.MessageID], Attempt: 1, Token: token, LeaseExpires: expires}})
	}
	o.mu.Unlock()
	if len(durable) > 0 {
		dids := make([]uint64, len(durable))
		for i, c := range durable {
			dids[i] = c.MessageID
		}
		req := store.ClaimRequest{Topic: o.unit.Topic, Subscription: o.unit.Subscription, Consumer: spec.Consumer, Max: len(dids),
			Lease: spec.Lease, Token: token, MaxAttempts: spec.MaxAttempts, Now: now.UTC(), Ordered: spec.Ordered}
		var got []store.Claimed
		err := o.cl.conn.Do(ctx, OpClaim, func(ctx context.Context, s Store) (err error) {
			got, err = s.ClaimDurable(ctx, o.storeUnit(), req, dids)
			return err
		})
		if err == nil {
			// Claimed in the table, or not claimable there: neither is
			// given back to o.ahead. The cursor moves back before them,
			// as for a lease ready again: a durable lease comes back
			// without the owner hearing of it (its expiry, a redrive of
			// its dead letter), and the next scan from the cursor then
			// sees it.
			o.mu.Lock()
			for _, c := range durable {
				delete(o.reserved, c.MessageID)
				o.rewind(c)
			}
			o.mu.Unlock()
		}
		if errors.Is(err, store.ErrStaleOwner) {
			o.m.lose(o)
		}
		if err != nil && len(out) == 0 {
			return nil, err
		}
		for _, g := range got {
			out = append(out, Claimed{Claimed: g})
		}
	}
	return out, nil
}

// Outcome is what became of one receipt's ack, nack or extend here.
type Outcome struct {
	// Held is false when the owner holds no such lease in memory: the
	// receipt's lease is durable, or was lost; the caller asks the table.
	Held          bool
	Status        domain.LeaseStatus
	NackStatus    domain.NackStatus
	NextAttemptAt time.Time
	Expires       time.Time
	Err           error
}

// Op is one receipt's lease as an owner knows it.
type Op struct {
	MessageID uint64
	Token     uint64
	RequestID string
	// Ordered: the subscription is ordered now, whatever it was when the
	// lease was taken; finishing the lease lets its key's next go.
	Ordered bool
	// Nacks only.
	ErrorCode, Error string
	RetryAfter       time.Duration
	RetryNow         bool
}

// hold returns the lease op names when this owner holds it in memory and
// no other outcome of it is under way (it waits for one that is, then
// looks again).
func (o *Owner) hold(ctx context.Context, op Op) (*lease, error) {
	for {
		o.mu.Lock()
		if o.lost {
			o.mu.Unlock()
			return nil, nil
		}
		l, ok := o.leases[op.MessageID]
		if !ok || l.token != op.Token {
			o.mu.Unlock()
			return nil, nil
		}
		if l.finishing == nil {
			l.finishing = make(chan struct{})
			o.mu.Unlock()
			return l, nil
		}
		wait := l.finishing
		o.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Ack completes leases held in memory: their deliveries are deleted,
// traced acked and their messages' status updated in the next flush, and
// each is answered after that flush committed.
func (o *Owner) Ack(ctx context.Context, ops []Op) []Outcome {
	out := make([]Outcome, len(ops))
	item := flushItem{owner: o, acks: make([]store.OwnedAck, 0, len(ops))}
	held := make([]*lease, 0, len(ops))
	idx := make([]int, 0, len(ops))
	seen := make(map[uint64]bool, len(ops))
	for i, op := range ops {
		if seen[op.MessageID] {
			// The same receipt twice in one request: the first acks it.
			out[i] = Outcome{Held: true, Status: domain.LeaseNotFound}
			continue
		}
		l, err := o.hold(ctx, op)
		if err != nil {
			out[i] = Outcome{Held: true, Status: domain.LeaseUnavailable, Err: err}
			continue
		}
		if l != nil {
			seen[op.MessageID] = true
		}
		if l == nil {
			continue
		}
		held, idx = append(held, l), append(idx, i)
		item.acks = append(item.acks, store.OwnedAck{MessageID: l.c.MessageID, VShard: l.c.VShard, OrderKey: l.c.OrderKey, Ordered: l.ordered || op.Ordered,
			Consumer: l.consumer, Attempt: 1, ClaimedAt: l.claimedAt, RequestID: op.RequestID})
	}
	if len(held) == 0 {
		return out
	}
	ans := o.flush(ctx, item, held)
	for j, i := range idx {
		switch {
		case ans.err != nil:
			out[i] = Outcome{Held: true, Status: domain.LeaseUnavailable, Err: ans.err}
		case ans.stale:
			out[i] = Outcome{Held: true, Status: domain.LeaseLost}
		case ans.res.Acks[j]:
			out[i] = Outcome{Held: true, Status: domain.LeaseOK}
		default:
			out[i] = Outcome{Held: true, Status: domain.LeaseNotFound}
		}
	}
	return out
}

// Policy is a subscription's retry policy, for nacks.
type Policy func() store.RetryPolicy

// Nack fails leases held in memory: each first attempt is retried after
// the policy's backoff (or the nack's own wait) or, when the policy
// allows one attempt only, dead-lettered; written and answered after the
// next flush.
func (o *Owner) Nack(ctx context.Context, ops []Op, policy Policy, rnd func() float64) []Outcome {
	out := make([]Outcome, len(ops))
	item := flushItem{owner: o}
	var held []*lease
	var idx []int
	now := o.m.now()
	p := policy().WithDefaults()
	seen := map[uint64]bool{}
	for i, op := range ops {
		if seen[op.MessageID] {
			out[i] = Outcome{Held: true, NackStatus: domain.NackLeaseLost} // the same receipt twice: the first fails it
			continue
		}
		l, err := o.hold(ctx, op)
		if err != nil {
			out[i] = Outcome{Held: true, NackStatus: domain.NackUnavailable, Err: err}
			continue
		}
		if l != nil {
			seen[op.MessageID] = true
		}
		if l == nil {
			continue
		}
		n := store.OwnedNack{OwnedAck: store.OwnedAck{MessageID: l.c.MessageID, VShard: l.c.VShard, OrderKey: l.c.OrderKey, Ordered: l.ordered || op.Ordered,
			Consumer: l.consumer, Attempt: 1, ClaimedAt: l.claimedAt, RequestID: op.RequestID}, ErrorCode: op.ErrorCode, Error: op.Error}
		if 1 >= p.MaxAttempts {
			n.Dead = true
		} else {
			wait := op.RetryAfter
			if wait <= 0 && !op.RetryNow {
				wait = p.Backoff(1, rnd())
			}
			n.RetryAt = now.Add(wait).UTC()
		}
		held, idx = append(held, l), append(idx, i)
		item.nacks = append(item.nacks, n)
	}
	if len(held) == 0 {
		return out
	}
	ans := o.flush(ctx, item, held)
	for j, i := range idx {
		n := item.nacks[j]
		switch {
		case ans.err != nil:
			out[i] = Outcome{Held: true, NackStatus: domain.NackUnavailable, Err: ans.err}
		case ans.stale:
			out[i] = Outcome{Held: true, NackStatus: domain.NackLeaseLost}
		case !ans.res.Nacks[j]:
			out[i] = Outcome{Held: true, NackStatus: domain.NackNotFound}
		case n.Dead:
			out[i] = Outcome{Held: true, NackStatus: domain.NackDead}
		default:
			out[i] = Outcome{Held: true, NackStatus: domain.NackRetryScheduled, NextAttemptAt: n.RetryAt}
		}
	}
	return out
}

// Extend moves the expiry of leases held in memory to now + d; nothing
// is written (the horizon recorded for the unit covers it).
func (o *Owner) Extend(ctx context.Context, ops []Op, d time.Duration) []Outcome {
	out := make([]Outcome, len(ops))
	now := o.m.now()
	if err := o.cl.coverHorizon(ctx, now, d); err != nil {
		for i := range out {
			out[i] = Outcome{Held: true, Status: domain.LeaseUnavailable, Err: err}
		}
		return out
	}
	expires := now.Add(d)
	for i, op := range ops {
		l, err := o.hold(ctx, op)
		if err != nil {
			out[i] = Outcome{Held: true, Status: domain.LeaseUnavailable, Err: err}
			continue
		}
		if l == nil {
			continue
		}
		o.mu.Lock()
		l.expires = expires
		if l.at >= 0 {
			heap.Fix(&o.expiry, l.at)
		} else {
			heap.Push(&o.expiry, l)
		}
		ch := l.finishing
		l.finishing = nil
		o.mu.Unlock()
		close(ch)
		out[i] = Outcome{Held: true, Status: domain.LeaseOK, Expires: expires}
	}
	return out
}

// Unlease forgets leases held in memory that a claim took but could not
// hand to its consumer (its request ended first): ready again at once,
// the attempt not counted, nothing written. held[i] is false for an op
// this owner does not hold (a durable lease: released in the table).
func (o *Owner) Unlease(ops []Op) []bool {
	held := make([]bool, len(ops))
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, op := range ops {
		l, ok := o.leases[op.MessageID]
		if !ok || l.token != op.Token {
			continue
		}
		held[i] = true
		if l.finishing == nil {
			o.remove(l, true)
		}
	}
	return held
}

// flushAnswer is a flush's outcome for one item.
type flushAnswer struct {
	res   store.OwnedResult
	stale bool
	err   error
}

// flush runs item in the cluster's next flush and settles its leases:
// gone when the flush wrote their outcome (or found the delivery gone),
// held again when it failed, all dropped when the unit was stale.
func (o *Owner) flush(ctx context.Context, item flushItem, held []*lease) flushAnswer {
	ch, ok := o.cl.flusher.Submit(o.fenced(ctx, item))
	var ans flushAnswer
	if !ok {
		ans = flushAnswer{err: fmt.Errorf("%w: router is shutting down", domain.ErrUnavailable)}
	} else {
		// Waited for whatever ctx says: the flush may commit, and the
		// leases must be settled either way.
		ans = <-ch
	}
	o.settle(held, ans.err == nil && !ans.stale, ans.stale, item.leavesReady())
	return ans
}

// submit queues item without waiting (parking, expiries).
func (o *Owner) submit(item flushItem, held ...*lease) {
	ch, ok := o.cl.flusher.Submit(o.fenced(context.Background(), item))
	if !ok {
		o.settle(held, false, false, false)
		return
	}
	go func() {
		ans := <-ch
		o.settle(held, ans.err == nil && !ans.stale, ans.stale, item.leavesReady())
	}()
}

// settle ends the outcome under way of leases: done removes them, else
// they are held again; stale loses the whole unit. ready says the
// outcome left their deliveries in the table to be claimed again (see
// remove).
func (o *Owner) settle(held []*lease, done, stale, ready bool) {
	if stale {
		o.m.lose(o)
	}
	o.mu.Lock()
	var closeThem []chan struct{}
	for _, l := range held {
		if done || stale {
			o.remove(l, ready && !stale)
		} else if l.at < 0 && o.leases[l.c.MessageID] == l {
			heap.Push(&o.expiry, l) // popped while its outcome was under way
		}
		if l.finishing != nil {
			closeThem = append(closeThem, l.finishing)
			l.finishing = nil
		}
	}
	o.mu.Unlock()
	for _, ch := range closeThem {
		close(ch)
	}
}

// remove forgets a lease (o.mu held). ready says its delivery is
// claimable again (given back, written out as a lapsed lease, retried):
// the next scan then looks again from before it. An acked or dead one is
// not: rewinding for it made every claim re-read the whole run of leases
// still in flight behind the cursor.
func (o *Owner) remove(l *lease, ready bool) {
	if cur, ok := o.leases[l.c.MessageID]; !ok || cur != l {
		return
	}
	delete(o.leases, l.c.MessageID)
	o.gen++
	if o.scanning {
		o.done[l.c.MessageID] = o.gen
	}
	if l.at >= 0 {
		heap.Remove(&o.expiry, l.at)
	}
	if ready {
		o.rewind(l.c)
	}
	if l.ordered && l.c.OrderKey != "" {
		// Finishing a key's head lets its next go, wherever it stands
		// in claim order (a higher priority is before the cursor): the
		// next scan reads from the top.
		o.lastTop = time.Time{}
	}
	if l.ordered && l.c.OrderKey != "" {
		if o.keys[l.c.OrderKey]--; o.keys[l.c.OrderKey] <= 0 {
			delete(o.keys, l.c.OrderKey)
		}
	}
	o.m.unadmit(1)
}

// expire writes the leases that expired by now into the table as lapsed
// durable leases (the next claim of each traces lease_expired and counts
// the attempt, or dead-letters it at max attempts), without waiting.
func (o *Owner) expire(now time.Time) {
	if due := o.due(now); len(due) > 0 {
		o.submit(o.writeLeases(due), due...)
	}
}

// expireNow is expire that waits until they are written: a claim sees a
// lease that lapsed a moment ago as claimable, as it would in the table.
func (o *Owner) expireNow(ctx context.Context, now time.Time) {
	if due := o.due(now); len(due) > 0 {
		o.flush(ctx, o.writeLeases(due), due)
	}
}

// due takes the leases expired by now for their write.
func (o *Owner) due(now time.Time) []*lease {
	o.mu.Lock()
	defer o.mu.Unlock()
	var due []*lease
	for o.expiry.Len() > 0 && !o.expiry[0].expires.After(now) {
		l := heap.Pop(&o.expiry).(*lease)
		if l.finishing != nil {
			continue // an outcome is under way; it settles the lease
		}
		l.finishing = make(chan struct{})
		due = append(due, l)
	}
	return due
}

// writeLeases is the flush item that writes leases into the table.
func (o *Owner) writeLeases(ls []*lease) flushItem {
	item := flushItem{owner: o}
	for _, l := range ls {
		item.leases = append(item.leases, store.OwnedLease{MessageID: l.c.MessageID, VShard: l.c.VShard, Token: l.token, Consumer: l.consumer,
			Attempt: 1, ClaimedAt: l.claimedAt.UTC(), Expires: l.expires.UTC()})
	}
	return item
}

// writeOut writes every lease held in memory that match into the table
// as durable leases, and waits until they are written (or the unit is
// lost). The owner then holds none of them: their receipts are answered
// from the table, by whichever router serves them.
func (o *Owner) writeOut(ctx context.Context, match func(*lease) bool) error {
	for {
		o.mu.Lock()
		var mine []*lease
		var wait []chan struct{}
		for _, l := range o.leases {
			if match != nil && !match(l) {
				continue
			}
			if l.finishing != nil {
				wait = append(wait, l.finishing)
				continue
			}
			l.finishing = make(chan struct{})
			mine = append(mine, l)
		}
		lost := o.lost
		o.mu.Unlock()
		if lost {
			return ErrNotOwner
		}
		if len(mine) == 0 && len(wait) == 0 {
			return nil
		}
		if len(mine) > 0 {
			ans := o.flush(ctx, o.writeLeases(mine), mine)
			if ans.err != nil {
				return ans.err
			}
			if ans.stale {
				return ErrNotOwner
			}
		}
		for _, ch := range wait {
			select {
			case <-ch:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

// InFlight is how many leases the owner holds in memory.
func (o *Owner) InFlight() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.leases)
}

// Holder is one consumer's leases in memory.
type Holder struct {
	Consumer      string
	InFlight      int
	OldestClaimAt time.Time
}

// Holders lists the consumers holding leases in memory.
func (o *Owner) Holders() []Holder {
	o.mu.Lock()
	defer o.mu.Unlock()
	by := map[string]*Holder{}
	for _, l := range o.leases {
		h, ok := by[l.consumer]
		if !ok {
			h = &Holder{Consumer: l.consumer, OldestClaimAt: l.claimedAt}
			by[l.consumer] = h
		}
		h.InFlight++
		if l.claimedAt.Before(h.OldestClaimAt) {
			h.OldestClaimAt = l.claimedAt
		}
	}
	out := make([]Holder, 0, len(by))
	for _, h := range by {
		out = append(out, *h)
	}
	return out
}

// LeaseOf answers the lease held in memory on a message, for traces.
func (o *Owner) LeaseOf(id uint64) (consumer string, claimedAt, expires time.Time, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.leases[id]
	if !ok {
		return "", time.Time{}, time.Time{}, false
	}
	return l.consumer, l.claimedAt, l.expires, true
}

// leaseHeap orders leases by expiry.
type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.at = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.at = -1
	return l
}
