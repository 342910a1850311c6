package client

import (
	"encoding/json"
	"sync/atomic"
	"time"
)

// Message is one message to produce (DESIGN §5, produce).
type Message struct {
	// Key identifies the message for deduplication: the same key on the
	// same topic is stored once. Give every message a key that names the
	// business fact ("order-42-paid"); without one the router derives a
	// fingerprint from topic, transaction id and payload.
	Key string `json:"key,omitempty"`
	// Payload is JSON, sent as is. Set it or PayloadBytes, not both.
	Payload json.RawMessage `json:"payload,omitempty"`
	// PayloadBytes is any bytes, sent as payload_base64.
	PayloadBytes []byte            `json:"payload_base64,omitempty"`
	Headers      map[string]string `json:"headers,omitempty"`
	// Priority 0-9, higher first; nil for the default 0.
	Priority *int `json:"priority,omitempty"`
	// DelayMS hides the message's deliveries for that long.
	DelayMS int64 `json:"delay_ms,omitempty"`
	// DeliverAt hides them until then (RFC 3339); zero for now.
	DeliverAt string `json:"deliver_at,omitempty"`
	// OrderKey places the message and orders it on ordered subscriptions.
	// A retry must carry the same OrderKey as the original: it decides the
	// vshard, and so where the key is deduplicated.
	OrderKey      string `json:"order_key,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
}

// Durability levels of a produce.
const (
	// DurabilityPrimary answers after the commit on the cluster's primary
	// (the router's default).
	DurabilityPrimary = "primary"
	// DurabilityReplicated also waits until a replica applied it.
	DurabilityReplicated = "replicated"
)

// Produce statuses.
const (
	StatusCreated     = "created"
	StatusDuplicate   = "duplicate"
	StatusConflict    = "conflict"
	StatusUnavailable = "unavailable"
	// StatusUnknown: the commit's outcome is unknown to the router (the
	// connection broke during COMMIT); a retry with the same key is safe
	// and tells.
	StatusUnknown = "unknown"
	// StatusRejected: the database refused a value; a retry fails the
	// same way.
	StatusRejected = "rejected"
)

// Lease statuses (ack, nack, extend).
const (
	StatusOK             = "ok"
	StatusLeaseLost      = "lease_lost"
	StatusNotFound       = "not_found"
	StatusRetryScheduled = "retry_scheduled"
	StatusDead           = "dead"
)

type produceRequest struct {
	Messages   []Message `json:"messages"`
	Durability string    `json:"durability,omitempty"`
}

// Result is one produced item's answer.
type Result struct {
	Key string `json:"key"`
	// ID is the stored message's id (the original's for a duplicate).
	ID     string `json:"id,omitempty"`
	VShard int    `json:"vshard"`
	// Status is created, duplicate, conflict, unavailable, unknown or
	// rejected.
	Status string     `json:"status"`
	Error  *itemError `json:"error,omitempty"`
}

type itemError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type produceResponse struct {
	Results    []Result `json:"results"`
	retryAfter time.Duration
}

func (r *produceResponse) setRetryAfter(d time.Duration) { r.retryAfter = d }

// ClaimRequest asks for deliveries of one subscription.
type ClaimRequest struct {
	Topic, Subscription string
	// Max deliveries, 1-1000. Defaults to 1.
	Max int
	// Visibility is the lease. Defaults to the router's 30s.
	Visibility time.Duration
	// Wait long-polls up to this long (at most 20s) when nothing is ready.
	Wait time.Duration
	// Consumer names the claimer in the trace.
	Consumer string
}

type claimBody struct {
	Max          int    `json:"max,omitempty"`
	VisibilityMS int64  `json:"visibility_timeout_ms,omitempty"`
	WaitMS       int64  `json:"wait_ms"`
	Consumer     string `json:"consumer,omitempty"`
}

// Delivery is one leased message.
type Delivery struct {
	ID            string            `json:"id"`
	Key           string            `json:"key"`
	Topic         string            `json:"topic"`
	VShard        int               `json:"vshard"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 []byte            `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Priority      int               `json:"priority"`
	OrderKey      string            `json:"order_key"`
	TransactionID string            `json:"transaction_id"`
	ProducedAt    time.Time         `json:"produced_at"`
	// Attempt counts this delivery's claims, 1 for the first.
	Attempt int `json:"attempt"`
	// Receipt names the lease; only its holder can ack, nack or extend.
	Receipt      string    `json:"receipt"`
	LeaseExpires time.Time `json:"lease_expires_at"`

	// Subscription is the subscription it was claimed from (not on the
	// wire; set by Claim).
	Subscription string `json:"-"`

	c       *Client
	settled atomic.Bool
}

// Body is the payload's bytes: the JSON text, or the decoded base64.
func (d *Delivery) Body() []byte {
	if d.PayloadBase64 != nil {
		return d.PayloadBase64
	}
	return d.Payload
}

type claimResponse struct {
	Messages []*Delivery `json:"messages"`
}

// NackItem fails one delivery.
type NackItem struct {
	Receipt string `json:"receipt"`
	// ErrorCode is kept on the delivery and on its dead letter (64 bytes
	// at most), e.g. "E_STOCK".
	ErrorCode string `json:"error_code,omitempty"`
	Error     string `json:"error,omitempty"`
	// RetryAfterMS schedules the next attempt; nil for the
	// subscription's backoff, 0 for at once.
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
}

type nackBody struct {
	Items []NackItem `json:"items"`
}

type receiptsBody struct {
	Receipts     []string `json:"receipts"`
	VisibilityMS int64    `json:"visibility_timeout_ms,omitempty"`
}

// LeaseResult is one receipt's answer to ack, nack or extend.
type LeaseResult struct {
	Receipt string `json:"receipt"`
	// Status: ok, lease_lost, not_found (ack, extend); retry_scheduled,
	// dead, lease_lost, not_found (nack); unavailable (any).
	Status         string     `json:"status"`
	LeaseExpiresAt string     `json:"lease_expires_at,omitempty"`
	NextAttemptAt  string     `json:"next_attempt_at,omitempty"`
	Error          *itemError `json:"error,omitempty"`
}

// Err is the result as an error: nil for ok, retry_scheduled and dead.
func (r LeaseResult) Err() error {
	switch r.Status {
	case StatusOK, StatusRetryScheduled, StatusDead:
		return nil
	case StatusLeaseLost:
		return ErrLeaseLost
	case StatusNotFound:
		return ErrReceiptNotFound
	}
	e := &Error{Code: r.Status}
	if r.Error != nil {
		e.Code, e.Message = r.Error.Code, r.Error.Message
	}
	return e
}

type leaseResponse struct {
	Results []LeaseResult `json:"results"`
}

// Subscription is a subscription's settings (PUT needs admin scope).
type Subscription struct {
	MaxAttempts int      `json:"max_attempts,omitempty"`
	Backoff     *Backoff `json:"backoff,omitempty"`
	Ordered     bool     `json:"ordered"`
}

// Backoff is a subscription's retry schedule.
type Backoff struct {
	InitialMS  int64   `json:"initial_ms,omitempty"`
	MaxMS      int64   `json:"max_ms,omitempty"`
	Multiplier float64 `json:"multiplier,omitempty"`
	Jitter     float64 `json:"jitter,omitempty"`
}
