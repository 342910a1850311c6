package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/shardmq/shardmq/domain"
)

// ClaimRequest asks for up to Max deliveries of one subscription.
type ClaimRequest struct {
	Topic        string
	Subscription string
	Consumer     string
	Max          int
	Lease        time.Duration
	Token        uint64 // the new lease's claim token, non-zero, unguessable
	MaxAttempts  int    // an expired lease at this many attempts dies instead
	Now          time.Time
	// Ordered delivers each order key's messages one at a time, in
	// produce order (DESIGN §6).
	Ordered bool
	// Dead claims dead letters (the dead-letter channel) instead, those of
	// ErrorCode when it is set. Attempts are not counted there.
	Dead      bool
	ErrorCode string
	// MaxBytes caps the message bytes (as encoded in the answer:
	// domain.EncodedSize) leased to this request; 0: no cap. Candidates beyond it are
	// not leased (they stay ready for the next claim), except that with
	// AllowOversize the request's first message is leased even when it
	// alone exceeds the cap, so that a big message cannot get stuck.
	MaxBytes      int
	AllowOversize bool
	// ExcludeVShards are not claimed: the vshards frozen for a resharding
	// cut-over (empty otherwise).
	ExcludeVShards []uint16
}

// Claimed is one leased delivery with its message.
type Claimed struct {
	Message      *Message
	Attempt      int
	Token        uint64
	LeaseExpires time.Time
	ErrorCode    string // dead-letter channel: why it died
}

