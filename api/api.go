// Package api is shardmq's HTTP/JSON interface (DESIGN §5): it decodes and
// validates requests, rejects a bad request whole before anything is
// written, calls the broker and encodes per-item results in request order.
package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/topology"
)

// Broker is what the API needs from the broker.
type Broker interface {
	Produce(ctx context.Context, topic string, msgs []broker.Message, dur broker.Durability) ([]broker.ProduceResult, error)
	Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Delivery, error)
	Ack(ctx context.Context, receipts []broker.Receipt) []broker.LeaseResult
	Nack(ctx context.Context, items []broker.NackItem) []broker.NackResult
	Extend(ctx context.Context, receipts []broker.Receipt, lease time.Duration) []broker.LeaseResult
	// Forwarded by another router to the owner of their units
	// (docs/consume.md, "Owners"): served here, never forwarded again.
	ClaimCluster(ctx context.Context, cluster string, req broker.ClaimRequest) ([]broker.Delivery, error)
	AckHere(ctx context.Context, receipts []broker.Receipt) []broker.LeaseResult
	NackHere(ctx context.Context, items []broker.NackItem) []broker.NackResult
	ExtendHere(ctx context.Context, receipts []broker.Receipt, lease time.Duration) []broker.LeaseResult
	// DecodeReceipt reads a receipt a router of the fleet signed
	// (broker.Receipts); an altered one is an error.
	DecodeReceipt(s string) (broker.Receipt, error)
	Subscriptions
	Operator
}

var _ Broker = (*broker.Broker)(nil)

// Limits bound what one request may carry. Zero fields take the defaults;
// fields bounded by a column (store/limits.go) are clamped to what it holds.
// README "Limits" lists them; TestLimitsTableMatchesCode keeps the two equal.
type Limits struct {
	MaxBody      int64         // request body; defaults to 16 MiB
	MaxBatch     int           // messages per produce, receipts per ack/nack/extend; defaults to 1000
	MaxPayload   int           // one message's payload bytes; defaults to 1 MiB, at most domain.MaxPayloadBytes
	MaxKey       int           // key, order_key, transaction_id bytes; defaults to and at most domain.MaxKeyBytes (256)
	MaxHeaders   int           // headers encoded as JSON; defaults to and at most domain.MaxHeadersBytes (65,535)
	MaxClaim     int           // claim max; defaults to 1000
	MaxWait      time.Duration // claim wait_ms; defaults to 20s
	DefaultLease time.Duration // claim visibility_timeout_ms when absent; defaults to 30s
	MaxLease     time.Duration // defaults to 12h
	MaxDelay     time.Duration // delay_ms / deliver_at horizon; defaults to 366 days

	// MaxClaimBytes caps the message bytes (payload, headers, keys) of one
	// claim answer and is the largest max_bytes a claim may ask for;
	// defaults to 8 MiB. The first message is delivered even when it alone
	// is larger, so that a big message cannot get stuck.
	MaxClaimBytes int
}

// WithDefaults fills zero fields.
func (l Limits) WithDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.MaxBody <= 0 {
		l.MaxBody = 16 << 20
	}
	def(&l.MaxBatch, 1000)
	def(&l.MaxPayload, 1<<20)
	def(&l.MaxKey, domain.MaxKeyBytes)
	def(&l.MaxHeaders, domain.MaxHeadersBytes)
	l.MaxPayload = min(l.MaxPayload, domain.MaxPayloadBytes)
	l.MaxKey = min(l.MaxKey, domain.MaxKeyBytes)
	l.MaxHeaders = min(l.MaxHeaders, domain.MaxHeadersBytes)
	def(&l.MaxClaim, 1000)
	def(&l.MaxClaimBytes, 8<<20)
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&l.MaxWait, 20*time.Second)
	defDur(&l.DefaultLease, 30*time.Second)
	defDur(&l.MaxLease, 12*time.Hour)
	defDur(&l.MaxDelay, 366*24*time.Hour)
	return l
}

// Health reports readiness: an error means not ready (no cluster can
// be served). Readiness.Missing names the clusters that cannot be served
// now while others can: the router is then ready but degraded.
type Health func(ctx context.Context) (Readiness, error)

// Readiness is what a Health check found.
type Readiness struct {
	Detail  any      // shown as the answer's detail (every cluster's state)
	Missing []string // clusters that cannot be served now, sorted
}

// missingList is names as every answer gathered from several clusters
// carries it in missing_clusters: an empty array, never null, when the
// answer is complete, so that a client can tell "complete" from "field
// not supported".
func missingList(names []string) []string {
	if names == nil {
		return []string{}
	}
	return names
}

