package api

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/ui"
)

// QueueHistory is what the page's queue table needs: a page of
// subscriptions with their samples of the last hour (ui.History).
type QueueHistory interface {
	Page(q ui.Query) ui.Page
	Step() time.Duration
}

var _ QueueHistory = (*ui.History)(nil)

// maxQueuesLimit bounds one page of GET /v1/admin/queues.
const maxQueuesLimit = 500

// staleQueues: samples whose newest count is older than this (or than
// two steps) are not served; the router stopped counting (it no longer
// leads), and the answer is counted for the request instead.
const staleQueues = 5 * time.Minute

// RouteUI serves the operators' page at /ui (its files carry no data: the
// route is open) and GET /v1/admin/queues, the paged queue table with
// sparkline samples that the page reads (docs/ui.md). hist may be nil:
// every answer is then counted live, without samples.
func (s *Server) RouteUI(hist QueueHistory) {
	page := ui.Handler()
	s.Handle("GET /ui", page)
	s.Handle("GET /ui/", page)
	s.handleFunc("GET /v1/admin/queues", func(w http.ResponseWriter, r *http.Request) { s.queues(w, r, hist) })
}

func (s *Server) queues(w http.ResponseWriter, r *http.Request, hist QueueHistory) {
	qv := r.URL.Query()
	q := ui.Query{Filter: qv.Get("filter"), Sort: qv.Get("sort"), Limit: 50}
	if len(q.Filter) > 256 {
		writeError(w, fail(CodeInvalidRequest, "filter is longer than 256 bytes"))
		return
	}
	switch q.Sort {
	case "", "name", "depth", "in_flight", "dead":
	default:
		writeError(w, fail(CodeInvalidRequest, `sort must be "name", "depth", "in_flight" or "dead"`))
		return
	}
	for name, dst := range map[string]*int{"offset": &q.Offset, "limit": &q.Limit} {
		v := qv.Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || (name == "limit" && (n < 1 || n > maxQueuesLimit)) {
			writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("%s must be a number (limit 1-%d, offset from 0)", name, maxQueuesLimit)))
			return
		}
		*dst = n
	}
	var p ui.Page
	live := hist == nil
	step := time.Minute
	if hist != nil {
		step = hist.Step()
	}
	if !live {
		p = hist.Page(q)
		// No count yet (not the leading router, or just started), or none
		// for a while (it stopped leading): count for this answer.
		live = p.At.IsZero() || time.Since(p.At) > max(2*step, staleQueues)
	}
	var missing []string
	if live {
		st := s.b.Stats(r.Context())
		h := ui.NewHistory(step, 2)
		h.Record(time.Now(), st.Subscriptions)
		p = h.Page(q)
		missing = st.Missing
	}
	type series struct {
		Depth    []uint32 `json:"depth"`
		InFlight []uint32 `json:"in_flight"`
		Dead     []uint32 `json:"dead"`
	}
	type row struct {
		subscriptionStats
		History series `json:"history"`
	}
	rows := make([]row, len(p.Rows))
	for i, x := range p.Rows {
		rows[i] = row{subscriptionStats: subscriptionStats{Topic: x.Topic, Subscription: x.Subscription, Depth: x.Depth, Ready: x.Ready,
			Delayed: x.Delayed, InFlight: x.InFlight, Parked: x.Parked, Dead: x.Dead},
			History: series{Depth: x.DepthHist, InFlight: x.InFlightHist, Dead: x.DeadHist}}
	}
	times := make([]string, len(p.Times))
	for i, t := range p.Times {
		times[i] = formatTime(t)
	}
	out := map[string]any{"counted_at": formatTime(p.At), "live": live, "step_seconds": int(step / time.Second), "times": times,
		"total": p.Total, "offset": q.Offset, "limit": q.Limit, "subscriptions": rows}
	if len(missing) > 0 {
		out["missing_clusters"] = missing
	}
	writeJSON(w, http.StatusOK, out)
}
