package api

import (
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HTTPMetrics are the API's rate, errors and duration per endpoint. The
// route label is the endpoint's pattern ("POST /v1/topics/{topic}/messages"),
// never the raw path, so its values are as many as the endpoints.
type HTTPMetrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
}

// unmatchedRoute labels requests no endpoint serves (404, 405).
const unmatchedRoute = "unmatched"

// durationBuckets reach past the longest claim long-poll (wait_ms up to
// 20s).
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 25}

// NewHTTPMetrics returns the metrics, registered on reg.
func NewHTTPMetrics(reg prometheus.Registerer) *HTTPMetrics {
	m := &HTTPMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_http_requests_total",
			Help: "HTTP requests answered, by route (the endpoint's pattern) and status code."}, []string{"route", "status"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_http_errors_total",
			Help: "Requests answered with an error as a whole, by route and error code (items failing inside a 200 batch are counted by shardmq_messages_produced_total and shardmq_receipt_results_total)."}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardmq_http_request_duration_seconds",
			Help: "Time from a request's arrival to its answer, by route (claims include their long-poll wait).", Buckets: durationBuckets}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardmq_http_requests_in_flight",
			Help: "Requests being served now."}),
	}
	reg.MustRegister(m.requests, m.errors, m.duration, m.inFlight)
	return m
}

// Instrument makes the server count its requests into m. Without it the
// server still assigns request ids and logs.
func (s *Server) Instrument(m *HTTPMetrics) { s.metrics = m }

// observedWriter remembers what a handler answered.
type observedWriter struct {
	http.ResponseWriter
	status int
	code   string // the error code, when answered with one
}

func (w *observedWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *observedWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *observedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// errorRecorder is how writeError tells the observer its code.
type errorRecorder interface{ recordError(code string) }

func (w *observedWriter) recordError(code string) { w.code = code }

// begin starts observing a request routed to pattern ("" when no endpoint
// matches): it assigns the request id, and the returned done records the
// request's metrics and log line once it is answered.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, pattern string) (http.ResponseWriter, *http.Request, func()) {
	start := time.Now()
	r, id := withRequestID(w, r)
	ow := &observedWriter{ResponseWriter: w}
	route := pattern
	if route == "" {
		route = unmatchedRoute
	}
	if m := s.metrics; m != nil {
		m.inFlight.Inc()
	}
	return ow, r, func() {
		took := time.Since(start)
		status := ow.status
		if status == 0 {
			status = http.StatusOK
		}
		code := ow.code
		if code == "" && status >= 400 {
			code = "http_" + strconv.Itoa(status) // answered by something other than writeError
		}
		if m := s.metrics; m != nil {
			m.inFlight.Dec()
			m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
			if code != "" {
				m.errors.WithLabelValues(route, code).Inc()
			}
			m.duration.WithLabelValues(route).Observe(took.Seconds())
		}
		// Successes are logged at debug (-log-level debug shows every
		// request); refusals at info, failures of the router at warn.
		level := slog.LevelDebug
		switch {
		case status >= 500:
			level = slog.LevelWarn
		case status >= 400:
			level = slog.LevelInfo
		}
		ctx := r.Context()
		if !s.log.Enabled(ctx, level) {
			return
		}
		attrs := []slog.Attr{slog.String("request_id", id), slog.String("method", r.Method), slog.String("route", route),
			slog.String("path", r.URL.Path), slog.Int("status", status), slog.Duration("took", took)}
		if code != "" {
			attrs = append(attrs, slog.String("code", code))
		}
		s.log.LogAttrs(ctx, level, "request", attrs...)
	}
}
