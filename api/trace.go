package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/topology"
)

// Tracer is what the trace and lookup endpoints need.
type Tracer interface {
	Trace(ctx context.Context, topic, key, orderKey string) (*lookup.Trace, error)
	Transaction(ctx context.Context, txID string, page lookup.TxPage) (*lookup.TransactionResult, error)
}

var _ Tracer = (*lookup.Service)(nil)

// RouteOps registers the trace and lookup endpoints (DESIGN §5 "Trace and
// lookup") and, when a is not nil, the operations endpoints of admin.go.
func (s *Server) RouteOps(t Tracer, a Admin) {
	s.tracer = t
	s.register(byRouteOps)
	if a != nil {
		s.admin = a
		s.register(byRouteOpsAdmin)
	}
}

// messageBody is a stored message as every answer shows it: claims, the
// trace, lookups and dead-letter listings.
type messageBody struct {
	ID            string            `json:"id"`
	Key           string            `json:"key"`
	Topic         string            `json:"topic"`
	VShard        int               `json:"vshard"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers"`
	Priority      int               `json:"priority"`
	OrderKey      string            `json:"order_key"`
	TransactionID string            `json:"transaction_id"`
	ProducedAt    string            `json:"produced_at"`
}

func (s *Server) bodyOf(m *domain.Message) messageBody {
	v := messageBody{ID: strconv.FormatUint(m.ID, 10), Key: m.Key, Topic: m.Topic, VShard: int(m.VShard),
		Headers: s.headersOf(m), Priority: m.Priority, OrderKey: m.OrderKey, TransactionID: m.TransactionID,
		ProducedAt: formatTime(m.CreatedAt)}
	raw, b64 := encodePayload(m.PayloadJSON, m.Payload)
	if m.PayloadJSON {
		v.Payload = raw
	} else {
		v.PayloadBase64 = &b64
	}
	return v
}

// headersOf is m's stored headers as a map: empty when it has none, and
// what could be read (logged) when they are unreadable.
func (s *Server) headersOf(m *domain.Message) map[string]string {
	h := map[string]string{}
	if len(m.Headers) > 0 {
		if err := json.Unmarshal(m.Headers, &h); err != nil {
			s.log.Warn("stored headers unreadable", "id", m.ID, "err", err)
		}
	}
	return h
}

// messageView is a stored message as the trace and lookups show it.
type messageView struct {
	messageBody
	Cluster string               `json:"cluster,omitempty"`
	Status  domain.MessageStatus `json:"status"`
	// Tier is where the message was found: hot (its cluster), warm (the
	// archive cluster) or cold (a file: status is then archived, the
	// payload is in ArchiveFile, relative to the router's archive
	// directory). See docs/retention.md.
	Tier        string `json:"tier,omitempty"`
	ArchiveFile string `json:"archive_file,omitempty"`
}

// StatusArchived is the status of a message found only in a cold file.
const StatusArchived domain.MessageStatus = "archived"

func (s *Server) viewMessage(m *domain.Message, cluster string) messageView {
	return messageView{messageBody: s.bodyOf(m), Cluster: cluster, Status: m.Status}
}

// viewTiered is viewMessage with the tier a lookup found the message in.
func (s *Server) viewTiered(m *domain.Message, cluster, tier, file string) messageView {
	v := s.viewMessage(m, cluster)
	v.Tier, v.ArchiveFile = tier, file
	if tier == lookup.TierCold {
		v.Status = StatusArchived
		v.Payload, v.PayloadBase64 = nil, nil // in the file
	}
	return v
}

type deliveryView struct {
	Subscription  string               `json:"subscription"`
	State         domain.DeliveryState `json:"state"`
	Attempts      int                  `json:"attempts"`
	Consumer      string               `json:"consumer,omitempty"`
	ErrorCode     string               `json:"error_code,omitempty"`
	LastError     string               `json:"last_error,omitempty"`
	NextAttemptAt string               `json:"next_attempt_at,omitempty"`
	LeaseExpires  string               `json:"lease_expires_at,omitempty"`
	DoneAt        string               `json:"done_at,omitempty"`
}

