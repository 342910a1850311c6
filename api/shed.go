package api

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Shed answers 503 overloaded (with Retry-After) to requests beyond max in
// flight at once, before they reach the guard or the API: a router past
// what it can serve refuses the excess quickly instead of queueing it
// until every request times out and memory runs out. Claims that long-poll
// count while they wait, so max must leave room for the consumers' polls.
// /healthz is never shed (a busy router is alive). max ≤ 0 disables it.
type Shed struct {
	next     http.Handler
	max      int64
	inFlight atomic.Int64
	shed     prometheus.Counter
}

// NewShed wraps next; reg receives its metrics (optional).
func NewShed(next http.Handler, max int, reg prometheus.Registerer) *Shed {
	s := &Shed{next: next, max: int64(max), shed: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shardmq_http_shed_total",
		Help: "Requests answered 503 overloaded because the router had its maximum of requests in flight.",
	})}
	if reg != nil {
		reg.Register(s.shed)
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shardmq_http_in_flight",
			Help: "HTTP requests being served now.",
		}, func() float64 { return float64(s.inFlight.Load()) }))
	}
	return s
}

// ServeHTTP implements http.Handler.
func (s *Shed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.max <= 0 || r.URL.Path == "/healthz" {
		s.next.ServeHTTP(w, r)
		return
	}
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	if n > s.max {
		s.shed.Inc()
		writeError(w, fail(CodeOverloaded, "the router is serving its maximum of "+strconv.FormatInt(s.max, 10)+" requests; retry later"))
		return
	}
	s.next.ServeHTTP(w, r)
}
