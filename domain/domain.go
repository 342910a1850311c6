// Package domain holds the values every layer of shardmq passes up and down
// — messages, their statuses and the outcomes of operations on them — so
// that the HTTP API can name them without depending on the SQL that stores
// them.
//
// Each status is a typed string whose value is the word the API answers
// with (DESIGN §5): the store sets it, the broker carries it, the API writes
// it, and nobody compares string literals on the way.
package domain

import (
	"errors"
	"time"
)

// Errors callers match with errors.Is, whichever layer returned them.
var (
	// ErrNotFound: the row asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the cluster could not be reached or refused service
	// (connection errors, read-only server, too many connections). The
	// operation may or may not have been applied only when it says so.
	ErrUnavailable = errors.New("cluster unavailable")
	// ErrInvalidData: the database refused a value of the row itself (too
	// long for its column, out of range, not a valid value). Sending the
	// same item again fails the same way, so it is never reported as
	// unavailable; the API's limits keep such values from reaching SQL in
	// the first place.
	ErrInvalidData = errors.New("value refused by the database")
	// ErrOutcomeUnknown: a write was sent up to its COMMIT and no answer
	// came (the connection broke, or the wait ran out while the server
	// was stuck), so it may have been applied or not. It wraps
	// ErrUnavailable: the cluster did not answer. For a produce, a retry
	// with the same key is safe and tells which.
	ErrOutcomeUnknown = errors.New("outcome unknown: the write may have been applied")
)

// Capacities: the most each value holds, in bytes. The schema's columns are
// sized for them (store's TestColumnCapacities checks them against a
// migrated database) and the API's limits never exceed them, so a value the
// router accepts always fits and a too-long one is refused before SQL.
const (
	MaxTopicBytes     = 128       // topic, subscription
	MaxKeyBytes       = 256       // key, order_key, transaction_id
	MaxHeadersBytes   = 65535     // headers encoded as JSON
	MaxPayloadBytes   = 1<<24 - 1 // one payload
	MaxConsumerBytes  = 128       // a consumer's name
	MaxErrorCodeBytes = 64        // a nack's error_code
	MaxLastErrorBytes = 2048      // a nack's error text
)

// The retry policy of a subscription that does not set its own: written
// once here for the store's RetryPolicy, the subscription's configuration
// and the API's defaults.
const (
	DefaultMaxAttempts       = 5
	DefaultBackoffInitial    = time.Second
	DefaultBackoffMax        = 10 * time.Minute
	DefaultBackoffMultiplier = 2.0
	DefaultBackoffJitter     = 0.2
)

// Message is a stored message.
type Message struct {
	ID            uint64
	VShard        uint16
	Topic         string
	Key           string
	OrderKey      string
	TransactionID string
	Priority      int
	Headers       []byte // JSON object, or nil
	PayloadJSON   bool   // payload is JSON text (else opaque bytes)
	Payload       []byte
	Status        MessageStatus
	CreatedAt     time.Time
}

// MessageStatus is where a message stands across all its subscriptions.
type MessageStatus string

const (
	// MessagePending: some subscription has not handled it yet.
	MessagePending MessageStatus = "pending"
	// MessageConsumed: every subscription acked it.
	MessageConsumed MessageStatus = "consumed"
	// MessageDead: one of its deliveries is a dead letter.
	MessageDead MessageStatus = "dead"
)

// ProduceStatus is the outcome of one produced item.
type ProduceStatus string