type eventView struct {
	At           string `json:"at"`
	Type         string `json:"type"`
	Subscription string `json:"subscription,omitempty"`
	Consumer     string `json:"consumer,omitempty"`
	Attempt      int    `json:"attempt,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	Error        string `json:"error,omitempty"`
	RequestID    string `json:"request_id,omitempty"` // the request that caused it (X-Request-Id)
}

type traceResponse struct {
	Message    messageView    `json:"message"`
	Deliveries []deliveryView `json:"deliveries"`
	Events     []eventView    `json:"events"`
	ReadFrom   string         `json:"read_from"`
	LagMS      int64          `json:"replica_lag_ms"`
	Fallback   string         `json:"fallback_reason,omitempty"`
	Cluster    string         `json:"cluster"`
	Endpoint   string         `json:"endpoint"`
	// Tier and Archive (additive, docs/retention.md): where the message
	// was found, and for a cold one which file holds it.
	Tier    string       `json:"tier,omitempty"`
	Archive *archiveView `json:"archive,omitempty"`
}

type archiveView struct {
	File       string `json:"file"`
	Month      string `json:"month"`
	ExportedAt string `json:"exported_at"`
}

// lookupError maps a lookup failure to the error answered.
func (s *Server) lookupError(r *http.Request, err error, what string) *apiError {
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return fail(CodeNotFound, what+" not found")
	case errors.Is(err, domain.ErrUnavailable):
		return s.hide(r, CodeUnavailable, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return s.hide(r, CodeUnavailable, err)
	}
	return s.hide(r, CodeInternal, err)
}

func (s *Server) traceKeyInPath(w http.ResponseWriter, r *http.Request) {
	s.trace(w, r, r.PathValue("key"))
}

func (s *Server) traceKeyInQuery(w http.ResponseWriter, r *http.Request) {
	s.trace(w, r, r.URL.Query().Get("key"))
}

func (s *Server) trace(w http.ResponseWriter, r *http.Request, key string) {
	q := r.URL.Query()
	topic, orderKey := q.Get("topic"), q.Get("order_key")
	switch {
	case !topology.NameRE.MatchString(topic):
		writeError(w, fail(CodeInvalidTopic, "query parameter topic is required and must match "+topology.NameRE.String()))
		return
	case key == "" || len(key) > s.limits.MaxKey || !utf8.ValidString(key):
		writeError(w, fail(CodeInvalidRequest, "key must be 1-"+strconv.Itoa(s.limits.MaxKey)+" bytes of UTF-8"))
		return
	case len(orderKey) > s.limits.MaxKey || !utf8.ValidString(orderKey):
		writeError(w, fail(CodeInvalidRequest, "order_key must be at most "+strconv.Itoa(s.limits.MaxKey)+" bytes of UTF-8"))
		return
	}
	tr, err := s.tracer.Trace(r.Context(), topic, key, orderKey)
	if err != nil {
		writeError(w, s.lookupError(r, err, "message "+strconv.Quote(key)+" on topic "+topic+" (give order_key if it had one)"))
		return
	}
	file := ""
	if tr.Cold != nil {
		file = tr.Cold.File
	}
	out := traceResponse{Message: s.viewTiered(tr.Message, tr.Cluster, tr.Tier, file), Deliveries: []deliveryView{}, Events: []eventView{},
		ReadFrom: tr.ReadFrom, LagMS: tr.LagMS, Fallback: tr.Fallback, Cluster: tr.Cluster, Endpoint: endpointFor(r, tr.Endpoint), Tier: tr.Tier}
	if tr.Cold != nil {
		out.Archive = &archiveView{File: tr.Cold.File, Month: tr.Message.CreatedAt.UTC().Format("2006-01"), ExportedAt: formatTime(tr.Cold.ExportedAt)}
	}
	for _, d := range tr.Deliveries {
		out.Deliveries = append(out.Deliveries, deliveryView{Subscription: d.Subscription, State: d.State, Attempts: d.Attempts,
			Consumer: d.Consumer, ErrorCode: d.ErrorCode, LastError: d.LastError, NextAttemptAt: formatTime(d.NextAttemptAt),
			LeaseExpires: formatTime(d.LeaseExpires), DoneAt: formatTime(d.DoneAt)})
	}
	for _, e := range tr.Events {
		out.Events = append(out.Events, eventView{At: formatTime(e.At), Type: e.Type, Subscription: e.Subscription,
			Consumer: e.Consumer, Attempt: e.Attempt, ErrorCode: e.ErrorCode, Error: e.Error, RequestID: e.RequestID})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) transaction(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("transaction_id")
	if id == "" || len(id) > s.limits.MaxKey || !utf8.ValidString(id) {
		writeError(w, fail(CodeInvalidRequest, "transaction_id must be 1-"+strconv.Itoa(s.limits.MaxKey)+" bytes of UTF-8"))
		return
	}
	q := r.URL.Query()
	var page lookup.TxPage
	var e *apiError
	if page.Limit, e = queryInt(q, "limit", maxTransactionPage, defaultTransactionPage); e != nil {
		writeError(w, e)
		return
	}
	if page.MaxBytes, e = queryInt(q, "max_bytes", s.limits.MaxClaimBytes, s.limits.MaxClaimBytes); e != nil {
		writeError(w, e)
		return
	}
	if c := q.Get("cursor"); c != "" {
		v, err := strconv.ParseUint(c, 10, 64)
		if err != nil || v == 0 {
			writeError(w, fail(CodeInvalidRequest, "cursor "+strconv.Quote(c)+" is not one this endpoint gave (next_cursor)"))
			return
		}
		page.After = v
	}
	res, err := s.tracer.Transaction(r.Context(), id, page)
	if err != nil {
		writeError(w, s.lookupError(r, err, "transaction "+strconv.Quote(id)))
		return
	}
	msgs := make([]messageView, len(res.Messages))
	for i, m := range res.Messages {
		msgs[i] = s.viewTiered(m.Message, m.Cluster, m.Tier, m.File)
	}
	unanswered := s.hideClusterErrors(r, res.Unanswered)
	if len(unanswered) > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	next := ""
	if res.NextCursor != 0 {
		next = strconv.FormatUint(res.NextCursor, 10)
	}
	// complete: every cluster answered and no page is left.
	writeJSON(w, http.StatusOK, map[string]any{"messages": msgs, "complete": len(unanswered) == 0 && next == "",
		"next_cursor": next, "unanswered_clusters": unanswered, "missing_clusters": clusterNames(res.Unanswered), "sources": res.Sources})
}

// Transaction lookup pages: at most maxTransactionPage messages, and
// defaultTransactionPage when the request gives no limit.
const (
	maxTransactionPage     = 1000
	defaultTransactionPage = 100
)
