package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/lookup"
)

// Errors from the clusters (driver errors with SQL text, "dial tcp
// 10.0.0.7:3306: …", DSN parse errors) never reach a client: hide logs
// the detail with the request's id and answers the code with a generic
// message that names the id, so an operator can find the detail in the
// router's log.
func (s *Server) hide(r *http.Request, code string, err error) *apiError {
	id := RequestID(r.Context())
	s.log.Warn("request failed", "request_id", id, "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	return fail(code, publicMessage(code, err, id))
}

// failure answers a whole request that failed with err: 503 unavailable
// (retry later) for an outage — a cluster down, frozen, fenced, too slow
// or still locked after the retries — and 500 internal for anything else,
// which is a bug to look for in the log under the request id, not a
// reason for every client to retry.
func (s *Server) failure(r *http.Request, err error) *apiError {
	if outage(err) {
		return s.hide(r, CodeUnavailable, err)
	}
	id := RequestID(r.Context())
	s.log.Error("request failed unexpectedly", "request_id", id, "method", r.Method, "path", r.URL.Path, "err", err)
	return fail(CodeInternal, publicMessage(CodeInternal, err, id))
}

// outage reports err as one a retry may cure.
func outage(err error) bool {
	var notRepl *broker.NotReplicatedError
	return errors.Is(err, domain.ErrUnavailable) || errors.Is(err, circuit.ErrOpen) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.As(err, &notRepl)
}

// hider is hide for the items of one batch: a detail shared by many items
// is logged once.
func (s *Server) hider(r *http.Request) func(code string, err error) *apiError {
	seen := map[string]*apiError{}
	return func(code string, err error) *apiError {
		k := code + "\x00" + err.Error()
		if e, ok := seen[k]; ok {
			return e
		}
		e := s.hide(r, code, err)
		seen[k] = e
		return e
	}
}

func publicMessage(code string, err error, id string) string {
	var msg string
	var notRepl *broker.NotReplicatedError
	switch {
	case errors.As(err, &notRepl):
		msg = notRepl.Public()
	case errors.Is(err, circuit.ErrOpen):
		msg = "a cluster this request needs is failing and refused for a while; retry later"
	case errors.Is(err, context.DeadlineExceeded):
		msg = "a cluster this request needs did not answer in time; retry later"
	case errors.Is(err, context.Canceled):
		msg = "the request was cancelled"
	case code == CodeUnavailable:
		msg = "a cluster this request needs is unavailable; retry later"
	default:
		msg = "internal error"
	}
	if id != "" {
		msg += " (request id " + id + ")"
	}
	return msg
}

// hideClusterErrors replaces each unanswered cluster's error text.
func (s *Server) hideClusterErrors(r *http.Request, list []lookup.ClusterError) []lookup.ClusterError {
	if len(list) == 0 {
		return []lookup.ClusterError{}
	}
	out := make([]lookup.ClusterError, len(list))
	id := RequestID(r.Context())
	for i, ce := range list {
		s.log.Warn("cluster did not answer", "request_id", id, "cluster", ce.Cluster, "err", ce.Error)
		out[i] = lookup.ClusterError{Cluster: ce.Cluster, Error: publicMessage(CodeUnavailable, nil, id)}
	}
	return out
}

// consumerOf names the consumer of a claim that gives none: the token's
// name, so that the trace says who held the lease.
func consumerOf(r *http.Request) string {
	if t := TokenFrom(r.Context()); t != nil {
		return t.Name
	}
	return ""
}

// endpointFor shows a MySQL endpoint (host:port) only to operators: an
// open router's caller or a token with admin on every topic. Others see
// the cluster's name only.
func endpointFor(r *http.Request, endpoint string) string {
	if t := TokenFrom(r.Context()); t != nil && !t.Allows(auth.Admin, "") {
		return ""
	}
	return endpoint
}
