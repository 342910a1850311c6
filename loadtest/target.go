package loadtest

import (
	"context"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/store"
)

// Target is what a phase sends its work to: the router over HTTP
// (Router), or the same logical work straight into MySQL (Direct, the
// baseline). Both answer per item, in request order, with the API's
// status names, so the workers and the Verifier do not care which it is.
type Target interface {
	// Name is "router" or "baseline".
	Name() string
	// Produce stores msgs on topic. An error means the whole request
	// failed and its outcome is unknown (the items may or may not be
	// stored): the caller retries them with the same keys.
	Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error)
	// Claim leases up to req.Max deliveries, long-polling up to req.Wait.
	Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error)
	// Ack completes deliveries: one status per receipt (ok, lease_lost,
	// not_found, unavailable).
	Ack(ctx context.Context, receipts []Receipt) ([]string, error)
	// Nack fails deliveries: one status per item (retry_scheduled, dead,
	// lease_lost, not_found, unavailable).
	Nack(ctx context.Context, items []NackItem) ([]string, error)
	// Subscribe creates the subscriptions subs of topic, each with
	// maxAttempts, before anything is produced to it.
	Subscribe(ctx context.Context, topic string, subs []string, maxAttempts int) error
}

// Message is one message to produce.
type Message struct {
	ID       keyID
	Key      string
	OrderKey string
	Payload  []byte // compact JSON
	// Repeat marks a deliberate repeat of an earlier key (the dedup
	// share): its answer should be duplicate.
	Repeat bool
	// Retry marks a resend after an unknown outcome: duplicate then means
	// the first attempt was stored.
	Retry bool
	topic int
}

// ProduceResult is one produced item's outcome.
type ProduceResult struct {
	Status string // created | duplicate | conflict | unavailable
	ID     uint64
	VShard int
	Code   string // the item's error code when unavailable
}

// ClaimRequest asks for deliveries of one subscription.
type ClaimRequest struct {
	Topic, Subscription, Consumer string
	Max                           int
	Lease, Wait                   time.Duration
}

// Delivery is one leased message.
type Delivery struct {
	Key        string
	ID         uint64
	VShard     int
	Attempt    int
	ProducedAt time.Time
	Payload    []byte
	Receipt    Receipt
}

// Receipt names a lease: the router's opaque text, or for the baseline the
// store's lease and vshard.
type Receipt struct {
	text   string
	vshard int
	lease  store.Lease
}

// NackItem fails one delivery.
type NackItem struct {
	Receipt    Receipt
	Code       string
	RetryAfter time.Duration
}

// RequestError is a request the target refused or could not serve as a
// whole.
type RequestError struct {
	Status     int    // HTTP status; 0 for the baseline
	Code       string // the API's error code, e.g. unavailable
	Message    string
	RetryAfter time.Duration
}

func (e *RequestError) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}
