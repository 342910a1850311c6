package loadtest

import (
	"context"
	"testing"
	"time"
)

func keyName(k keyID) string { return newKeyspace("t", Dist{Kind: "fixed", A: 10}, KeyDist{}).key(k) }

// finish closes the books with every unconsumed key either stored or not.
func finish(v *Verifier, stored map[keyID]uint64) Verification {
	var lookup lookupFunc
	if stored != nil {
		lookup = func(_ context.Context, _ int, k keyID) (uint64, bool, error) {
			id, ok := stored[k]
			return id, ok, nil
		}
	}
	return v.Finish(context.Background(), true, 0, lookup, keyName)
}

func TestVerifierCleanRun(t *testing.T) {
	t.Parallel()
	v := NewVerifier(2, ConsumerPolicy{})
	for i := range 10 {
		k := newKeyID(0, uint64(i))
		v.Sent(k, 0)
		v.Created(k, uint64(100+i))
	}
	if got := v.Outstanding(); got != 20 {
		t.Fatalf("outstanding %d, want 10 keys × 2 subscriptions", got)
	}
	for i := range 10 {
		k := newKeyID(0, uint64(i))
		for pair := range 2 {
			if act := v.Received(pair, k, uint64(100+i), 1, time.Now()); act != ActAck {
				t.Fatalf("action %d, want ack", act)
			}
			v.Acked(pair, k, "ok")
		}
	}
	if got := v.Outstanding(); got != 0 {
		t.Fatalf("outstanding %d after every ack", got)
	}
	r := finish(v, nil)
	if r.Lost != 0 || r.Duplicated != 0 || r.Consumed != 20 || r.Expected != 20 || r.Acknowledged != 10 {
		t.Fatalf("got %+v", r)
	}
}

