package client

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Produce sends msgs to topic in one request, as they are: no batching
// with other calls and no retry (Producer does both). It answers one
// Result per message, in order; an item the router could not serve has
// status unavailable. An error means the request as a whole failed: its
// outcome is unknown unless the error is an *Error with a 4xx status.
func (c *Client) Produce(ctx context.Context, topic string, durability string, msgs []Message) ([]Result, error) {
	res, _, err := c.produce(ctx, topic, durability, msgs)
	return res, err
}

func (c *Client) produce(ctx context.Context, topic, durability string, msgs []Message) ([]Result, time.Duration, error) {
	var out produceResponse
	if err := c.do(ctx, http.MethodPost, topicPath(topic)+"/messages", produceRequest{Messages: msgs, Durability: durability}, 0, &out); err != nil {
		return nil, 0, err
	}
	if len(out.Results) != len(msgs) {
		return nil, 0, fmt.Errorf("produce to %s: %d results for %d messages", topic, len(out.Results), len(msgs))
	}
	return out.Results, out.retryAfter, nil
}

// Claim leases up to req.Max deliveries, waiting up to req.Wait when none
// is ready; an empty answer after the wait is no error.
func (c *Client) Claim(ctx context.Context, req ClaimRequest) ([]*Delivery, error) {
	body := claimBody{Max: req.Max, VisibilityMS: req.Visibility.Milliseconds(), WaitMS: req.Wait.Milliseconds(), Consumer: req.Consumer}
	var out claimResponse
	if err := c.do(ctx, http.MethodPost, subscriptionPath(req.Topic, req.Subscription)+"/claim", body, req.Wait, &out); err != nil {
		return nil, fmt.Errorf("claim from %s/%s: %w", req.Topic, req.Subscription, err)
	}
	for _, d := range out.Messages {
		d.Subscription = req.Subscription
	}
	return out.Messages, nil
}

// Ack completes deliveries: one result per receipt, in order (ok,
// lease_lost, not_found, unavailable).
func (c *Client) Ack(ctx context.Context, receipts ...string) ([]LeaseResult, error) {
	return c.lease(ctx, "/v1/ack", receiptsBody{Receipts: receipts}, len(receipts))
}

// Nack fails deliveries: one result per item, in order (retry_scheduled,
// dead, lease_lost, not_found, unavailable).
func (c *Client) Nack(ctx context.Context, items ...NackItem) ([]LeaseResult, error) {
	return c.lease(ctx, "/v1/nack", nackBody{Items: items}, len(items))
}

// Extend moves the leases' expiry to now + visibility (0: the router's
// default of 30s).
func (c *Client) Extend(ctx context.Context, visibility time.Duration, receipts ...string) ([]LeaseResult, error) {
	return c.lease(ctx, "/v1/extend", receiptsBody{Receipts: receipts, VisibilityMS: visibility.Milliseconds()}, len(receipts))
}

func (c *Client) lease(ctx context.Context, path string, body any, n int) ([]LeaseResult, error) {
	var out leaseResponse
	if err := c.do(ctx, http.MethodPost, path, body, 0, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out.Results) != n {
		return nil, fmt.Errorf("%s: %d results for %d items", path, len(out.Results), n)
	}
	return out.Results, nil
}

// PutSubscription creates or replaces a subscription (admin scope on the
// topic). A subscription receives the messages produced after it exists.
func (c *Client) PutSubscription(ctx context.Context, topic, sub string, s Subscription) error {
	if err := c.do(ctx, http.MethodPut, subscriptionPath(topic, sub), s, 0, nil); err != nil {
		return fmt.Errorf("put subscription %s/%s: %w", topic, sub, err)
	}
	return nil
}