// Claim leases up to Max ready deliveries in one short transaction: lock
// candidates with FOR UPDATE SKIP LOCKED, mark them leased, commit; the
// message bodies are read after the commit. A candidate whose earlier lease
// expired counts that lost attempt: it is traced lease_expired and, when it
// has used MaxAttempts, dead-lettered instead of delivered. On an ordered
// subscription a candidate behind an older live delivery of its order key is
// parked instead of delivered.
func (s *Store) Claim(ctx context.Context, req ClaimRequest) ([]Claimed, error) {
	out, err := s.ClaimMany(ctx, []ClaimRequest{req})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// ClaimMany serves several claims on one subscription (same Topic,
// Subscription, Ordered, Dead, ErrorCode, MaxAttempts; the first's Now)
// with one candidate scan in one transaction, each request keeping its own
// consumer, lease and claim token. Requests are filled in order. Claimers
// of one subscription thus share one walk of the index head instead of
// fighting over it with SKIP LOCKED.
func (s *Store) ClaimMany(ctx context.Context, reqs []ClaimRequest) ([][]Claimed, error) {
	req := reqs[0]
	total := 0
	for _, r := range reqs {
		total += r.Max
	}
	return s.claimWith(ctx, reqs, func(tx *sql.Tx) ([]delivery, error) {
		cands, err := claimCandidates(ctx, tx, req.Topic, req.Subscription, req.Now, total, req.Dead, req.ErrorCode, req.ExcludeVShards)
		if err != nil || len(cands) == 0 {
			return cands, err
		}
		if req.Ordered && !req.Dead {
			return s.keepHeads(ctx, tx, req, cands)
		}
		return cands, nil
	})
}

// claimWith is a claim's transaction over the candidates pick locks in
// it (in claim order): each is leased to the first request with room
// (by count and bytes), a lapsed lease among them is traced lease_expired
// and dies when it has used MaxAttempts.
func (s *Store) claimWith(ctx context.Context, reqs []ClaimRequest, pick func(tx *sql.Tx) ([]delivery, error)) ([][]Claimed, error) {
	req := reqs[0]
	leased := make([][]delivery, len(reqs))
	var nExpired, nDied int // for OnDeliveries, of the run that committed
	var msgs map[uint64]*Message
	err := s.inTx(ctx, 3, s.retryHook("claim"), func(tx *sql.Tx) error {
		for i := range leased {
			leased[i] = leased[i][:0]
		}
		nExpired, nDied, msgs = 0, 0, nil
		cands, err := pick(tx)
		if err != nil || len(cands) == 0 {
			return err
		}
		// The bodies are read here, before the lease, in the same
		// transaction: they give the byte cap its sizes, and the answer
		// needs them anyway (one statement and one round trip fewer than
		// reading sizes first and bodies after the commit).
		if msgs, err = candidateMessages(ctx, tx, cands); err != nil {
			return err
		}
		sizes := make(map[uint64]int, len(msgs))
		for id, m := range msgs {
			sizes[id] = domain.EncodedSize(m)
		}
		used := make([]int, len(reqs))
		// full says whether request i can take no more, or not d.
		full := func(i int, d delivery) bool {
			r := reqs[i]
			if len(leased[i]) >= r.Max {
				return true
			}
			if r.MaxBytes <= 0 || (len(leased[i]) == 0 && r.AllowOversize) {
				return false
			}
			return used[i]+sizes[d.messageID] > r.MaxBytes
		}
		// A lapsed lease's lease_expired event carries its claim, as an ack
		// or nack does, so that the trace shows every attempt's claim.
		// A candidate that still carries a lease is one whose lease lapsed
		// (dead-letter claims take dead deliveries, whose lease is over).
		lapsedLease := func(d delivery) bool { return !req.Dead && (d.lockedBy != "" || d.claimToken != 0) }
		var lapsed []uint64
		for _, d := range cands {
			if lapsedLease(d) {
				lapsed = append(lapsed, d.messageID)
			}
		}
		var claimedAt map[uint64]time.Time
		if len(lapsed) > 0 {
			if claimedAt, err = claimedAtOf(ctx, tx, req.Subscription, lapsed); err != nil {
				return err
			}
		}
		expiredEvent := func(d delivery) Event {
			ev := s.event(req.Now, d, EventLeaseExpired, d.lockedBy, d.attempts, "", "")
			ev.ClaimedAt = claimedAt[d.messageID]
			return ev
		}
		var events []Event
		var dead []uint64
		var unpark []delivery
		next := 0 // the request being filled
		for _, d := range cands {
			expired := lapsedLease(d)
			if expired && d.attempts >= req.MaxAttempts {
				nExpired++
				nDied++
				events = append(events, expiredEvent(d))
				if _, err := killDelivery(ctx, tx, d.subscription, d.messageID, d.claimToken, req.Now, "lease_expired", "lease expired on the last attempt"); err != nil {
					return err
				}
				events = append(events, s.event(req.Now, d, EventDeadLettered, d.lockedBy, d.attempts, "lease_expired", ""))
				dead = append(dead, d.messageID)
				if req.Ordered && d.orderKey != "" {
					unpark = append(unpark, d)
				}
				continue
			}
			for next < len(reqs) && full(next, d) {
				next++
			}
			if next == len(reqs) {
				// Every request is full (by count or bytes): the rest stay
				// as they are for the next claim, their expired leases
				// traced then.
				break
			}
			if expired {
				nExpired++
				events = append(events, expiredEvent(d))
			}
			if !req.Dead {
				d.attempts++
			}
			leased[next] = append(leased[next], d)
			used[next] += sizes[d.messageID]
		}
		for i, r := range reqs {
			if len(leased[i]) == 0 {
				continue
			}
			ids := make([]uint64, len(leased[i]))
			for j, d := range leased[i] {
				ids[j] = d.messageID
			}
			if err := leaseDeliveries(ctx, tx, r.Subscription, ids, r.Consumer, r.Token, req.Now, req.Now.Add(r.Lease), !req.Dead); err != nil {
				return err
			}
		}
		if len(dead) > 0 {
			if err := markDead(ctx, tx, dead, req.Now); err != nil {
				return err
			}
		}
		if err := s.unparkNext(ctx, tx, unpark, req.Now); err != nil {
			return err
		}
		return insertEvents(ctx, tx, events)
	})
	if err != nil {
		return nil, err
	}
	s.counted(req.Topic, req.Subscription, EventLeaseExpired, nExpired)
	s.counted(req.Topic, req.Subscription, EventDeadLettered, nDied)
	out := make([][]Claimed, len(reqs))
	for i, ls := range leased {
		for _, d := range ls {
			m, ok := msgs[d.messageID]
			if !ok {
				continue // a delivery without its message: reconciliation reports it
			}
			out[i] = append(out[i], Claimed{Message: m, Attempt: d.attempts, Token: reqs[i].Token, LeaseExpires: req.Now.Add(reqs[i].Lease),
				ErrorCode: d.errorCode})
		}
	}
	return out, nil
}

// candidateMessages reads the bodies of the claim's candidates.
func candidateMessages(ctx context.Context, tx *sql.Tx, cands []delivery) (map[uint64]*Message, error) {
	ids := make([]uint64, len(cands))
	for i, d := range cands {
		ids[i] = d.messageID
	}
	return selectMessages(ctx, tx, ids)
}

// Release gives back leases taken by a claim whose consumer never got them
// (its request ended before the answer): each delivery whose lease still
// holds the claim token becomes ready at once as if it had not been
// claimed — the attempt is not counted (countAttempt as the claim did) and
// no lease_expired is traced later. It answers how many were released.
func (s *Store) Release(ctx context.Context, leases []Lease, countAttempt bool, now time.Time) (int64, error) {
	if len(leases) == 0 {
		return 0, nil
	}
	var n int64
	err := s.inTx(ctx, txAttempts, s.retryHook("release"), func(tx *sql.Tx) error {
		n = 0
		type group struct {
			sub   string
			token uint64
		}
		groups := map[group][]uint64{}
		for _, l := range leases {
			g := group{l.Subscription, l.Token}
			groups[g] = append(groups[g], l.MessageID)
		}
		for g, ids := range groups {
			k, err := releaseDeliveries(ctx, tx, g.sub, g.token, ids, countAttempt, now)
			if err != nil {
				return err
			}
			n += k
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// keepHeads returns the candidates that head their order key (messages
// without an order key are their own key) and parks the others, so that
// later claims skip them until their turn.
func (s *Store) keepHeads(ctx context.Context, tx *sql.Tx, req ClaimRequest, cands []delivery) ([]delivery, error) {
	var keys []string
	seen := map[string]bool{}
	for _, d := range cands {
		if d.orderKey != "" && !seen[d.orderKey] {
			seen[d.orderKey] = true
			keys = append(keys, d.orderKey)
		}
	}
	if len(keys) == 0 {
		return cands, nil
	}
	heads, err := s.orderHeads(ctx, tx, req.Topic, req.Subscription, keys)
	if err != nil {
		return nil, err
	}
	var keep []delivery
	var park []uint64
	for _, d := range cands {
		if d.orderKey == "" || heads[d.orderKey] == d.messageID {
			keep = append(keep, d)
			continue
		}
		park = append(park, d.messageID)
	}
	if len(park) > 0 {
		if err := parkDeliveries(ctx, tx, req.Subscription, park); err != nil {
			return nil, err
		}
	}
	return keep, nil
}

// unparkNext lets the next delivery of each finished delivery's order key
// go (the finished one was acked or died).
func (s *Store) unparkNext(ctx context.Context, tx *sql.Tx, finished []delivery, now time.Time) error {
	done := map[[3]string]bool{}
	for _, d := range finished {
		k := [3]string{d.topic, d.subscription, d.orderKey}
		if d.orderKey == "" || done[k] {
			continue
		}
		done[k] = true
		if err := s.unparkHead(ctx, tx, d.topic, d.subscription, d.orderKey, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) event(at time.Time, d delivery, typ, consumer string, attempt int, code, msg string) Event {
	return Event{ID: s.ids.Next(), At: at, MessageID: d.messageID, VShard: d.vshard, Subscription: d.subscription,
		Type: typ, Consumer: consumer, Attempt: attempt, ErrorCode: code, Error: msg}
}

// Lease names a leased delivery: what a receipt carries.
type Lease struct {
	MessageID    uint64
	Subscription string
	Token        uint64
	// Ordered: the subscription was ordered when the lease was taken, so
	// finishing it lets the next delivery of its order key go.
	Ordered bool
}

// LeaseStatus is the outcome of an ack or extend.
type LeaseStatus = domain.LeaseStatus

// The outcomes an ack's or extend's transaction decides (see domain).
const (
	LeaseOK       = domain.LeaseOK
	LeaseLost     = domain.LeaseLost
	LeaseNotFound = domain.LeaseNotFound
)

// holds classifies a locked delivery against a lease.
func holds(d delivery, found bool, l Lease) LeaseStatus {
	switch {
	case !found:
		return LeaseNotFound
	case d.claimToken == 0 || d.claimToken != l.Token:
		return LeaseLost
	}
	return LeaseOK
}

// lockLeases locks the deliveries leases name, grouped by subscription.
func lockLeases(ctx context.Context, tx *sql.Tx, leases []Lease) (map[Lease]delivery, map[Lease]bool, error) {
	bySub := map[string][]uint64{}
	for _, l := range leases {
		bySub[l.Subscription] = append(bySub[l.Subscription], l.MessageID)
	}
	rows := map[Lease]delivery{}
	found := map[Lease]bool{}
	for sub, ids := range bySub {
		ds, err := lockDeliveries(ctx, tx, sub, ids)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range leases {
			if l.Subscription != sub {
				continue
			}
			if d, ok := ds[l.MessageID]; ok {
				rows[l] = d
				found[l] = true
			}
		}
	}
	return rows, found, nil
}

// Ack completes deliveries: each whose receipt still holds the lease is
// deleted, traced acked (with its claim time, consumer and attempt), and its
// message marked consumed when no subscription has it left — all in one
// transaction. On an ordered subscription (Lease.Ordered) the next delivery
// of the key is un-parked. Results are in the order of leases.
func (s *Store) Ack(ctx context.Context, leases []Lease, now time.Time) ([]LeaseStatus, error) {
	out := make([]LeaseStatus, len(leases))
	err := s.inTx(ctx, txAttempts, s.retryHook("ack"), func(tx *sql.Tx) error {
		return s.ackIn(ctx, tx, leases, nil, now, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ackIn is Ack's work inside tx, the statuses written to out; rids, when
// set, gives each lease's request id for its trace event (AckMany's
// leases come from several requests).
func (s *Store) ackIn(ctx context.Context, tx *sql.Tx, leases []Lease, rids []string, now time.Time, out []LeaseStatus) error {
	rows, found, err := lockLeases(ctx, tx, leases)
	if err != nil {
		return err
	}
	bySub := map[string][]uint64{}
	var events []Event
	var acked []uint64
	var unpark []delivery
	done := map[Lease]bool{}
	for i, l := range leases {
		out[i] = holds(rows[l], found[l], l)
		if out[i] != LeaseOK || done[l] {
			if done[l] {
				out[i] = LeaseNotFound // the same receipt twice in one request
			}
			continue
		}
		done[l] = true
		d := rows[l]
		bySub[l.Subscription] = append(bySub[l.Subscription], l.MessageID)
		acked = append(acked, l.MessageID)
		ev := s.event(now, d, EventAcked, d.lockedBy, d.attempts, "", "")
		ev.ClaimedAt = d.claimedAt
		if rids != nil {
			ev.RequestID = rids[i]
		}
		events = append(events, ev)
		if d.orderKey != "" && !d.isDead && l.Ordered {
			unpark = append(unpark, d)
		}
	}
	if len(acked) == 0 {
		return nil
	}
	for sub, ids := range bySub {
		if err := deleteDeliveries(ctx, tx, sub, ids); err != nil {
			return err
		}
	}
	if err := s.unparkNext(ctx, tx, unpark, now); err != nil {
		return err
	}
	if err := insertEvents(ctx, tx, events); err != nil {
		return err
	}
	return markConsumed(ctx, tx, acked, now)
}

// NackItem is one failed delivery.
type NackItem struct {
	Lease
	ErrorCode  string
	Error      string
	RetryAfter time.Duration // 0: use the subscription's backoff, unless RetryNow
	// RetryNow makes the delivery ready at once (a nack's explicit
	// retry_after_ms of 0), instead of after the backoff.
	RetryNow bool
}

// NackStatus is the outcome of a nack.
type NackStatus = domain.NackStatus

// The outcomes a nack's transaction decides (see domain).
const (
	RetryScheduled = domain.NackRetryScheduled
	Dead           = domain.NackDead
	NackLeaseLost  = domain.NackLeaseLost
	NackNotFound   = domain.NackNotFound
)

// NackResult is one nack's outcome; NextAttemptAt is set for retries.
type NackResult struct {
	Status        NackStatus
	NextAttemptAt time.Time
}

// Nack fails deliveries: each whose receipt holds the lease is either
// scheduled for another attempt after its backoff or, when it has used the
// policy's max attempts, dead-lettered with its message marked dead. Both
// are traced. policy gives the subscription's current retry policy, so a
// changed policy applies to the next attempt; rnd returns numbers in [0,1)
// for jitter.
//
// A nack of a dead letter leased on the dead-letter channel keeps it dead
// and offers it again on that channel after the backoff.
func (s *Store) Nack(ctx context.Context, items []NackItem, policy func(topic, sub string) RetryPolicy, rnd func() float64, now time.Time) ([]NackResult, error) {
	out := make([]NackResult, len(items))
	leases := make([]Lease, len(items))
	for i, it := range items {
		leases[i] = it.Lease
	}
	var died []delivery // for OnDeliveries, of the run that committed
	err := s.inTx(ctx, txAttempts, s.retryHook("nack"), func(tx *sql.Tx) error {
		died = died[:0]
		rows, found, err := lockLeases(ctx, tx, leases)
		if err != nil {
			return err
		}
		var events []Event
		var dead []uint64
		var unpark []delivery
		done := map[Lease]bool{}
		for i, it := range items {
			st := holds(rows[it.Lease], found[it.Lease], it.Lease)
			if done[it.Lease] {
				st = LeaseLost
			}
			switch st {
			case LeaseNotFound:
				out[i] = NackResult{Status: NackNotFound}
				continue
			case LeaseLost:
				out[i] = NackResult{Status: NackLeaseLost}
				continue
			}
			done[it.Lease] = true
			d := rows[it.Lease]
			p := policy(d.topic, d.subscription).WithDefaults()
			nacked := s.event(now, d, EventNacked, d.lockedBy, d.attempts, it.ErrorCode, it.Error)
			nacked.ClaimedAt = d.claimedAt // the trace shows when the failed attempt was claimed
			events = append(events, nacked)
			if d.isDead {
				wait := it.RetryAfter
				if wait <= 0 && !it.RetryNow {
					wait = p.Backoff(1, rnd())
				}
				next := now.Add(wait)
				if _, err := scheduleRetry(ctx, tx, d.subscription, d.messageID, it.Token, next, it.ErrorCode, it.Error); err != nil {
					return err
				}
				out[i] = NackResult{Status: RetryScheduled, NextAttemptAt: next}
				continue
			}
			if d.attempts >= p.MaxAttempts {
				if _, err := killDelivery(ctx, tx, d.subscription, d.messageID, it.Token, now, it.ErrorCode, it.Error); err != nil {
					return err
				}
				events = append(events, s.event(now, d, EventDeadLettered, d.lockedBy, d.attempts, it.ErrorCode, it.Error))
				dead = append(dead, d.messageID)
				died = append(died, d)
				if d.orderKey != "" && it.Ordered {
					unpark = append(unpark, d)
				}
				out[i] = NackResult{Status: Dead}
				continue
			}
			wait := it.RetryAfter
			if wait <= 0 && !it.RetryNow {
				wait = p.Backoff(d.attempts, rnd())
			}
			next := now.Add(wait)
			if _, err := scheduleRetry(ctx, tx, d.subscription, d.messageID, it.Token, next, it.ErrorCode, it.Error); err != nil {
				return err
			}
			ev := s.event(now, d, EventRetryScheduled, d.lockedBy, d.attempts, it.ErrorCode, "")
			events = append(events, ev)
			out[i] = NackResult{Status: RetryScheduled, NextAttemptAt: next}
		}
		if len(dead) > 0 {
			if err := markDead(ctx, tx, dead, now); err != nil {
				return err
			}
		}
		if err := s.unparkNext(ctx, tx, unpark, now); err != nil {
			return err
		}
		return insertEvents(ctx, tx, events)
	})
	if err != nil {
		return nil, err
	}
	for _, d := range died {
		s.counted(d.topic, d.subscription, EventDeadLettered, 1)
	}
	return out, nil
}

// Extend moves the expiry of leases still held to now+lease.
func (s *Store) Extend(ctx context.Context, leases []Lease, lease time.Duration, now time.Time) ([]LeaseStatus, time.Time, error) {
	out := make([]LeaseStatus, len(leases))
	expires := now.Add(lease)
	err := s.inTx(ctx, txAttempts, s.retryHook("extend"), func(tx *sql.Tx) error {
		rows, found, err := lockLeases(ctx, tx, leases)
		if err != nil {
			return err
		}
		bySub := map[string][]uint64{}
		for i, l := range leases {
			out[i] = holds(rows[l], found[l], l)
			if out[i] == LeaseOK {
				bySub[l.Subscription] = append(bySub[l.Subscription], l.MessageID)
			}
		}
		for sub, ids := range bySub {
			if err := extendLeases(ctx, tx, sub, ids, expires); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	return out, expires, nil
}
