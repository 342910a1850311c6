package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/domain"
)

// Kinds of reconciliation findings (see domain).
const (
	FindingStatus          = domain.FindingStatus
	FindingMissingDelivery = domain.FindingMissingDelivery
	FindingOrphanDelivery  = domain.FindingOrphanDelivery
	FindingMissingKey      = domain.FindingMissingKey
	FindingKeyMismatch     = domain.FindingKeyMismatch
)

// ReconcilerConsumer is the consumer named on the events reconciliation
// writes.
const ReconcilerConsumer = "reconciler"

// Finding is one disagreement between the tables.
type Finding = domain.Finding

// SubscriptionsAt lists the subscriptions of topic that existed at at: a
// message produced then must have, for each, a delivery or a terminal
// event.
type SubscriptionsAt func(ctx context.Context, topic string, at time.Time) ([]string, error)

// CheckRange is one page of a reconciliation walk over message_store.
type CheckRange struct {
	Since, Until time.Time // creation time window
	After        uint64    // cursor: ids above this one
	VShards      []uint16  // only these vshards; all when empty
	Limit        int       // messages per page; defaults to 500
}

// terminalEvents are the events that end (or reopen) a subscription's
// delivery when its row is gone.
var terminalEvents = []string{EventAcked, EventDeadLettered, EventArchived, EventRedriven, EventDropped}

