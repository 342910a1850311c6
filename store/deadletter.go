package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/shardmq/shardmq/domain"
)

// ListDead returns one page of a subscription's dead letters on this
// server, newest first, those older than the message id before (0: from
// the newest): at most limit, and at most maxBytes of encoded answer
// (DeadLetter.Size; 0: no byte cap; the first whatever its size), with
// their messages (nil when the message is missing). It sizes the page
// before it reads any payload, so that it reads only what it answers.
// more says whether dead letters are left after the page.
func (s *Store) ListDead(ctx context.Context, topic, sub, errorCode string, before uint64, limit, maxBytes int, now time.Time) ([]DeadLetter, map[uint64]*Message, bool, error) {
	dl, err := listDead(ctx, s.db, topic, sub, errorCode, before, limit+1, now)
	if err != nil {
		return nil, nil, false, translate(err)
	}
	more := len(dl) > limit
	dl = dl[:min(len(dl), limit)]
	ids := make([]uint64, len(dl))
	for i, d := range dl {
		ids[i] = d.MessageID
	}
	sizes, err := selectMessageSizes(ctx, s.db, ids)
	if err != nil {
		return nil, nil, false, translate(err)
	}
	ns := make([]int, len(dl))
	for i := range dl {
		dl[i].Size = deadLetterSize(dl[i], sizes[dl[i].MessageID])
		ns[i] = dl[i].Size
	}
	if n := fitBytes(ns, maxBytes); n < len(dl) {
		dl, ids, more = dl[:n], ids[:n], true
	}
	msgs, err := selectMessages(ctx, s.db, ids)
	if err != nil {
		return nil, nil, false, translate(err)
	}
	return dl, msgs, more, nil
}

// deadLetterSize is a dead letter's share of a listing's answer: its
// message's encoded size (a missing message's fields take about 300
// bytes) and the dead letter's own fields.
func deadLetterSize(d DeadLetter, message int) int {
	return max(message, 300) + 120 + domain.JSONStringLen(d.ErrorCode) + domain.JSONStringLen(d.LastError)
}

// RedriveRequest selects dead letters to make ready again: the given ids,
// or all of one error code, or all (neither set).
type RedriveRequest struct {
	Topic, Subscription string
	IDs                 []uint64
	ErrorCode           string
	Ordered             bool
	Now                 time.Time
}

// redriveBatch is how many dead letters one redrive or purge transaction
// handles, so that a large one never holds many locks for long.
const redriveBatch = 500

// Redrive makes dead letters ready again with attempts reset, in batches
// of short transactions; each is traced redriven, and a message with no
// dead delivery left is pending again. On an ordered subscription a revived
// delivery whose key has another live delivery is parked, so that a key
// never has two in flight. It returns how many were redriven.
func (s *Store) Redrive(ctx context.Context, req RedriveRequest) (int64, error) {
	return s.inBatches(ctx, "redrive", redriveBatch, 0, func(tx *sql.Tx) (int, error) {
		ds, err := lockDead(ctx, tx, req.Topic, req.Subscription, req.ErrorCode, req.IDs, redriveBatch, req.Now)
		if err != nil || len(ds) == 0 {
			return 0, err
		}
		ids := make([]uint64, len(ds))
		var events []Event
		for i, d := range ds {
			ids[i] = d.messageID
			// On an ordered subscription the revived delivery is the
			// oldest of its key, so it becomes the head. If another of
			// the key is in flight it waits, parked, and that one's ack
			// (or death) releases it, as the key's oldest live row.
			parked := false
			if req.Ordered && d.orderKey != "" {
				if parked, err = s.keyInFlight(ctx, tx, req.Topic, req.Subscription, d.orderKey, req.Now); err != nil {
					return 0, err
				}
			}
			if err := reviveDelivery(ctx, tx, req.Subscription, d.messageID, parked, req.Now); err != nil {
				return 0, err
			}
			events = append(events, s.event(req.Now, d, EventRedriven, "", d.attempts, "", ""))
		}
		if err := markRevived(ctx, tx, ids, req.Now); err != nil {
			return 0, err
		}
		return len(ds), insertEvents(ctx, tx, events)
	})
}

// PurgeDead deletes a subscription's dead letters (of one error code, or
// all) in batches and returns how many. Their messages stay dead.
func (s *Store) PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error) {
	return s.inBatches(ctx, "purge", redriveBatch, 0, func(tx *sql.Tx) (int, error) {
		ids, err := deleteDeadBatch(ctx, tx, topic, sub, errorCode, nil, redriveBatch)
		return len(ids), err
	})
}

// DeleteDead deletes the dead letters with the given message ids of a
// subscription (those of them still dead; the others are left alone) and
// returns how many went. Their messages stay dead, as after a purge.
func (s *Store) DeleteDead(ctx context.Context, topic, sub string, ids []uint64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.inBatches(ctx, "delete_dead", redriveBatch, 0, func(tx *sql.Tx) (int, error) {
		got, err := deleteDeadBatch(ctx, tx, topic, sub, "", ids, redriveBatch)
		return len(got), err
	})
}

