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
		cm := client.Message{Key: m.Key, OrderKey: m.OrderKey, Payload: m.Payload}
		res, err := t.p.Send(ctx, topic, cm)
		if err != nil && !errors.Is(err, client.ErrConflict) {
			var e *client.Error
			re := &RequestError{Code: "client", Message: err.Error()}
			if errors.As(err, &e) {
				re.Status, re.Code, re.RetryAfter = e.Status, e.Code, e.RetryAfter
			}
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
		out[i] = ProduceResult{Status: res.Status, VShard: res.VShard}
		out[i].ID, _ = strconv.ParseUint(res.ID, 10, 64)
	}
	return out, nil
}
