package loadtest

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Verifier keeps the books of one workload: what was sent, what the target
// acknowledged as stored, and every delivery of every (subscription, key).
// From them it tells, at the end, what was lost, what was delivered twice
// and why, and what was never produced at all. Safe for concurrent use;
// state is sharded by key so that producers and consumers rarely meet on
// a lock, and holds no pointers so that millions of keys cost the garbage
// collector nothing to scan.
type Verifier struct {
	subs   int // subscriptions per topic
	policy ConsumerPolicy
	shards [64]verifierShard
	// Visibility is the consumers' lease. A delivery of an attempt
	// already delivered is two leases at once (a duplicate) only while
	// the first lease could still run; after it, it is a redelivery whose
	// attempt an owner's crash did not count (docs/consume.md, "Owners").
	// Zero: every repeat of an attempt is a duplicate.
	Visibility time.Duration

	outstanding atomic.Int64 // expected deliveries not yet settled
	c           verifyCounters
}

// ConsumerPolicy is how the load test's consumers treat deliveries; each
// choice is made per key, so it is the same on every redelivery.
type ConsumerPolicy struct {
	// NackShare of the keys are poison: every attempt is nacked, so they
	// end dead-lettered after the subscription's max attempts.
	NackShare float64
	// RetryShare of the keys are nacked on their first attempt only and
	// acked on the redelivery.
	RetryShare float64
	// DropShare of the keys are neither acked nor nacked on their first
	// attempt (a consumer that crashed): the lease expires and they come
	// back.
	DropShare float64
}

type verifierShard struct {
	mu   sync.Mutex
	keys map[keyID]keyState
	dels map[delKey]delState
}

// keyState is what the producers know of a key.
type keyState struct {
	status uint8 // keySent, keyCreated, keyStoredDup
	topic  uint8
	id     uint64 // message id answered
}

const (
	keySent      = iota // sent; no definite answer yet
	keyCreated          // answered created
	keyStoredDup        // answered duplicate to a resend after an unknown outcome: the first attempt was stored
)

// delKey is one (topic×subscription pair, key).
type delKey uint64

func newDelKey(pair int, k keyID) delKey { return delKey(uint64(pair)<<56 | uint64(k)) }

const maxPairs = 256

// delState is what the consumers know of one delivery.
type delState struct {
	received   uint16
	attempts   uint32 // bit n: attempt n was delivered
	id         uint64 // message id delivered
	ackOK      bool   // an ack was confirmed
	ackUnknown bool   // an ack's outcome is unknown (target unavailable)
	nacked     bool   // the last delivery was nacked for a retry
	leaseEnd   int64  // when the last delivery's lease ran out (unix ns)
	dead       bool
	settled    bool
}

type verifyCounters struct {
	sent, created, storedDup, createdTwice                                    atomic.Int64
	received, redeliveredNack, redeliveredExpiry, duplicated, dedupViolations atomic.Int64
	redeliveredUncounted                                                      atomic.Int64
	unexpected, corrupt, acked, ackLeaseLost, ackNotFound, ackUnknown, nacked atomic.Int64
	dead, deadUnexpected, dupAnswerFresh, conflicts                           atomic.Int64
}

// NewVerifier keeps the books for topics with subs subscriptions each.
func NewVerifier(subs int, policy ConsumerPolicy) *Verifier {
	v := &Verifier{subs: subs, policy: policy}
	for i := range v.shards {
		v.shards[i].keys = map[keyID]keyState{}
		v.shards[i].dels = map[delKey]delState{}
	}
	return v
}

func (v *Verifier) shard(k keyID) *verifierShard { return &v.shards[mix(uint64(k))&63] }

// Sent records that k was sent for the first time, to topic.
func (v *Verifier) Sent(k keyID, topic int) {
	s := v.shard(k)
	s.mu.Lock()
	if _, ok := s.keys[k]; !ok {
		s.keys[k] = keyState{status: keySent, topic: uint8(topic)}
		v.c.sent.Add(1)
	}
	s.mu.Unlock()
}

// Created records that the target answered created for k with message id.
func (v *Verifier) Created(k keyID, id uint64) { v.stored(k, id, keyCreated) }

// StoredByDuplicate records that a resend of k after an unknown outcome
// was answered duplicate of message id: the first attempt was stored.
func (v *Verifier) StoredByDuplicate(k keyID, id uint64) { v.stored(k, id, keyStoredDup) }