// LeaseHolders counts a subscription's deliveries in flight on this
// cluster by the consumer holding their lease (the claim's consumer
// name), most first, at most limit consumers.
func (s *Store) LeaseHolders(ctx context.Context, topic, sub string, now time.Time, limit int) ([]LeaseHolder, error) {
	out, err := leaseHolders(ctx, s.db, topic, sub, now, limit)
	return out, translate(err)
}

// CountDead counts a subscription's dead letters on this cluster.
func (s *Store) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	n, err := countDead(ctx, s.db, topic, sub)
	return n, translate(err)
}

// DeadByCode counts, by error code, the dead letters on this cluster that
// Redrive(req) would make ready now; it changes nothing (a redrive's dry
// run, and the dead letters by error code).
func (s *Store) DeadByCode(ctx context.Context, req RedriveRequest) (map[string]int64, error) {
	out, err := countDeadByCode(ctx, s.db, req.Topic, req.Subscription, req.ErrorCode, req.IDs, req.Now)
	return out, translate(err)
}

// ArchiveDead moves a subscription's dead letters that died before cutoff
// (and are not leased) into dead_letter_archive, in batches; each is traced
// archived. It returns how many moved.
func (s *Store) ArchiveDead(ctx context.Context, topic, sub string, cutoff, now time.Time) (int64, error) {
	return s.inBatches(ctx, "archive", redriveBatch, 0, func(tx *sql.Tx) (int, error) {
		ds, err := lockStaleDead(ctx, tx, topic, sub, cutoff, redriveBatch)
		if err != nil || len(ds) == 0 {
			return 0, err
		}
		if err := insertArchived(ctx, tx, topic, ds, now); err != nil {
			return 0, err
		}
		ids := make([]uint64, len(ds))
		events := make([]Event, len(ds))
		for i, d := range ds {
			ids[i] = d.MessageID
			events[i] = Event{ID: s.ids.Next(), At: now, MessageID: d.MessageID, VShard: d.VShard, Subscription: sub,
				Type: EventArchived, Attempt: d.Attempts, ErrorCode: d.ErrorCode}
		}
		if err := deleteDeliveries(ctx, tx, sub, ids); err != nil {
			return 0, err
		}
		return len(ds), insertEvents(ctx, tx, events)
	})
}

// DropSubscription deletes every delivery of a deleted subscription in
// batches, each traced dropped (error code subscription_deleted, saying
// whether it was ready, in flight or dead); a message left with no delivery
// is consumed in the documented sense — nothing waits for it any more —
// and its trace says why. It returns how many deliveries went.
func (s *Store) DropSubscription(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.inBatches(ctx, "drop_subscription", redriveBatch, 0, func(tx *sql.Tx) (int, error) {
		ds, err := lockSubscriptionBatch(ctx, tx, topic, sub, redriveBatch)
		if err != nil || len(ds) == 0 {
			return 0, err
		}
		ids := make([]uint64, len(ds))
		events := make([]Event, len(ds))
		for i, d := range ds {
			ids[i] = d.messageID
			state := "pending (never claimed)"
			switch {
			case d.dead:
				state = "a dead letter"
			case d.leased:
				state = "leased (in flight or its lease lapsed)"
			case d.attempts > 0:
				state = "waiting for a retry"
			}
			events[i] = Event{ID: s.ids.Next(), At: now, MessageID: d.messageID, VShard: d.vshard, Subscription: sub,
				Type: EventDropped, Attempt: d.attempts, ErrorCode: DroppedSubscriptionDeleted,
				Error: "subscription deleted while its delivery was " + state + "; never delivered to it again"}
		}
		if err := deleteDeliveries(ctx, tx, sub, ids); err != nil {
			return 0, err
		}
		if err := insertEvents(ctx, tx, events); err != nil {
			return 0, err
		}
		return len(ds), markConsumed(ctx, tx, ids, now)
	})
}

// DroppedSubscriptionDeleted is the error code of a dropped event.
const DroppedSubscriptionDeleted = "subscription_deleted"

// Unpark releases every parked delivery of a subscription that is no
// longer ordered.
func (s *Store) Unpark(ctx context.Context, topic, sub string, now time.Time) (int64, error) {
	return s.inBatches(ctx, "unpark", unparkBatch, 0, func(tx *sql.Tx) (int, error) {
		n, err := unparkAll(ctx, tx, topic, sub, now, unparkBatch)
		return int(n), err
	})
}

// unparkBatch is how many parked deliveries one unpark statement releases.
const unparkBatch = 1000

// Stats counts every subscription's deliveries on this cluster by state.
func (s *Store) Stats(ctx context.Context, now time.Time) ([]QueueStats, error) {
	st, err := queueStats(ctx, s.db, now)
	return st, translate(err)
}
