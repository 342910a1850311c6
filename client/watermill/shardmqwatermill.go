// Package shardmqwatermill is a Watermill Pub/Sub over shardmq: a
// message.Publisher and a message.Subscriber built on the Go client
// (github.com/shardmq/shardmq/client). It lives in a Go module of its own,
// so that the router's module does not depend on Watermill.
//
// What it maps:
//
//   - A Watermill message's UUID is the shardmq message key: publishing
//     the same UUID twice stores it once (the router deduplicates), which
//     makes retried publishes safe. Metadata are the headers; the payload
//     travels as bytes (payload_base64).
//   - A Watermill consumer group is a shardmq subscription
//     (SubscriberConfig.Subscription): every subscription gets every
//     message produced after it exists; subscribers of one subscription
//     share its messages.
//   - Ack acks the delivery; Nack hands it back at once (nack with
//     retry_after_ms NackRetryAfter, 0 by default), counting an attempt
//     of the subscription's max_attempts, after which it is a dead letter.
//   - Each Subscribe hands out one message at a time and waits for its
//     Ack or Nack, extending the leases of the messages it holds.
//   - Messages are persistent (committed on the primary, or replicated
//     with ProducerConfig.Durability). Order is guaranteed only on an
//     ordered subscription, per order key: with SubscriberConfig.Ordered
//     and PublisherConfig.OrderKey.
package shardmqwatermill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/shardmq/shardmq/client"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Producer tunes batching, retries and durability.
	Producer client.ProducerConfig
	// OrderKey, when set, gives each message its order key (all messages
	// of one key are delivered in publish order on an ordered
	// subscription, one at a time). Nil publishes without order keys.
	OrderKey func(topic string, msg *message.Message) string
}

// Publisher publishes Watermill messages to shardmq.
type Publisher struct {
	p   *client.Producer
	cfg PublisherConfig
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher makes a publisher over c.
func NewPublisher(c *client.Client, cfg PublisherConfig) (*Publisher, error) {
	p, err := c.NewProducer(cfg.Producer)
	if err != nil {
		return nil, err
	}
	return &Publisher{p: p, cfg: cfg}, nil
}

// Publish sends msgs to topic and returns once every one is stored
// (created, or a duplicate of its UUID), or with the first error.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	out := make([]client.Message, len(msgs))
	for i, m := range msgs {
		cm := client.Message{Key: m.UUID, PayloadBytes: m.Payload, Headers: map[string]string(m.Metadata)}
		if cm.PayloadBytes == nil {
			cm.PayloadBytes = []byte{}
		}
		if p.cfg.OrderKey != nil {
			cm.OrderKey = p.cfg.OrderKey(topic, m)
		}
		out[i] = cm
	}
	ctx := context.Background()
	if len(msgs) == 1 {
		_, err := p.p.Send(ctx, topic, out[0])
		return err
	}
	// Messages of one call keep their order: one order key's messages are
	// sent one after the other.
	if p.cfg.OrderKey != nil {
		for _, m := range out {
			if _, err := p.p.Send(ctx, topic, m); err != nil {
				return err
			}
		}
		return nil
	}
	var errs []error
	for _, r := range p.p.SendMany(ctx, topic, out) {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errors.Join(errs...)
}

// Close sends what is queued and stops the producer.
func (p *Publisher) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.p.Close(ctx)
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Subscription is the consumer group. Defaults to "watermill".
	Subscription string
	// Settings are what SubscribeInitialize (or Subscribe, for a
	// subscription that does not exist yet) creates it with.
	Settings client.Subscription
	// Batch caps the deliveries one claim leases. Defaults to 10.
	Batch int
	// Visibility is the lease. Defaults to 30s; held messages are
	// extended every Visibility/3.
	Visibility time.Duration
	// Wait is each claim's long poll. Defaults to 1s.
	Wait time.Duration
	// NackRetryAfter is when a nacked message comes back. Defaults to 0:
	// at once.
	NackRetryAfter time.Duration
	// Consumer names the subscriber in the trace.
	Consumer string
}

// Subscriber consumes shardmq subscriptions as Watermill subscriptions.
type Subscriber struct {
	c   *client.Client
	cfg SubscriberConfig

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    sync.WaitGroup
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber makes a subscriber over c.
func NewSubscriber(c *client.Client, cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Subscription == "" {
		cfg.Subscription = "watermill"
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10
	}
	if cfg.Visibility <= 0 {
		cfg.Visibility = 30 * time.Second
	}
	if cfg.Wait <= 0 {
		cfg.Wait = time.Second
	}
	return &Subscriber{c: c, cfg: cfg, closing: make(chan struct{})}, nil
}

// SubscribeInitialize creates the subscription on topic (admin scope) if
// it does not exist, so that it receives the messages published from now
// on.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.c.GetSubscription(ctx, topic, s.cfg.Subscription)
	if err == nil {
		return nil
	}
	if !errors.Is(err, client.ErrNotFound) && !errors.Is(err, client.ErrUnknownSubscription) {
		return err
	}
	return s.c.PutSubscription(ctx, topic, s.cfg.Subscription, s.cfg.Settings)
}