// A consumer may see a message before its producer sees the answer.
func TestVerifierDeliveryBeforeAnswer(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	k := newKeyID(3, 7)
	v.Sent(k, 0)
	v.Received(0, k, 55, 1, time.Now())
	v.Acked(0, k, "ok")
	v.Created(k, 55)
	if got := v.Outstanding(); got != 0 {
		t.Fatalf("outstanding %d, want 0", got)
	}
	if r := finish(v, nil); r.Lost != 0 || r.Consumed != 1 || r.Unexpected != 0 {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierLost(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	a, b, c := newKeyID(0, 1), newKeyID(0, 2), newKeyID(0, 3)
	for _, k := range []keyID{a, b, c} {
		v.Sent(k, 0)
		v.Created(k, uint64(k)+1000)
	}
	v.Received(0, a, uint64(a)+1000, 1, time.Now())
	v.Acked(0, a, "ok")

	// Nothing to look keys up with: b and c count as lost.
	r := finish(v, nil)
	if r.Lost != 2 || len(r.LostKeys) != 2 || r.LostKeys[0] != keyName(b) {
		t.Fatalf("got %+v", r)
	}
	// b is still stored (pending), c is not (lost).
	r = finish(v, map[keyID]uint64{b: uint64(b) + 1000})
	if r.Lost != 1 || r.Pending != 1 || r.Checked != 2 || r.LostKeys[0] != keyName(c) {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierRedeliveries(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	k := newKeyID(1, 1)
	v.Sent(k, 0)
	v.Created(k, 9)

	// First delivery: the ack's lease was lost (it expired), so the next
	// delivery is a redelivery after lease expiry, not a duplicate.
	v.Received(0, k, 9, 1, time.Now())
	v.Acked(0, k, "lease_lost")
	v.Received(0, k, 9, 2, time.Now())
	// A nack schedules a retry; the next delivery is after a nack.
	v.Nacked(0, k, "retry_scheduled")
	v.Received(0, k, 9, 3, time.Now())
	v.Acked(0, k, "ok")

	r := finish(v, nil)
	if r.RedeliveredAfterExpiry != 1 || r.RedeliveredAfterNack != 1 || r.Duplicated != 0 || r.Consumed != 1 || r.Lost != 0 {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierTrueDuplicates(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	acked, twice, otherID := newKeyID(0, 1), newKeyID(0, 2), newKeyID(0, 3)
	for _, k := range []keyID{acked, twice, otherID} {
		v.Sent(k, 0)
		v.Created(k, uint64(k))
	}
	// Delivered again after a confirmed ack.
	v.Received(0, acked, uint64(acked), 1, time.Now())
	v.Acked(0, acked, "ok")
	v.Received(0, acked, uint64(acked), 2, time.Now())
	// The same attempt delivered twice: two leases at once.
	v.Received(0, twice, uint64(twice), 1, time.Now())
	v.Received(0, twice, uint64(twice), 1, time.Now())
	v.Acked(0, twice, "ok")
	// Two message ids for one key: dedup failed.
	v.Received(0, otherID, uint64(otherID), 1, time.Now())
	v.Received(0, otherID, 12345, 1, time.Now())
	v.Acked(0, otherID, "ok")

	r := finish(v, nil)
	if r.Duplicated != 3 || r.DedupViolations != 1 || r.RedeliveredAfterExpiry != 0 {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierStoredTwice(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	k := newKeyID(0, 1)
	v.Sent(k, 0)
	v.Created(k, 1)
	v.Created(k, 2) // a resend created the key again
	if r := finish(v, nil); r.Duplicated != 1 || r.DedupViolations != 1 {
		t.Fatalf("got %+v", r)
	}
}

// A resend after an unknown outcome answered duplicate proves the first
// attempt was stored: the key is expected like a created one.
func TestVerifierStoredByDuplicate(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	k, never := newKeyID(0, 1), newKeyID(0, 2)
	v.Sent(k, 0)
	v.Sent(never, 0) // no definite answer ever
	v.StoredByDuplicate(k, 5)
	if v.Outstanding() != 1 {
		t.Fatalf("outstanding %d, want 1", v.Outstanding())
	}
	v.Received(0, never, 6, 1, time.Now()) // delivered although never confirmed
	v.Acked(0, never, "ok")
	r := finish(v, nil)
	if r.Lost != 1 || r.StoredByDuplicate != 1 || r.Acknowledged != 1 || r.DeliveredUnconfirmed != 1 || r.Unexpected != 0 {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierUnexpected(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	v.Received(0, newKeyID(9, 9), 1, 1, time.Now()) // never sent
	if r := finish(v, nil); r.Unexpected != 1 {
		t.Fatalf("got %+v", r)
	}
}

func TestVerifierConsumerPolicy(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{NackShare: 0.2, RetryShare: 0.2, DropShare: 0.2})
	var poison, retry, drop, plain int
	for i := range 5000 {
		k := newKeyID(0, uint64(i))
		v.Sent(k, 0)
		v.Created(k, uint64(i)+1)
		first := v.Received(0, k, uint64(i)+1, 1, time.Now())
		second := v.Received(0, k, uint64(i)+1, 2, time.Now())
		switch {
		case first == ActNack && second == ActNack:
			poison++
			v.Nacked(0, k, "dead")
		case first == ActNack && second == ActAck:
			retry++
			v.Acked(0, k, "ok")
		case first == ActDrop && second == ActAck:
			drop++
			v.Acked(0, k, "ok")
		case first == ActAck:
			plain++
			v.Acked(0, k, "ok")
		default:
			t.Fatalf("key %d: actions %d then %d", i, first, second)
		}
	}
	// Shares are drawn per key: 20 % poison, then 20 % of the rest, …
	near := func(got int, want float64) bool { return float64(got) > 0.8*want && float64(got) < 1.2*want }
	if !near(poison, 1000) || !near(retry, 800) || !near(drop, 640) {
		t.Fatalf("poison %d, retry %d, drop %d of 5000", poison, retry, drop)
	}
	r := finish(v, nil)
	if r.Dead != int64(poison) || r.DeadUnexpected != 0 || r.Lost != 0 || v.Outstanding() != 0 {
		t.Fatalf("got %+v, outstanding %d", r, v.Outstanding())
	}
}

// In stored mode (produce only), a sample of acknowledged keys is looked
// up, and an id other than the one answered is a dedup violation.
func TestVerifierStoredMode(t *testing.T) {
	t.Parallel()
	v := NewVerifier(1, ConsumerPolicy{})
	stored := map[keyID]uint64{}
	for i := range 100 {
		k := newKeyID(0, uint64(i))
		v.Sent(k, 0)
		v.Created(k, uint64(i)+1)
		if i != 42 {
			stored[k] = uint64(i) + 1
		}
	}
	stored[newKeyID(0, 7)] = 999
	lookup := func(_ context.Context, _ int, k keyID) (uint64, bool, error) {
		id, ok := stored[k]
		return id, ok, nil
	}
	r := v.Finish(context.Background(), false, 1000, lookup, keyName)
	if r.Mode != "stored" || r.Checked != 100 || r.Lost != 1 || r.LostKeys[0] != keyName(newKeyID(0, 42)) || r.DedupViolations != 1 {
		t.Fatalf("got %+v", r)
	}
}

// The same attempt delivered again is two leases at once while the first
// could still run, and a redelivery whose attempt went uncounted (an
// owner's crash) after it.
func TestSameAttemptAfterItsLeaseIsNoDuplicate(t *testing.T) {
	v := NewVerifier(1, ConsumerPolicy{})
	v.Visibility = 10 * time.Second
	k := keyID(7)
	v.Sent(k, 0)
	v.Created(k, 70)
	t0 := time.Now()
	v.Received(0, k, 70, 1, t0)
	v.Received(0, k, 70, 1, t0.Add(5*time.Second)) // its lease still runs
	v.Received(0, k, 70, 1, t0.Add(16*time.Second))
	r := v.Finish(context.Background(), true, 0, nil, func(keyID) string { return "k" })
	if r.Duplicated != 1 || r.RedeliveredUncounted != 1 {
		t.Fatalf("duplicated %d, redelivered uncounted %d; want 1 and 1", r.Duplicated, r.RedeliveredUncounted)
	}
}
