package api

import (
	"context"
	"net/http"

	"github.com/shardmq/shardmq/internal/reqid"
)

// RequestIDHeader carries a request's id: a client may send one (1-64
// letters, digits and . _ : -), else the router makes one; either way it is
// echoed in the response, written in the request's log line and in the
// trace events the request causes.
const RequestIDHeader = "X-Request-Id"

// RequestID returns the id of the request ctx belongs to, "" outside one.
// Code that logs about a request (an error answered without detail, an
// auth refusal) adds it so the line can be matched with the client's.
func RequestID(ctx context.Context) string { return reqid.From(ctx) }

// withRequestID takes the client's id when well-formed, else makes one,
// echoes it and puts it in the request's context.
func withRequestID(w http.ResponseWriter, r *http.Request) (*http.Request, string) {
	if id := reqid.From(r.Context()); id != "" {
		return r, id // an outer layer (the guard) gave it already
	}
	id := r.Header.Get(RequestIDHeader)
	if !reqid.Valid(id) {
		id = reqid.New()
	}
	w.Header().Set(RequestIDHeader, id)
	return r.WithContext(reqid.With(r.Context(), id)), id
}
