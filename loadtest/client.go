package loadtest

import (
	"context"
	"errors"
	"strconv"

	"github.com/shardmq/shardmq/client"
)

// ClientTarget is the router reached through the Go client (package
// client): produces go through a client.Producer, which gathers the
// single-message Produce calls of many workers into batched requests, as
// a service using the client would. Everything else (claims, acks,
// subscriptions) is the wrapped target's. The client talks to one router,
// the first of the run's.
type ClientTarget struct {
	Target
	c *client.Client
	p *client.Producer
}

var _ Target = (*ClientTarget)(nil)

// NewClientTarget makes a client over the router at base with token, its
// producer configured by pc; the rest of Target is rest's.
func NewClientTarget(base, token string, pc client.ProducerConfig, rest Target) (*ClientTarget, error) {
	c, err := client.New(client.Config{URL: base, Token: token})
	if err != nil {
		return nil, err
	}
	p, err := c.NewProducer(pc)
	if err != nil {
		return nil, err
	}
	return &ClientTarget{Target: rest, c: c, p: p}, nil
}

// Name implements Target.
func (t *ClientTarget) Name() string { return "client" }

// Close stops the producer (the wrapped target is its owner's to close).
func (t *ClientTarget) Close() {
	t.p.Close(context.Background())
	t.c.Close()
}

// Produce implements Target: each message is one Send (the workers of the
// client scenario send one at a time), answered with its own result.
func (t *ClientTarget) Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error) {
	out := make([]ProduceResult, len(msgs))
	for i, m := range msgs {
		res, err := t.p.Send(ctx, topic, clientMessage(m))
		pr, re := fromClient(res, err)
		if re != nil {
			if i == 0 {
				return nil, re
			}
			// Later items: the earlier ones are answered; this one and the
			// rest are unavailable, to be retried with the same keys.
			for j := i; j < len(msgs); j++ {
				out[j] = ProduceResult{Status: "unavailable", Code: re.Code}
			}
			return out, nil
		}
		out[i] = pr
	}
	return out, nil
}

func clientMessage(m Message) client.Message {
	return client.Message{Key: m.Key, OrderKey: m.OrderKey, Payload: m.Payload}
}

// fromClient turns the client's outcome of one message into the load
// tester's: a result, or the error of a message whose outcome is open
// (to be resent with its key).
func fromClient(res client.Result, err error) (ProduceResult, *RequestError) {
	if err != nil && !errors.Is(err, client.ErrConflict) {
		re := &RequestError{Code: "client", Message: err.Error()}
		var e *client.Error
		if errors.As(err, &e) {
			re.Status, re.Code, re.RetryAfter = e.Status, e.Code, e.RetryAfter
		}
		return ProduceResult{}, re
	}
	pr := ProduceResult{Status: res.Status, VShard: res.VShard}
	pr.ID, _ = strconv.ParseUint(res.ID, 10, 64)
	return pr, nil
}

// AsyncTarget is the router reached through the Go client's asynchronous
// client.Publisher: a phase marked Async publishes through Publisher, one
// Publish call per message. Everything else (claims, acks, the resends of
// messages the publisher gave up on) is the wrapped target's.
type AsyncTarget struct {
	Target
	c *client.Client
	p *client.Publisher
}

var _ Target = (*AsyncTarget)(nil)

// NewAsyncTarget makes a client over the router at base with token, its
// publisher configured by pc; the rest of Target is rest's.
func NewAsyncTarget(base, token string, pc client.PublisherConfig, rest Target) (*AsyncTarget, error) {
	c, err := client.New(client.Config{URL: base, Token: token})
	if err != nil {
		return nil, err
	}
	p, err := c.NewPublisher(pc)
	if err != nil {
		return nil, err
	}
	return &AsyncTarget{Target: rest, c: c, p: p}, nil
}

// Name implements Target.
func (t *AsyncTarget) Name() string { return "client" }

// Publisher is what an async phase publishes through.
func (t *AsyncTarget) Publisher() *client.Publisher { return t.p }

// Close closes the publisher (the wrapped target is its owner's to close).
func (t *AsyncTarget) Close() {
	t.p.Close(context.Background())
	t.c.Close()
}
