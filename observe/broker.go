package observe

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
)

// Broker is the broker as the API sees it, counting what each call
// answered into Messages: produce statuses, claims, acks, nacks and the
// per-receipt outcomes. Deleting a subscription removes its series. The
// metrics thus wrap the broker rather than live inside it.
type Broker struct {
	*broker.Broker
	m *Messages
}

// WrapBroker returns b counting into m.
func WrapBroker(b *broker.Broker, m *Messages) *Broker { return &Broker{Broker: b, m: m} }

// Produce counts each item's status.
func (b *Broker) Produce(ctx context.Context, topic string, msgs []broker.Message, dur broker.Durability) ([]broker.ProduceResult, error) {
	res, err := b.Broker.Produce(ctx, topic, msgs, dur)
	if err != nil {
		b.m.Produced(topic, domain.ProduceUnavailable.String(), len(msgs))
		return res, err
	}
	var created, dup, conflict, unknown, unavailable int
	for _, r := range res {
		switch r.Status {
		case domain.ProduceCreated:
			created++
		case domain.ProduceDuplicate:
			dup++
		case domain.ProduceConflict:
			conflict++
		case domain.ProduceUnknown:
			unknown++
		default:
			unavailable++
		}
	}
	b.m.Produced(topic, domain.ProduceCreated.String(), created)
	b.m.Produced(topic, domain.ProduceDuplicate.String(), dup)
	b.m.Produced(topic, domain.ProduceConflict.String(), conflict)
	b.m.Produced(topic, domain.ProduceUnknown.String(), unknown)
	b.m.Produced(topic, domain.ProduceUnavailable.String(), unavailable)
	return res, nil
}

// Claim counts the deliveries leased (the dead-letter channel's are not
// claims of the subscription).
func (b *Broker) Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Delivery, error) {
	got, err := b.Broker.Claim(ctx, req)
	if !req.Dead {
		b.m.Claimed(req.Topic, req.Subscription, len(got))
	}
	return got, err
}

// Ack counts acknowledged deliveries and each receipt's outcome.
func (b *Broker) Ack(ctx context.Context, receipts []broker.Receipt) []broker.LeaseResult {
	res := b.Broker.Ack(ctx, receipts)
	for i, r := range res {
		b.m.Result("ack", r.Status.String())
		if r.Status == domain.LeaseOK {
			b.m.Acked(receipts[i].Topic, receipts[i].Subscription, 1)
		}
	}
	return res
}

// Nack counts failed deliveries and each receipt's outcome; dead letters
// are counted by the store, which also sees lapsed leases die.
func (b *Broker) Nack(ctx context.Context, items []broker.NackItem) []broker.NackResult {
	res := b.Broker.Nack(ctx, items)
	for i, r := range res {
		b.m.Result("nack", r.Status.String())
		if r.Status == domain.NackRetryScheduled || r.Status == domain.NackDead {
			b.m.Nacked(items[i].Receipt.Topic, items[i].Receipt.Subscription, 1)
		}
	}
	return res
}

// Extend counts each receipt's outcome.
func (b *Broker) Extend(ctx context.Context, receipts []broker.Receipt, lease time.Duration) []broker.LeaseResult {
	res := b.Broker.Extend(ctx, receipts, lease)
	for _, r := range res {
		b.m.Result("extend", r.Status.String())
	}
	return res
}

// DeleteSubscription removes the subscription's series once it is gone.
func (b *Broker) DeleteSubscription(ctx context.Context, topic, name string) error {
	err := b.Broker.DeleteSubscription(ctx, topic, name)
	if err == nil {
		b.m.Forget(topic, name)
	}
	return err
}
