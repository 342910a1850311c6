package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/shardmq/shardmq/domain"
)

// DeliveryInfo is one subscription's state of a message.
type DeliveryInfo struct {
	Subscription string
	State        domain.DeliveryState
	Attempts     int
	Consumer     string // the lease holder (in flight) or the acking consumer (done)
	ErrorCode    string
	LastError    string
	// NextAttemptAt is when a ready delivery may be claimed (a delay or a
	// retry's backoff); zero otherwise.
	NextAttemptAt time.Time
	// LeaseExpires is when an in-flight lease runs out; zero otherwise.
	LeaseExpires time.Time
	// DoneAt is when a done delivery was acked or a dead one died.
	DoneAt time.Time
}

// MessageTrace is everything known of one message: the message with its
// status, each subscription's delivery, and its history in time order. The
// history merges the trace rows with what the other tables imply: the
// produced event (message_store's creation time), the claim before each
// event that carries its lease's claim time (the ack) and the current lease.
type MessageTrace struct {
	Message    *Message
	Deliveries []DeliveryInfo
	Events     []Event
}

// Trace reads the trace of (topic, key) in one consistent snapshot (a
// read-only REPEATABLE READ transaction), so that a replica applying
// transactions meanwhile never shows half of one. ErrNotFound when the key
// or its message is not on this server (yet). now decides whether a lease
// is still in flight.
func (s *Store) Trace(ctx context.Context, topic, key string, now time.Time) (*MessageTrace, error) {
	var out *MessageTrace
	err := s.readTx(ctx, func(tx *sql.Tx) error {
		id, err := selectKeyID(ctx, tx, topic, key)
		if err != nil {
			return err
		}
		msgs, err := selectMessages(ctx, tx, []uint64{id})
		if err != nil {
			return err
		}
		m, ok := msgs[id]
		if !ok {
			return ErrNotFound
		}
		dels, err := deliveriesOf(ctx, tx, []uint64{id}, false)
		if err != nil {
			return err
		}
		evs, err := eventsOf(ctx, tx, []uint64{id})
		if err != nil {
			return err
		}
		out = buildTrace(m, dels, evs, now)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("trace %s/%s: %w", topic, key, err)
	}
	return out, nil
}

// readTx runs fn in a read-only snapshot transaction.
func (s *Store) readTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return translate(err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		if errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) {
			return err // ours already
		}
		return translate(err)
	}
	return translate(tx.Commit())
}

func buildTrace(m *Message, dels []deliveryRow, evs []Event, now time.Time) *MessageTrace {
	t := &MessageTrace{Message: m}
	t.Events = append(t.Events, Event{At: m.CreatedAt, MessageID: m.ID, VShard: m.VShard, Type: EventProduced})
	live := map[string]bool{}
	for _, d := range dels {
		live[d.subscription] = true
		info := DeliveryInfo{Subscription: d.subscription, Attempts: d.attempts, ErrorCode: d.errorCode, LastError: d.lastError}
		leased := d.lockedBy != "" && d.claimToken != 0
		switch {
		case d.isDead:
			info.State, info.DoneAt = domain.DeliveryDead, d.deadAt
		case leased && d.availableAt.After(now):
			info.State, info.Consumer, info.LeaseExpires = domain.DeliveryInFlight, d.lockedBy, d.availableAt
		default:
			info.State, info.NextAttemptAt = domain.DeliveryReady, d.availableAt
		}
		t.Deliveries = append(t.Deliveries, info)
		if leased && !d.claimedAt.IsZero() {
			// The current (or lapsed, not yet traced) lease's claim.
			t.Events = append(t.Events, Event{At: d.claimedAt, MessageID: m.ID, VShard: m.VShard, Subscription: d.subscription,
				Type: EventClaimed, Consumer: d.lockedBy, Attempt: d.attempts})
		}
	}
	// Subscriptions with no delivery row are done (acked) or dead letters
	// that left the table; the last terminal event says which.
	gone := map[string]*DeliveryInfo{}
	var order []string
	for _, e := range evs {
		t.Events = append(t.Events, e)
		if !e.ClaimedAt.IsZero() {
			// An event that ends a lease (the ack) carries its claim.
			t.Events = append(t.Events, Event{At: e.ClaimedAt, MessageID: m.ID, VShard: m.VShard, Subscription: e.Subscription,
				Type: EventClaimed, Consumer: e.Consumer, Attempt: e.Attempt})
		}
		if e.Subscription == "" || live[e.Subscription] {
			continue
		}
		info, ok := gone[e.Subscription]
		if !ok {
			info = &DeliveryInfo{Subscription: e.Subscription}
			gone[e.Subscription] = info
			order = append(order, e.Subscription)
		}
		if e.Attempt > info.Attempts {
			info.Attempts = e.Attempt
		}
		switch e.Type {
		case EventAcked:
			info.State, info.Consumer, info.DoneAt = domain.DeliveryDone, e.Consumer, e.At
		case EventDeadLettered, EventArchived:
			info.State, info.DoneAt, info.ErrorCode, info.LastError = domain.DeliveryDead, e.At, e.ErrorCode, e.Error
		}
	}
	for _, sub := range order {
		if info := gone[sub]; info.State != "" {
			t.Deliveries = append(t.Deliveries, *info)
		}
	}
	sort.Slice(t.Deliveries, func(i, j int) bool { return t.Deliveries[i].Subscription < t.Deliveries[j].Subscription })
	sort.SliceStable(t.Events, func(i, j int) bool {
		a, b := t.Events[i], t.Events[j]
		if !a.At.Equal(b.At) {
			return a.At.Before(b.At)
		}
		return eventRank(a.Type) < eventRank(b.Type)
	})
	return t
}

// eventRank orders events that share a timestamp as they happen.
func eventRank(typ string) int {
	switch typ {
	case EventProduced:
		return 0
	case EventLeaseExpired:
		return 1
	case EventClaimed:
		return 2
	}
	return 3
}

// MessagesByTransaction returns one page of the messages that carry
// transaction id txID on this server: ids above after, oldest first, at
// most limit and at most maxBytes encoded (0: no byte cap; the first is
// returned whatever its size). more says whether any are left after it.
func (s *Store) MessagesByTransaction(ctx context.Context, txID string, after uint64, limit, maxBytes int) ([]*Message, bool, error) {
	msgs, more, err := sizedPage(ctx, s.db, "message_store", txID, after, limit, maxBytes)
	if err != nil {
		return nil, false, fmt.Errorf("look up transaction %q: %w", txID, translate(err))
	}
	return msgs, more, nil
}

// FindTransactions returns how many messages on this server carry each of
// ids; ids with none are absent from the map.
func (s *Store) FindTransactions(ctx context.Context, ids []string) (map[string]int, error) {
	out := map[string]int{}
	const chunk = 500
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		got, err := countTransactions(ctx, s.db, part)
		if err != nil {
			return nil, fmt.Errorf("find transactions: %w", translate(err))
		}
		for id, n := range got {
			out[id] = n
		}
	}
	return out, nil
}