// CheckMessages reads one page of messages with their deliveries, terminal
// events and key rows in one snapshot and reports what disagrees. It only
// reads, so it may run on a replica; RepairMessages re-checks findings on
// the primary. next is the cursor of the following page, 0 at the end.
func (s *Store) CheckMessages(ctx context.Context, r CheckRange, subs SubscriptionsAt) (findings []Finding, scanned int, next uint64, err error) {
	if r.Limit <= 0 {
		r.Limit = 500
	}
	err = s.readTx(ctx, func(tx *sql.Tx) error {
		msgs, err := scanMessages(ctx, tx, r.Since, r.Until, r.After, r.VShards, r.Limit)
		if err != nil || len(msgs) == 0 {
			return err
		}
		scanned = len(msgs)
		if len(msgs) == r.Limit {
			next = msgs[len(msgs)-1].ID
		}
		ids := make([]uint64, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		dels, err := deliveriesOf(ctx, tx, ids, false)
		if err != nil {
			return err
		}
		evs, err := eventsOf(ctx, tx, ids, terminalEvents...)
		if err != nil {
			return err
		}
		holders, err := selectKeyHolders(ctx, tx, msgs)
		if err != nil {
			return err
		}
		byMsgD, byMsgE := groupDeliveries(dels), groupEvents(evs)
		for _, m := range msgs {
			f, err := judgeMessage(ctx, m, byMsgD[m.ID], byMsgE[m.ID], subs)
			if err != nil {
				return err
			}
			findings = append(findings, f...)
			switch holder, ok := holders[[2]string{m.Topic, m.Key}]; {
			case !ok:
				findings = append(findings, Finding{Kind: FindingMissingKey, MessageID: m.ID, VShard: m.VShard, Topic: m.Topic, Key: m.Key})
			case holder != m.ID:
				findings = append(findings, Finding{Kind: FindingKeyMismatch, MessageID: m.ID, VShard: m.VShard, Topic: m.Topic, Key: m.Key,
					Have: fmt.Sprint(holder), Want: fmt.Sprint(m.ID)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("check messages after %d: %w", r.After, err)
	}
	return findings, scanned, next, nil
}

// RepairMessages re-checks messages ids on this server, which must be the
// primary, with their deliveries and rows locked (deliveries first, then
// the message, the order of ack and claim), and repairs what can be
// derived: the status, and deliveries that vanished. A message that changed
// meanwhile is judged as it is now. It returns what it found, each marked
// repaired when it was.
func (s *Store) RepairMessages(ctx context.Context, ids []uint64, subs SubscriptionsAt, now time.Time) ([]Finding, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var out []Finding
	err := s.inTx(ctx, txAttempts, s.retryHook("reconcile"), func(tx *sql.Tx) error {
		out = out[:0]
		dels, err := deliveriesOf(ctx, tx, ids, true)
		if err != nil {
			return err
		}
		msgs, err := lockMessages(ctx, tx, ids)
		if err != nil {
			return err
		}
		evs, err := eventsOf(ctx, tx, ids, terminalEvents...)
		if err != nil {
			return err
		}
		byMsgD, byMsgE := groupDeliveries(dels), groupEvents(evs)
		var restore []delivery
		var events []Event
		for _, id := range ids {
			m, ok := msgs[id]
			if !ok {
				continue
			}
			found, err := judgeMessage(ctx, m, byMsgD[id], byMsgE[id], subs)
			if err != nil {
				return err
			}
			for _, f := range found {
				switch f.Kind {
				case FindingMissingDelivery:
					d := delivery{messageID: m.ID, subscription: f.Subscription, topic: m.Topic, vshard: m.VShard, priority: m.Priority, orderKey: m.OrderKey}
					restore = append(restore, d)
					events = append(events, s.event(now, d, EventRedriven, ReconcilerConsumer, 0, "reconciled", "delivery re-created by reconciliation"))
					f.Repaired = true
				case FindingStatus:
					ok, err := setStatus(ctx, tx, m, m.Status, domain.MessageStatus(f.Want), now)
					if err != nil {
						return err
					}
					f.Repaired = ok
				}
				out = append(out, f)
			}
		}
		if len(restore) > 0 {
			if _, err := restoreDeliveries(ctx, tx, restore, now); err != nil {
				return err
			}
		}
		return insertEvents(ctx, tx, events)
	})
	if err != nil {
		return nil, fmt.Errorf("repair %d messages: %w", len(ids), err)
	}
	return out, nil
}

// OrphanCursor pages OrphanDeliveries.
type OrphanCursor struct {
	MessageID    uint64
	Subscription string
}

// OrphanDeliveries reports up to limit deliveries, after cursor, whose
// message is not in message_store; next is zero at the end.
func (s *Store) OrphanDeliveries(ctx context.Context, after OrphanCursor, vshards []uint16, limit int) (found []Finding, next OrphanCursor, err error) {
	if limit <= 0 {
		limit = 500
	}
	rows, err := orphanDeliveries(ctx, s.db, after.MessageID, after.Subscription, vshards, limit)
	if err != nil {
		return nil, OrphanCursor{}, fmt.Errorf("find orphan deliveries: %w", translate(err))
	}
	for _, d := range rows {
		found = append(found, Finding{Kind: FindingOrphanDelivery, MessageID: d.messageID, VShard: d.vshard, Topic: d.topic, Subscription: d.subscription})
	}
	if len(rows) == limit {
		last := rows[len(rows)-1]
		next = OrphanCursor{MessageID: last.messageID, Subscription: last.subscription}
	}
	return found, next, nil
}

func groupDeliveries(ds []deliveryRow) map[uint64][]deliveryRow {
	out := map[uint64][]deliveryRow{}
	for _, d := range ds {
		out[d.messageID] = append(out[d.messageID], d)
	}
	return out
}

func groupEvents(evs []Event) map[uint64][]Event {
	out := map[uint64][]Event{}
	for _, e := range evs {
		out[e.MessageID] = append(out[e.MessageID], e)
	}
	return out
}

// judgeMessage derives what a message's status and deliveries should be
// from its delivery rows and its terminal events (in time order), and
// reports where they disagree. Per subscription: a row is live or dead; with
// no row, the last terminal event says done (acked, or dropped with its
// deleted subscription), dead (dead-lettered or
// archived) or nothing (redriven, or no event), which for a subscription
// that existed at production means the delivery is missing. The status is
// dead when any subscription is dead, pending while any is live or
// missing, else consumed — the rule the ack and nack paths keep.
func judgeMessage(ctx context.Context, m *Message, dels []deliveryRow, evs []Event, subs SubscriptionsAt) ([]Finding, error) {
	expected, err := subs(ctx, m.Topic, m.CreatedAt)
	if err != nil {
		return nil, fmt.Errorf("subscriptions of %s at %s: %w", m.Topic, m.CreatedAt.Format(time.RFC3339), err)
	}
	type state int
	const (
		live state = iota + 1
		dead
		done
		missing
	)
	states := map[string]state{}
	for _, d := range dels {
		states[d.subscription] = live
		if d.isDead {
			states[d.subscription] = dead
		}
	}
	last := map[string]string{}
	for _, e := range evs {
		if e.Subscription != "" {
			last[e.Subscription] = e.Type
		}
	}
	for sub, typ := range last {
		if _, ok := states[sub]; ok {
			continue
		}
		switch typ {
		case EventAcked, EventDropped:
			states[sub] = done
		case EventDeadLettered, EventArchived:
			states[sub] = dead
		}
	}
	var out []Finding
	for _, sub := range expected {
		if _, ok := states[sub]; !ok {
			states[sub] = missing
			out = append(out, Finding{Kind: FindingMissingDelivery, MessageID: m.ID, VShard: m.VShard, Topic: m.Topic, Key: m.Key, Subscription: sub})
		}
	}
	if len(states) == 0 {
		return out, nil // nothing to judge by
	}
	want := StatusConsumed
	for _, st := range states {
		switch {
		case st == dead:
			want = StatusDead
		case (st == live || st == missing) && want != StatusDead:
			want = StatusPending
		}
	}
	if want != m.Status {
		out = append(out, Finding{Kind: FindingStatus, MessageID: m.ID, VShard: m.VShard, Topic: m.Topic, Key: m.Key,
			Have: string(m.Status), Want: string(want)})
	}
	return out, nil
}
