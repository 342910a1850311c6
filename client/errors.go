package client

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Error codes the router answers (api/errors.go is their source; one code
// maps to one HTTP status there). Item statuses of batch answers are not
// error codes: see the Status* constants.
const (
	CodeInvalidJSON          = "invalid_json"
	CodeInvalidRequest       = "invalid_request"
	CodeInvalidTopic         = "invalid_topic"
	CodeInvalidSubscription  = "invalid_subscription"
	CodeInvalidReceipt       = "invalid_receipt"
	CodeRequestTooLarge      = "request_too_large"
	CodeBatchTooLarge        = "batch_too_large"
	CodePayloadTooLarge      = "payload_too_large"
	CodeNotFound             = "not_found"
	CodeUnknownSubscription  = "unknown_subscription"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeUnavailable          = "unavailable"
	CodeInternal             = "internal"
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = "forbidden"
	CodeRateLimited          = "rate_limited"
	CodeOriginNotAllowed     = "origin_not_allowed"
	CodeHostNotAllowed       = "host_not_allowed"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeOverloaded           = "overloaded"
	CodeTooManyConnections   = "too_many_connections"
	CodeTooManySubscriptions = "too_many_subscriptions"
	CodeTooManyTopics        = "too_many_topics"
	CodeReshardConflict      = "reshard_conflict"
	CodeReshardState         = "reshard_state"
	// CodeOutcomeUnknown: the commit may have happened (the primary did
	// not answer in time); sending again with the same key is safe.
	CodeOutcomeUnknown = "outcome_unknown"
	// CodeRequestTimeout: the request's body did not arrive in time.
	CodeRequestTimeout = "request_timeout"
)

// Error is an answer of the router that refused a request (or one item of
// a batch), with the API's code. Match it with errors.As, or with
// errors.Is against the Err* value of its code:
//
//	var e *client.Error
//	if errors.As(err, &e) && e.Code == client.CodeForbidden { … }
//	if errors.Is(err, client.ErrUnavailable) { … }
type Error struct {
	// Status is the HTTP status (0 for an item of a batch answered 200).
	Status int
	// Code is the API's error code, e.g. "unavailable"; "http_<status>"
	// when the body carried none.
	Code    string
	Message string
	// RetryAfter is the answer's Retry-After (0 when it had none).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("shardmq: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("shardmq: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Is matches another *Error by code, so errors.Is(err, ErrUnavailable)
// holds for every unavailable answer whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Status == 0 || t.Status == e.Status)
}

// Temporary reports whether the same request may succeed later: the
// cluster was unavailable, the router overloaded, the token over its rate.
func (e *Error) Temporary() bool {
	switch e.Code {
	case CodeUnavailable, CodeOverloaded, CodeRateLimited, CodeTooManyConnections, CodeInternal, CodeOutcomeUnknown, CodeRequestTimeout:
		return true
	}
	return e.Status == http.StatusServiceUnavailable || e.Status == http.StatusTooManyRequests
}

// One value per error code, for errors.Is.
var (
	ErrInvalidJSON          = &Error{Code: CodeInvalidJSON}
	ErrInvalidRequest       = &Error{Code: CodeInvalidRequest}
	ErrInvalidTopic         = &Error{Code: CodeInvalidTopic}
	ErrInvalidSubscription  = &Error{Code: CodeInvalidSubscription}
	ErrInvalidReceipt       = &Error{Code: CodeInvalidReceipt}
	ErrRequestTooLarge      = &Error{Code: CodeRequestTooLarge}
	ErrBatchTooLarge        = &Error{Code: CodeBatchTooLarge}
	ErrPayloadTooLarge      = &Error{Code: CodePayloadTooLarge}
	ErrNotFound             = &Error{Code: CodeNotFound}
	ErrUnknownSubscription  = &Error{Code: CodeUnknownSubscription}
	ErrMethodNotAllowed     = &Error{Code: CodeMethodNotAllowed}
	ErrUnavailable          = &Error{Code: CodeUnavailable}
	ErrInternal             = &Error{Code: CodeInternal}
	ErrUnauthorized         = &Error{Code: CodeUnauthorized}
	ErrForbidden            = &Error{Code: CodeForbidden}
	ErrRateLimited          = &Error{Code: CodeRateLimited}
	ErrOriginNotAllowed     = &Error{Code: CodeOriginNotAllowed}
	ErrHostNotAllowed       = &Error{Code: CodeHostNotAllowed}
	ErrUnsupportedMediaType = &Error{Code: CodeUnsupportedMediaType}
	ErrOverloaded           = &Error{Code: CodeOverloaded}
	ErrTooManyConnections   = &Error{Code: CodeTooManyConnections}
	ErrTooManySubscriptions = &Error{Code: CodeTooManySubscriptions}
	ErrTooManyTopics        = &Error{Code: CodeTooManyTopics}
	ErrReshardConflict      = &Error{Code: CodeReshardConflict}
	ErrReshardState         = &Error{Code: CodeReshardState}
	ErrOutcomeUnknown       = &Error{Code: CodeOutcomeUnknown}
	ErrRequestTimeout       = &Error{Code: CodeRequestTimeout}
)

// ErrConflict is what Send answers for an item whose key is already stored
// with another payload (status "conflict"): retrying cannot help.
var ErrConflict = errors.New("shardmq: key already stored with another payload (conflict)")

// ErrLeaseLost is what the Delivery methods answer when the router says
// the lease is no longer this consumer's (status "lease_lost"): the
// delivery was claimed again after the lease expired, or nacked.
var ErrLeaseLost = errors.New("shardmq: lease lost")

// ErrReceiptNotFound is answered for a receipt whose delivery is gone
// (already acked, or its subscription deleted): status "not_found".
var ErrReceiptNotFound = errors.New("shardmq: delivery not found (already acked?)")

// ErrClosed is answered by a Producer after Close.
var ErrClosed = errors.New("shardmq: producer closed")

// retryable reports whether err leaves the request's outcome open and a
// retry with the same keys is safe and may succeed: transport errors (the
// request may or may not have been served) and temporary refusals.
func retryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Temporary()
	}
	return err != nil
}

// retryAfterOf is the Retry-After an error carries, 0 when none.
func retryAfterOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}