// Server serves the HTTP API.
type Server struct {
	b      Broker
	limits Limits
	ready  Health
	log    *slog.Logger
	mux    *http.ServeMux
	routes []string // the patterns registered on mux, in order
	// What the handlers of routes.go serve from, each set by the call
	// that registers them.
	subs        Subscriptions // New
	tracer      Tracer        // RouteOps
	admin       Admin         // RouteOps
	resharder   Resharder     // RouteReshard
	uiFiles     http.Handler  // RouteUI
	uiSources   UISources     // RouteUI
	retention   Retention     // RouteRetention; also adds its status to the stats when set
	metricsPage http.Handler  // RouteMetrics
	// metrics count requests when set (Instrument; metrics.go).
	metrics *HTTPMetrics
}

// New returns the API handler. ready may be nil (always ready).
func New(b Broker, limits Limits, ready Health, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{b: b, subs: b, limits: limits.WithDefaults(), ready: ready, log: log, mux: http.NewServeMux()}
	s.register(byNew)
	if b != nil {
		s.register(byNewWithBroker)
	}
	return s
}

// RouteMetrics serves h (the metrics registry's page) at GET /metrics.
func (s *Server) RouteMetrics(h http.Handler) {
	s.metricsPage = h
	s.register(byRouteMetrics)
}

func (s *Server) scrape(w http.ResponseWriter, r *http.Request) { s.metricsPage.ServeHTTP(w, r) }

// ServeHTTP implements http.Handler. Unknown paths and methods answer with
// the JSON error shape too.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if clean, ok := canonicalPath(r); !ok {
		w, r, done := s.begin(w, r, "")
		defer done()
		writeError(w, fail(CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.EscapedPath()+" is not a canonical path (routes are written like "+clean+")"))
		return
	}
	h, pattern := s.mux.Handler(r)
	w, r, done := s.begin(w, r, pattern) // request id, metrics, log line
	defer done()
	if s.tooLarge(w, r) {
		return
	}
	if pattern == "" {
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusMethodNotAllowed {
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeError(w, fail(CodeMethodNotAllowed, r.Method+" is not allowed on "+r.URL.Path))
			return
		}
		writeError(w, fail(CodeNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path))
		return
	}
	if e := checkQuery(r, pattern); e != nil {
		writeError(w, e)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// statusRecorder captures what the mux's own 404/405 handler would answer.
type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(st int)          { r.status = st }

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.ready == nil {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "missing_clusters": []string{}})
		return
	}
	rd, err := s.ready(r.Context())
	missing := missingList(rd.Missing)
	if err != nil {
		w.Header().Set("Retry-After", retryAfterSeconds)
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not_ready", "reason": err.Error(),
			"missing_clusters": missing, "detail": rd.Detail})
		return
	}
	// Degraded stays 200: the router still serves every other cluster's
	// vshards, and a load balancer that took every router out over one
	// dead cluster would stop them all.
	status := "ready"
	if len(missing) > 0 {
		status = "degraded"
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": status, "missing_clusters": missing, "detail": rd.Detail})
}

const emptyBody = "request body is empty"

// decode reads a JSON body within MaxBody into v, strictly (strict.go).
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, e := s.readBody(w, r)
	if e != nil {
		return e
	}
	return decodeStrict(body, v)
}

// decodeOptional is decode for endpoints whose body may be empty (all
// fields take defaults).
func (s *Server) decodeOptional(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, e := s.readBody(w, r)
	if e != nil {
		return e
	}
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return nil
	}
	return decodeStrict(body, v)
}

// pathName validates a topic or subscription name from the path.
func pathName(r *http.Request, param, code string) (string, *apiError) {
	v := r.PathValue(param)
	if !topology.NameRE.MatchString(v) {
		return "", fail(code, param+" name "+strconv.Quote(v)+" must match "+topology.NameRE.String())
	}
	return v, nil
}

func (s *Server) decodeReceipts(list []string) ([]broker.Receipt, *apiError) {
	out := make([]broker.Receipt, len(list))
	for i, text := range list {
		r, err := s.b.DecodeReceipt(text)
		if err != nil {
			return nil, fail(CodeInvalidReceipt, "receipts["+strconv.Itoa(i)+"] is not a receipt issued by shardmq")
		}
		out[i] = r
	}
	return out, nil
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func encodePayload(isJSON bool, p []byte) (json.RawMessage, string) {
	if isJSON {
		return json.RawMessage(p), ""
	}
	return nil, base64.StdEncoding.EncodeToString(p)
}
