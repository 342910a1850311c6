package client

import (
	"context"
	"errors"
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
		d.Subscription, d.c = req.Subscription, c
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

// Ack acks the delivery and marks it settled, so a Consumer running the
// handler that called it does not ack it again. It answers nil, or
// ErrLeaseLost, ErrReceiptNotFound, or the request's error.
func (d *Delivery) Ack(ctx context.Context) error {
	if d.c == nil {
		return errors.New("client: delivery was not claimed through a Client")
	}
	d.settled.Store(true)
	_, err := d.c.AckOne(ctx, d.Receipt)
	return err
}

// Nack fails the delivery with code and message (retryAfter nil: the
// subscription's backoff) and marks it settled. It answers the new status
// (retry_scheduled or dead).
func (d *Delivery) Nack(ctx context.Context, code, message string, retryAfter *time.Duration) (string, error) {
	if d.c == nil {
		return "", errors.New("client: delivery was not claimed through a Client")
	}
	d.settled.Store(true)
	item := NackItem{Receipt: d.Receipt, ErrorCode: code, Error: message}
	if retryAfter != nil {
		ms := retryAfter.Milliseconds()
		item.RetryAfterMS = &ms
	}
	res, err := d.c.Nack(ctx, item)
	if err != nil {
		return "", err
	}
	return res[0].Status, res[0].Err()
}

// Abandon marks the delivery settled without telling the router: its
// lease lapses and the message is delivered again. It is what a crashed
// consumer does; tests use it to play one.
func (d *Delivery) Abandon() { d.settled.Store(true) }

// Settled reports whether Ack, Nack or Abandon was called.
func (d *Delivery) Settled() bool { return d.settled.Load() }

// GetSubscription reads a subscription's settings (consume scope). A
// subscription that does not exist answers an *Error with code
// not_found or unknown_subscription.
func (c *Client) GetSubscription(ctx context.Context, topic, sub string) (Subscription, error) {
	var out Subscription
	if err := c.do(ctx, http.MethodGet, subscriptionPath(topic, sub), nil, 0, &out); err != nil {
		return out, fmt.Errorf("get subscription %s/%s: %w", topic, sub, err)
	}
	return out, nil
}