func (v *Verifier) stored(k keyID, id uint64, status uint8) {
	s := v.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, ok := s.keys[k]
	if ok && ks.status != keySent {
		if ks.id != id || status == keyCreated {
			v.c.createdTwice.Add(1) // the key was stored twice
		}
		return
	}
	ks.status, ks.id = status, id
	s.keys[k] = ks
	if status == keyCreated {
		v.c.created.Add(1)
	} else {
		v.c.storedDup.Add(1)
	}
	// The key is now expected on every subscription of its topic; some
	// deliveries may already have settled (a consumer can see a message
	// before its producer sees the answer).
	unsettled := int64(v.subs)
	for sub := range v.subs {
		if d, ok := s.dels[newDelKey(int(ks.topic)*v.subs+sub, k)]; ok && d.settled {
			unsettled--
		}
	}
	v.outstanding.Add(unsettled)
}

// DuplicateOfFresh records a first send of a new key answered duplicate:
// the target claims to know a key it cannot have seen.
func (v *Verifier) DuplicateOfFresh() { v.c.dupAnswerFresh.Add(1) }

// Conflict records a conflict answer (payloads are derived from keys, so
// there should be none).
func (v *Verifier) Conflict() { v.c.conflicts.Add(1) }

// Action is what a consumer does with a delivery.
type Action uint8

const (
	ActAck Action = iota
	ActNack
	ActDrop
)

// Received records a delivery of k on pair with message id and attempt,
// received at at, classifies it (first delivery, redelivery after a nack
// or an expired lease, or a true duplicate) and returns what the consumer
// should do.
func (v *Verifier) Received(pair int, k keyID, id uint64, attempt int, at time.Time) Action {
	s := v.shard(k)
	dk := newDelKey(pair, k)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keys[k]; !ok {
		v.c.unexpected.Add(1)
		return ActAck
	}
	v.c.received.Add(1)
	d := s.dels[dk]
	var bit uint32
	if attempt > 0 && attempt < 32 {
		bit = 1 << attempt
	}
	switch {
	case d.received == 0:
	case d.id != id:
		// Two messages for one key: dedup failed.
		v.c.dedupViolations.Add(1)
		v.c.duplicated.Add(1)
	case d.ackOK:
		// Delivered again after an ack the target confirmed.
		v.c.duplicated.Add(1)
	case d.attempts&bit != 0 && v.Visibility > 0 && at.UnixNano() >= d.leaseEnd:
		// The same attempt again, after the lease of the first ran out:
		// its owner crashed before the attempt was counted. Not two
		// leases at once.
		v.c.redeliveredUncounted.Add(1)
	case d.attempts&bit != 0:
		// The same attempt twice: two leases at once.
		v.c.duplicated.Add(1)
	case d.nacked:
		v.c.redeliveredNack.Add(1)
	default:
		v.c.redeliveredExpiry.Add(1)
	}
	d.received++
	d.attempts |= bit
	d.leaseEnd = at.Add(v.Visibility).UnixNano()
	if d.id == 0 {
		d.id = id
	}
	d.nacked = false
	s.dels[dk] = d
	return v.policy.action(k, attempt)
}

// action is what the consumers do with attempt of k: it depends on the
// key alone, so every generator of a fleet decides the same without
// sharing the books.
func (p ConsumerPolicy) action(k keyID, attempt int) Action {
	switch {
	case k.unit(saltPoison) < p.NackShare:
		return ActNack
	case attempt <= 1 && k.unit(saltRetry) < p.RetryShare:
		return ActNack
	case attempt <= 1 && k.unit(saltDrop) < p.DropShare:
		return ActDrop
	}
	return ActAck
}

// Unexpected records a delivery of a key this run did not make.
func (v *Verifier) Unexpected() { v.c.unexpected.Add(1) }

// known reports whether k was sent (by any generator whose books reached
// this Verifier).
func (v *Verifier) known(k keyID) bool {
	s := v.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[k]
	return ok
}

// Corrupt records a delivery whose payload is not what was produced.
func (v *Verifier) Corrupt() { v.c.corrupt.Add(1) }

// settle marks d settled; s is locked.
func (v *Verifier) settle(s *verifierShard, k keyID, d *delState) {
	if d.settled {
		return
	}
	d.settled = true
	if ks, ok := s.keys[k]; ok && ks.status != keySent {
		v.outstanding.Add(-1)
	}
}