// Subscribe returns a channel of topic's messages on the subscription.
// The channel is closed when ctx ends or Close is called; messages held
// then are handed back to shardmq at once.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("shardmqwatermill: subscriber closed")
	}
	if err := s.SubscribeInitialize(topic); err != nil {
		return nil, fmt.Errorf("shardmqwatermill: subscribe to %s: %w", topic, err)
	}
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(ctx)
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		defer cancel()
		select {
		case <-s.closing:
		case <-ctx.Done():
		}
	}()
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		defer close(out)
		(&loop{s: s, topic: topic, out: out, held: map[string]bool{}}).run(ctx)
	}()
	return out, nil
}

// Close ends every subscription's channel and waits for them. Safe to
// call twice.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.closing)
	}
	s.mu.Unlock()
	s.subs.Wait()
	return nil
}

// loop is one Subscribe.
type loop struct {
	s     *Subscriber
	topic string
	out   chan<- *message.Message

	mu   sync.Mutex
	held map[string]bool // receipts leased and not yet settled
}

func (l *loop) run(ctx context.Context) {
	cfg := l.s.cfg
	stopExtend := make(chan struct{})
	extendDone := make(chan struct{})
	go l.extend(stopExtend, extendDone)
	defer func() {
		close(stopExtend)
		<-extendDone
		l.releaseHeld()
	}()
	failures := 0
	for ctx.Err() == nil {
		ds, err := l.s.c.Claim(ctx, client.ClaimRequest{Topic: l.topic, Subscription: cfg.Subscription, Max: cfg.Batch,
			Visibility: cfg.Visibility, Wait: cfg.Wait, Consumer: cfg.Consumer})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			t := time.NewTimer(min(time.Duration(failures)*100*time.Millisecond, 5*time.Second))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		failures = 0
		l.mu.Lock()
		for _, d := range ds {
			l.held[d.Receipt] = true
		}
		l.mu.Unlock()
		for _, d := range ds {
			if !l.handOut(ctx, d) {
				return
			}
		}
	}
}

// handOut gives one delivery to the channel and settles it by the
// message's Ack or Nack. It answers false when the subscription ends.
func (l *loop) handOut(ctx context.Context, d *client.Delivery) bool {
	msg := message.NewMessage(d.Key, d.Body())
	for k, v := range d.Headers {
		msg.Metadata.Set(k, v)
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msg.SetContext(mctx)
	select {
	case l.out <- msg:
	case <-ctx.Done():
		return false
	}
	settle, cancelSettle := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelSettle()
	select {
	case <-msg.Acked():
		l.settled(d)
		// An ack that fails leaves the lease to lapse: the message comes
		// again (at-least-once).
		_ = d.Ack(settle)
	case <-msg.Nacked():
		l.settled(d)
		ra := l.s.cfg.NackRetryAfter
		_, _ = d.Nack(settle, "E_NACK", "nacked by the Watermill handler", &ra)
	case <-ctx.Done():
		return false
	}
	return true
}

func (l *loop) settled(d *client.Delivery) {
	l.mu.Lock()
	delete(l.held, d.Receipt)
	l.mu.Unlock()
}

// releaseHeld hands back what the subscription still holds, at once.
func (l *loop) releaseHeld() {
	l.mu.Lock()
	items := make([]client.NackItem, 0, len(l.held))
	zero := int64(0)
	for rc := range l.held {
		items = append(items, client.NackItem{Receipt: rc, ErrorCode: client.ReleaseErrorCode, Error: "subscriber closed", RetryAfterMS: &zero})
	}
	l.held = map[string]bool{}
	l.mu.Unlock()
	if len(items) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = l.s.c.Nack(ctx, items...)
}

func (l *loop) extend(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(l.s.cfg.Visibility / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		rcs := make([]string, 0, len(l.held))
		for rc := range l.held {
			rcs = append(rcs, rc)
		}
		l.mu.Unlock()
		if len(rcs) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.s.cfg.Visibility/3)
		_, _ = l.s.c.Extend(ctx, l.s.cfg.Visibility, rcs...)
		cancel()
	}
}
