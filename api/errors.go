package api

import (
	"encoding/json"
	"net/http"
)

// Error codes that cross the wire. Each maps to one HTTP status here and
// nowhere else; clients match on the code, never on the message.
const (
	CodeInvalidJSON         = "invalid_json"
	CodeInvalidRequest      = "invalid_request"
	CodeInvalidTopic        = "invalid_topic"
	CodeInvalidSubscription = "invalid_subscription"
	CodeInvalidReceipt      = "invalid_receipt"
	CodeRequestTooLarge     = "request_too_large"
	// CodeRequestTimeout: the request's body did not arrive in time
	// (-http-read-timeout).
	CodeRequestTimeout      = "request_timeout"
	CodeBatchTooLarge       = "batch_too_large"
	CodePayloadTooLarge     = "payload_too_large"
	CodeNotFound            = "not_found"
	CodeUnknownSubscription = "unknown_subscription"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodeUnavailable         = "unavailable"
	// CodeOutcomeUnknown: an item's commit was under way when its cluster
	// stopped answering; it may be stored (a retry with its key tells).
	CodeOutcomeUnknown = "outcome_unknown"
	CodeInternal       = "internal"

	// Security (guard.go, docs/security.md).
	CodeUnauthorized         = "unauthorized"
	CodeForbidden            = "forbidden"
	CodeRateLimited          = "rate_limited"
	CodeOriginNotAllowed     = "origin_not_allowed"
	CodeHostNotAllowed       = "host_not_allowed"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeOverloaded           = "overloaded"
	// Caps on what the router holds (see README, limits).
	CodeTooManyConnections   = "too_many_connections"
	CodeTooManySubscriptions = "too_many_subscriptions"
	CodeTooManyTopics        = "too_many_topics"
	// CodeReshardConflict: another resharding job moves some of the
	// vshards asked for.
	CodeReshardConflict = "reshard_conflict"
	// CodeReshardState: the job cannot do that in its state (abort after
	// the flip, resume of a job that is not paused).
	CodeReshardState = "reshard_state"
)

var statusOf = map[string]int{
	CodeInvalidJSON:         http.StatusBadRequest,
	CodeInvalidRequest:      http.StatusBadRequest,
	CodeInvalidTopic:        http.StatusBadRequest,
	CodeInvalidSubscription: http.StatusBadRequest,
	CodeInvalidReceipt:      http.StatusBadRequest,
	CodeRequestTooLarge:     http.StatusRequestEntityTooLarge,
	CodeRequestTimeout:      http.StatusRequestTimeout,
	CodeBatchTooLarge:       http.StatusRequestEntityTooLarge,
	CodePayloadTooLarge:     http.StatusRequestEntityTooLarge,
	CodeNotFound:            http.StatusNotFound,
	CodeUnknownSubscription: http.StatusNotFound,
	CodeMethodNotAllowed:    http.StatusMethodNotAllowed,
	CodeUnavailable:         http.StatusServiceUnavailable,
	CodeOutcomeUnknown:      http.StatusServiceUnavailable,
	CodeInternal:            http.StatusInternalServerError,

	CodeUnauthorized:         http.StatusUnauthorized,
	CodeForbidden:            http.StatusForbidden,
	CodeRateLimited:          http.StatusTooManyRequests,
	CodeOriginNotAllowed:     http.StatusForbidden,
	CodeHostNotAllowed:       http.StatusForbidden,
	CodeUnsupportedMediaType: http.StatusUnsupportedMediaType,
	CodeOverloaded:           http.StatusServiceUnavailable,
	CodeTooManyConnections:   http.StatusServiceUnavailable,
	CodeTooManySubscriptions: http.StatusConflict,
	CodeTooManyTopics:        http.StatusConflict,
	CodeReshardConflict:      http.StatusConflict,
	CodeReshardState:         http.StatusConflict,
}

// apiError is an error answered to the client as a whole.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func fail(code, msg string) *apiError { return &apiError{Code: code, Message: msg} }

// retryAfterSeconds is what 503s and batches with unavailable items carry.
const retryAfterSeconds = "1"

func writeError(w http.ResponseWriter, e *apiError) {
	st, ok := statusOf[e.Code]
	if !ok {
		st = http.StatusInternalServerError
	}
	if st == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	if rec, ok := w.(errorRecorder); ok {
		rec.recordError(e.Code)
	}
	writeJSON(w, st, map[string]any{"error": e})
}

// ErrorResponse renders an error for code in the API's JSON shape, for
// answers written outside a handler (the connection cap).
func ErrorResponse(code, msg string) (status int, body []byte) {
	st, ok := statusOf[code]
	if !ok {
		st = http.StatusInternalServerError
	}
	body, _ = json.Marshal(map[string]any{"error": fail(code, msg)})
	return st, body
}

// writeJSON answers status with v encoded as JSON (without HTML
// escaping), in one write with a Content-Length.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := getBuffer()
	defer putBuffer(buf)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		buf.b = buf.b[:0]
	}
	writeBody(w, status, buf.b)
}