// Acked records an ack's answer for k on pair: ok, lease_lost,
// not_found, or anything else (unavailable, transport failure) for an
// unknown outcome.
func (v *Verifier) Acked(pair int, k keyID, status string) {
	s := v.shard(k)
	dk := newDelKey(pair, k)
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.dels[dk]
	if !ok {
		return
	}
	switch status {
	case "ok":
		if d.ackOK {
			v.c.duplicated.Add(1) // acked twice: processed twice
		}
		d.ackOK = true
		v.c.acked.Add(1)
		v.settle(s, k, &d)
	case "lease_lost":
		v.c.ackLeaseLost.Add(1) // the lease expired and another consumer has it
	case "not_found":
		v.c.ackNotFound.Add(1)
	default:
		d.ackUnknown = true
		v.c.ackUnknown.Add(1)
		v.settle(s, k, &d)
	}
	s.dels[dk] = d
}

// Nacked records a nack's answer for k on pair.
func (v *Verifier) Nacked(pair int, k keyID, status string) {
	s := v.shard(k)
	dk := newDelKey(pair, k)
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.dels[dk]
	if !ok {
		return
	}
	v.c.nacked.Add(1)
	switch status {
	case "retry_scheduled":
		d.nacked = true
	case "dead":
		d.dead = true
		v.c.dead.Add(1)
		if k.unit(saltPoison) >= v.policy.NackShare {
			v.c.deadUnexpected.Add(1)
		}
		v.settle(s, k, &d)
	}
	s.dels[dk] = d
}

// Outstanding is how many expected deliveries are not settled yet: acked,
// dead-lettered, or delivered with an ack of unknown outcome.
func (v *Verifier) Outstanding() int64 { return v.outstanding.Load() }

// Verification is the end of a workload's books.
type Verification struct {
	// Workload names the target and topics the books are about.
	Workload string `json:"workload"`
	// Mode is "consumed" (every acknowledged key was to be consumed) or
	// "stored" (produce only: a sample of the acknowledged keys was looked
	// up in the dedup registry).
	Mode string `json:"mode"`
	// Sent keys; Acknowledged = Created + StoredByDuplicate.
	Sent              int64 `json:"sent"`
	Acknowledged      int64 `json:"acknowledged"`
	Created           int64 `json:"created"`
	StoredByDuplicate int64 `json:"stored_by_duplicate"`
	// Expected deliveries (acknowledged keys × subscriptions) and how many
	// were consumed (acked), dead-lettered as asked, or delivered with an
	// ack of unknown outcome.
	Expected   int64 `json:"expected_deliveries"`
	Consumed   int64 `json:"consumed"`
	AckUnknown int64 `json:"ack_unknown"`
	Dead       int64 `json:"dead"`
	// Lost: acknowledged, never consumed and not found in the dedup
	// registry. Pending: acknowledged and not consumed but stored (still
	// queued, leased, or dead-lettered by lease expiry) when the run
	// ended. Unchecked: not consumed and not looked up.
	Lost      int64 `json:"lost"`
	Pending   int64 `json:"pending"`
	Unchecked int64 `json:"unchecked"`
	// Checked is how many keys were looked up in the dedup registry.
	Checked int64 `json:"checked"`
	// Duplicated counts true duplicates: a delivery after a confirmed ack,
	// the same attempt delivered twice, two messages for one key, or a
	// key stored twice. Redeliveries are expected and counted apart.
	Duplicated             int64 `json:"duplicated"`
	DedupViolations        int64 `json:"dedup_violations"`
	RedeliveredAfterNack   int64 `json:"redelivered_after_nack"`
	RedeliveredAfterExpiry int64 `json:"redelivered_after_lease_expiry"`
	// RedeliveredUncounted: delivered again with an attempt number already
	// delivered, after that delivery's lease ran out — an owner crash lost
	// the attempt's count (docs/consume.md, "What a crash costs"). Not a
	// duplicate: the two leases did not overlap.
	RedeliveredUncounted int64 `json:"redelivered_same_attempt_after_lease_end"`
	// Unexpected deliveries: keys this run never sent. DeliveredUnconfirmed:
	// keys whose produce never got a definite answer but were delivered
	// (stored after all: not an error). DeadUnexpected: dead letters the
	// consumers did not ask for.
	Unexpected           int64 `json:"unexpected"`
	DeliveredUnconfirmed int64 `json:"delivered_unconfirmed"`
	DeadUnexpected       int64 `json:"dead_unexpected"`
	Corrupt              int64 `json:"corrupt_payloads"`
	DuplicateOfFresh     int64 `json:"duplicate_answer_to_fresh_key"`
	Conflicts            int64 `json:"conflicts"`
	AckLeaseLost         int64 `json:"ack_lease_lost"`
	AckNotFound          int64 `json:"ack_not_found"`
	// LostKeys lists up to 20 lost keys.
	LostKeys []string `json:"lost_keys,omitempty"`
}

// lookupFunc reads the dedup registry: which message id holds key.
type lookupFunc func(ctx context.Context, topic int, k keyID) (id uint64, found bool, err error)