const (
	// ProduceCreated: the message is new and stored with its deliveries.
	ProduceCreated ProduceStatus = "created"
	// ProduceDuplicate: the key was already registered with the same
	// payload; the result carries the original id.
	ProduceDuplicate ProduceStatus = "duplicate"
	// ProduceConflict: the key was registered with a different payload;
	// nothing was written for this item.
	ProduceConflict ProduceStatus = "conflict"
	// ProduceUnavailable: the item's cluster could not take it (or, under
	// replicated durability, no replica confirmed in time); a retry is safe.
	// Nothing of it was stored unless replicated durability says
	// otherwise (then it is on the primary, not yet confirmed).
	ProduceUnavailable ProduceStatus = "unavailable"
	// ProduceUnknown: the item's commit was under way when its cluster
	// stopped answering (or the router stopped waiting): it may have been
	// stored. A retry with the same key is safe and answers created or
	// duplicate once the cluster answers again. Unlike unavailable, the
	// message may be there already.
	ProduceUnknown ProduceStatus = "unknown"
	// ProduceRejected: the database refused a value of the item; a retry
	// fails the same way.
	ProduceRejected ProduceStatus = "rejected"
)

// LeaseStatus is the outcome of an ack or extend.
type LeaseStatus string

const (
	// LeaseOK: done.
	LeaseOK LeaseStatus = "ok"
	// LeaseLost: the delivery exists but the receipt's lease is no longer
	// the current one (it expired and was claimed again, or it was nacked,
	// acked by a newer lease or dead-lettered).
	LeaseLost LeaseStatus = "lease_lost"
	// LeaseNotFound: no such delivery (already acked, or never existed).
	LeaseNotFound LeaseStatus = "not_found"
	// LeaseUnavailable: the receipt's cluster did not answer.
	LeaseUnavailable LeaseStatus = "unavailable"
)

// NackStatus is the outcome of a nack.
type NackStatus string

const (
	// NackRetryScheduled: the delivery will be offered again at its next
	// attempt time.
	NackRetryScheduled NackStatus = "retry_scheduled"
	// NackDead: it used its last attempt and is now a dead letter.
	NackDead NackStatus = "dead"
	// NackLeaseLost and NackNotFound mean what LeaseLost and LeaseNotFound
	// mean for an ack.
	NackLeaseLost NackStatus = "lease_lost"
	NackNotFound  NackStatus = "not_found"
	// NackUnavailable: the receipt's cluster did not answer.
	NackUnavailable NackStatus = "unavailable"
)

// DeliveryState is one subscription's state of a message, as the trace
// shows it.
type DeliveryState string

const (
	DeliveryReady    DeliveryState = "ready"     // claimable now or after its delay or backoff
	DeliveryInFlight DeliveryState = "in_flight" // leased, lease not expired
	DeliveryDone     DeliveryState = "done"      // acked
	DeliveryDead     DeliveryState = "dead"      // a dead letter (or archived one)
)

// String methods let the statuses print and label metrics as their words.

func (s MessageStatus) String() string { return string(s) }
func (s ProduceStatus) String() string { return string(s) }
func (s LeaseStatus) String() string   { return string(s) }
func (s NackStatus) String() string    { return string(s) }
func (s DeliveryState) String() string { return string(s) }

// Kinds of reconciliation findings.
const (
	// FindingStatus: the message's status disagrees with its deliveries
	// and its trace. Repaired by setting the derived status.
	FindingStatus = "status_mismatch"
	// FindingMissingDelivery: a subscription that existed when the message
	// was produced has neither a delivery nor a terminal event (acked,
	// dead-lettered, archived). Repaired by re-creating the delivery, ready
	// now, traced as redriven by the reconciler.
	FindingMissingDelivery = "missing_delivery"
	// FindingOrphanDelivery: a delivery whose message is not stored.
	// Reported only: nothing to deliver can be derived.
	FindingOrphanDelivery = "orphan_delivery"
	// FindingMissingKey: a message without its dedup key, so a retry of it
	// would not be deduplicated. Reported only.
	FindingMissingKey = "missing_key"
	// FindingKeyMismatch: the message's key is registered to another
	// message id. Reported only.
	FindingKeyMismatch = "key_mismatch"
)

// Finding is one disagreement between the tables of a cluster.
type Finding struct {
	Kind         string
	MessageID    uint64
	VShard       uint16
	Topic        string
	Key          string
	Subscription string // missing and orphan deliveries
	Have, Want   string // status_mismatch: the stored and the derived status; key_mismatch: the holder's id and the message's
	Repaired     bool
}
