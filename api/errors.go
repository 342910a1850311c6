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
	CodeBatchTooLarge       = "batch_too_large"
	CodePayloadTooLarge     = "payload_too_large"
	CodeNotFound            = "not_found"
	CodeUnknownSubscription = "unknown_subscription"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodeUnavailable         = "unavailable"
	CodeInternal            = "internal"
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
	CodeBatchTooLarge:       http.StatusRequestEntityTooLarge,
	CodePayloadTooLarge:     http.StatusRequestEntityTooLarge,
	CodeNotFound:            http.StatusNotFound,
	CodeUnknownSubscription: http.StatusNotFound,
	CodeMethodNotAllowed:    http.StatusMethodNotAllowed,
	CodeUnavailable:         http.StatusServiceUnavailable,
	CodeInternal:            http.StatusInternalServerError,
	CodeReshardConflict:     http.StatusConflict,
	CodeReshardState:        http.StatusConflict,
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
	writeJSON(w, st, map[string]any{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}