// candidate is an acknowledged key not (fully) consumed.
type candidate struct {
	k       keyID
	topic   int
	missing int64 // its unsettled deliveries
}

// Finish closes the books. consumed says whether every acknowledged key
// was to be consumed (the workload was drained); otherwise up to sample
// acknowledged keys are looked up. lookup may be nil (nothing can be
// looked up: every unconsumed key counts as lost). keyName names keys for
// the report.
func (v *Verifier) Finish(ctx context.Context, consumed bool, sample int, lookup lookupFunc, keyName func(keyID) string) Verification {
	r := Verification{
		Sent: v.c.sent.Load(), Created: v.c.created.Load(), StoredByDuplicate: v.c.storedDup.Load(),
		Duplicated: v.c.duplicated.Load() + v.c.createdTwice.Load(), DedupViolations: v.c.dedupViolations.Load() + v.c.createdTwice.Load(),
		RedeliveredAfterNack: v.c.redeliveredNack.Load(), RedeliveredAfterExpiry: v.c.redeliveredExpiry.Load(),
		RedeliveredUncounted: v.c.redeliveredUncounted.Load(),
		Unexpected:           v.c.unexpected.Load(), Corrupt: v.c.corrupt.Load(), DeadUnexpected: v.c.deadUnexpected.Load(),
		DuplicateOfFresh: v.c.dupAnswerFresh.Load(), Conflicts: v.c.conflicts.Load(),
		AckLeaseLost: v.c.ackLeaseLost.Load(), AckNotFound: v.c.ackNotFound.Load(),
	}
	r.Acknowledged = r.Created + r.StoredByDuplicate
	var cands []candidate
	for i := range v.shards {
		s := &v.shards[i]
		s.mu.Lock()
		for k, ks := range s.keys {
			if ks.status == keySent {
				for sub := range v.subs {
					if d, ok := s.dels[newDelKey(int(ks.topic)*v.subs+sub, k)]; ok && d.received > 0 {
						r.DeliveredUnconfirmed++
						break
					}
				}
				continue
			}
			if !consumed {
				continue
			}
			r.Expected += int64(v.subs)
			var missing int64
			for sub := range v.subs {
				d := s.dels[newDelKey(int(ks.topic)*v.subs+sub, k)]
				switch {
				case d.ackOK:
					r.Consumed++
				case d.dead:
					r.Dead++
				case d.ackUnknown:
					r.AckUnknown++
				default:
					missing++
				}
			}
			if missing > 0 {
				cands = append(cands, candidate{k: k, topic: int(ks.topic), missing: missing})
			}
		}
		if !consumed && sample > 0 {
			for k, ks := range s.keys {
				if ks.status != keySent && len(cands) < sample {
					cands = append(cands, candidate{k: k, topic: int(ks.topic)})
				}
			}
		}
		s.mu.Unlock()
	}
	r.Mode = "consumed"
	if !consumed {
		r.Mode = "stored"
	}
	sort.Slice(cands, func(a, b int) bool { return cands[a].k < cands[b].k })
	if lookup == nil {
		for _, c := range cands {
			r.Unchecked += max(c.missing, 1)
		}
		if consumed {
			// Nothing can tell a slow message from a lost one: count as lost.
			r.Lost, r.Unchecked = r.Unchecked, 0
			for _, c := range cands[:min(20, len(cands))] {
				r.LostKeys = append(r.LostKeys, keyName(c.k))
			}
		}
		return r
	}
	const maxLookups = 20000
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	type found struct {
		id     uint64
		ok     bool
		err    error
		looked bool
	}
	res := make([]found, len(cands))
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(cands) || i >= maxLookups || lctx.Err() != nil {
					return
				}
				id, ok, err := lookup(lctx, cands[i].topic, cands[i].k)
				res[i] = found{id: id, ok: ok, err: err, looked: true}
			}
		}()
	}
	wg.Wait()
	for i, c := range cands {
		n := max(c.missing, 1)
		f := res[i]
		switch {
		case !f.looked || f.err != nil:
			r.Unchecked += n
		case !f.ok:
			r.Checked++
			r.Lost += n
			if len(r.LostKeys) < 20 {
				r.LostKeys = append(r.LostKeys, keyName(c.k))
			}
		default:
			r.Checked++
			if want := v.answeredID(c.k); want != 0 && want != f.id {
				r.DedupViolations++
				r.Duplicated++
			}
			if consumed {
				r.Pending += n
			}
		}
	}
	return r
}

func (v *Verifier) answeredID(k keyID) uint64 {
	s := v.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[k].id
}
