package api

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/ui"
)

// QueueHistory is what the page's queue table needs: a page of
// subscriptions with their samples of the last hour (ui.History).
type QueueHistory interface {
	Page(q ui.Query) ui.Page
	Step() time.Duration
}

var _ QueueHistory = (*ui.History)(nil)

// Alarms lists the dead-letter alarms firing now (deadletter.Upkeep).
type Alarms interface {
	FiringAlarms() []deadletter.Alert
}

var _ Alarms = (*deadletter.Upkeep)(nil)

// Flow is this router's count of the message flow since it started:
// messages created on a topic and acks of a subscription
// (observe.Messages). The page's rates are its differences over time.
type Flow interface {
	Flow(topic, sub string) (created, acked int64)
}

// UISources are what GET /v1/admin/queues reads besides the broker; any
// may be nil: without History every answer is counted live, without
// Alarms none is listed, without Flow the rows carry no flow counts.
type UISources struct {
	History QueueHistory
	Alarms  Alarms
	Flow    Flow
}

// maxQueuesLimit bounds one page of GET /v1/admin/queues.
const maxQueuesLimit = 500

// staleQueues: samples whose newest count is older than this (or than
// two steps) are not served; the router stopped counting (it no longer
// leads), and the answer is counted for the request instead.
const staleQueues = 5 * time.Minute

// RouteUI serves the operators' page at /ui (its files carry no data: the
// route is open) and GET /v1/admin/queues, the paged queue table with
// sparkline samples, lag, flow counts and firing alarms that the page
// reads (docs/ui.md). src may be nil (as UISources{}).
func (s *Server) RouteUI(src *UISources) {
	if src == nil {
		src = &UISources{}
	}
	s.uiFiles = ui.Handler()
	s.uiSources = *src
	s.register(byRouteUI)
}

func (s *Server) page(w http.ResponseWriter, r *http.Request) { s.uiFiles.ServeHTTP(w, r) }

type queueFlow struct {
	Created int64 `json:"created"`
	Acked   int64 `json:"acked"`
}

func (s *Server) queues(w http.ResponseWriter, r *http.Request) {
	src := s.uiSources
	qv := r.URL.Query()
	q := ui.Query{Filter: qv.Get("filter"), Sort: qv.Get("sort"), Limit: 50}
	if len(q.Filter) > 256 {
		writeError(w, fail(CodeInvalidRequest, "filter is longer than 256 bytes"))
		return
	}
	switch q.Sort {
	case "", "name", "depth", "in_flight", "dead", "lag":
	default:
		writeError(w, fail(CodeInvalidRequest, `sort must be "name", "depth", "in_flight", "dead" or "lag"`))
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
	hist := src.History
	live := hist == nil
	step := time.Minute
	if hist != nil {
		step = hist.Step()
	}
	if !live {
		p = hist.Page(q)
		// No count yet (not the leading router, or just started), or none
		// for a while (it stopped leading): count for this answer.
		newest := p.At
		if p.MissingAt.After(newest) {
			newest = p.MissingAt
		}
		live = newest.IsZero() || time.Since(newest) > max(2*step, staleQueues)
	}
	// partial: the rows come from a count that missed clusters, so they
	// are smaller than the truth (a history that holds a complete count
	// serves that one instead, with the clusters named).
	partial := false
	if live {
		st := s.b.Stats(r.Context())
		h := ui.NewHistory(step, 2)
		h.Record(time.Now(), st.Subscriptions, st.Missing)
		p = h.Page(q)
		partial = len(st.Missing) > 0
	} else if len(p.Missing) > 0 && !p.MissingAt.After(p.At) {
		partial = true // no complete count held yet
	}
	now := time.Now()
	type series struct {
		Depth    []uint32 `json:"depth"`
		InFlight []uint32 `json:"in_flight"`
		Dead     []uint32 `json:"dead"`
	}
	type row struct {
		subscriptionStats
		// OldestReadyAt is the produce time of the oldest ready message;
		// LagSeconds its age now (0 with nothing ready): the consumers'
		// lag, as the queue-health metric has it.
		OldestReadyAt string     `json:"oldest_ready_at,omitempty"`
		LagSeconds    float64    `json:"lag_seconds"`
		Flow          *queueFlow `json:"flow,omitempty"`
		History       series     `json:"history"`
	}
	rows := make([]row, len(p.Rows))
	for i, x := range p.Rows {
		rows[i] = row{subscriptionStats: subscriptionStats{Topic: x.Topic, Subscription: x.Subscription, Depth: x.Depth, Ready: x.Ready,
			Delayed: x.Delayed, InFlight: x.InFlight, Parked: x.Parked, Dead: x.Dead},
			History: series{Depth: x.DepthHist, InFlight: x.InFlightHist, Dead: x.DeadHist}}
		if x.OldestReady != 0 {
			at := idgen.Time(x.OldestReady)
			rows[i].OldestReadyAt = formatTime(at)
			rows[i].LagSeconds = max(now.Sub(at).Seconds(), 0)
		}
		if src.Flow != nil {
			c, a := src.Flow.Flow(x.Topic, x.Subscription)
			rows[i].Flow = &queueFlow{Created: c, Acked: a}
		}
	}
	times := make([]string, len(p.Times))
	for i, t := range p.Times {
		times[i] = formatTime(t)
	}
	// The alarms as the webhook gets them (deadletter.Alert), at: when
	// each was raised.
	alarms := []deadletter.Alert{}
	if src.Alarms != nil {
		alarms = append(alarms, src.Alarms.FiringAlarms()...)
	}
	out := map[string]any{"counted_at": formatTime(p.At), "live": live, "partial": partial, "step_seconds": int(step / time.Second),
		"times": times, "total": p.Total, "offset": q.Offset, "limit": q.Limit, "subscriptions": rows, "alarms": alarms,
		"answered_at": formatTime(now), "missing_clusters": missingList(p.Missing)}
	if len(p.Missing) > 0 {
		out["missing_at"] = formatTime(p.MissingAt)
	}
	writeJSON(w, http.StatusOK, out)
}
