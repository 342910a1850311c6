package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/subscription"
)

// Subscriptions is what the subscription and dead-letter endpoints need.
type Subscriptions interface {
	GetSubscription(ctx context.Context, topic, name string) (subscription.Subscription, error)
	PutSubscription(ctx context.Context, s subscription.Subscription) (subscription.Subscription, bool, error)
	DeleteSubscription(ctx context.Context, topic, name string) error
	ListDead(ctx context.Context, topic, sub, errorCode, cursor string, limit, maxBytes int) (broker.DeadPage, error)
	Redrive(ctx context.Context, topic, sub string, ids []uint64, errorCode string) (int64, error)
	DeadByCode(ctx context.Context, topic, sub string, ids []uint64, errorCode string) (broker.DeadCounts, error)
	PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error)
	DeleteDead(ctx context.Context, topic, sub string, ids []uint64) (int64, error)
	Consumers(ctx context.Context, topic, sub string) ([]broker.Consumer, []string, error)
}

var _ Subscriptions = (*broker.Broker)(nil)

// subscriptionBody is a PUT body: omitted fields take their defaults (a PUT
// replaces the whole configuration).
type subscriptionBody struct {
	MaxAttempts *int `json:"max_attempts"`
	Backoff     *struct {
		InitialMS  *int64   `json:"initial_ms"`
		MaxMS      *int64   `json:"max_ms"`
		Multiplier *float64 `json:"multiplier"`
		Jitter     *float64 `json:"jitter"`
	} `json:"backoff"`
	Ordered         *bool `json:"ordered"`
	DeadLetterAlarm *struct {
		GrowthPercent *float64 `json:"growth_percent"`
		Window        *string  `json:"window"`
	} `json:"dead_letter_alarm"`
}

// zeroNotAllowed names fields whose 0 would read as "use the default".
func (b subscriptionBody) build(topic, name string) (subscription.Subscription, *apiError) {
	sub := subscription.Subscription{Topic: topic, Name: name}
	bad := func(field string) *apiError {
		return fail(CodeInvalidRequest, field+" must be above 0")
	}
	if b.MaxAttempts != nil {
		if *b.MaxAttempts <= 0 {
			return sub, bad("max_attempts")
		}
		sub.MaxAttempts = *b.MaxAttempts
	}
	jitter := domain.DefaultBackoffJitter
	if b.Backoff != nil {
		if v := b.Backoff.InitialMS; v != nil {
			if *v <= 0 {
				return sub, bad("backoff.initial_ms")
			}
			sub.Backoff.InitialMS = *v
		}
		if v := b.Backoff.MaxMS; v != nil {
			if *v <= 0 {
				return sub, bad("backoff.max_ms")
			}
			sub.Backoff.MaxMS = *v
		}
		if v := b.Backoff.Multiplier; v != nil {
			if *v <= 0 {
				return sub, bad("backoff.multiplier")
			}
			sub.Backoff.Multiplier = *v
		}
		if v := b.Backoff.Jitter; v != nil {
			jitter = *v
		}
	}
	sub.Backoff.Jitter = jitter
	if b.Ordered != nil {
		sub.Ordered = *b.Ordered
	}
	if a := b.DeadLetterAlarm; a != nil {
		if a.GrowthPercent != nil {
			if *a.GrowthPercent <= 0 {
				return sub, bad("dead_letter_alarm.growth_percent")
			}
			sub.DeadLetterAlarm.GrowthPercent = *a.GrowthPercent
		}
		if a.Window != nil {
			sub.DeadLetterAlarm.Window = *a.Window
		}
	}
	return sub, nil
}

func topicAndSub(w http.ResponseWriter, r *http.Request) (string, string, bool) {
	topic, e := pathName(r, "topic", CodeInvalidTopic)
	if e != nil {
		writeError(w, e)
		return "", "", false
	}
	sub, e := pathName(r, "sub", CodeInvalidSubscription)
	if e != nil {
		writeError(w, e)
		return "", "", false
	}
	return topic, sub, true
}

// subscriptionError answers an error from the subscription operations.
func (s *Server) subscriptionError(w http.ResponseWriter, r *http.Request, topic, sub string, err error) {
	switch {
	case errors.Is(err, broker.ErrUnknownSubscription):
		writeError(w, fail(CodeUnknownSubscription, fmt.Sprintf("topic %s has no subscription %s", topic, sub)))
	case errors.Is(err, subscription.ErrInvalid):
		writeError(w, fail(CodeInvalidRequest, err.Error()))
	case errors.Is(err, subscription.ErrTooManySubscriptions):
		writeError(w, fail(CodeTooManySubscriptions, err.Error()))
	case errors.Is(err, subscription.ErrTooManyTopics):
		writeError(w, fail(CodeTooManyTopics, err.Error()))
	case errors.Is(err, broker.ErrBadCursor):
		writeError(w, fail(CodeInvalidRequest, err.Error()))
	default:
		writeError(w, s.failure(r, fmt.Errorf("subscription %s/%s: %w", topic, sub, err)))
	}
}

func (s *Server) putSubscription(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	var body subscriptionBody
	if e := s.decodeOptional(w, r, &body); e != nil {
		writeError(w, e)
		return
	}
	sub, e := body.build(topic, name)
	if e != nil {
		writeError(w, e)
		return
	}
	if err := sub.WithDefaults().Validate(); err != nil {
		writeError(w, fail(CodeInvalidRequest, err.Error())) // before the broker reads or writes anything
		return
	}
	saved, created, err := s.subs.PutSubscription(r.Context(), sub)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	st := http.StatusOK
	if created {
		st = http.StatusCreated
	}
	writeJSON(w, st, saved)
}

func (s *Server) getSubscription(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	sub, err := s.subs.GetSubscription(r.Context(), topic, name)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	writeJSON(w, http.StatusOK, sub)
}

func (s *Server) deleteSubscription(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	if err := s.subs.DeleteSubscription(r.Context(), topic, name); err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"topic": topic, "name": name, "deleted": true})
}

type deadLetterJSON struct {
	messageBody
	Attempts  int    `json:"attempts"`
	ErrorCode string `json:"error_code"`
	LastError string `json:"last_error"`
	DeadAt    string `json:"dead_at"`
	InFlight  bool   `json:"in_flight"`
}

const maxDeadPage = 1000

func (s *Server) listDead(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit, e := queryInt(q, "limit", maxDeadPage, 100)
	if e != nil {
		writeError(w, e)
		return
	}
	maxBytes, e := queryInt(q, "max_bytes", s.limits.MaxClaimBytes, s.limits.MaxClaimBytes)
	if e != nil {
		writeError(w, e)
		return
	}
	if len(q.Get("error_code")) > maxErrorCode {
		writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("error_code is longer than %d bytes", maxErrorCode)))
		return
	}
	page, err := s.subs.ListDead(r.Context(), topic, name, q.Get("error_code"), q.Get("cursor"), limit, maxBytes)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	items := make([]deadLetterJSON, len(page.Items))
	for i, d := range page.Items {
		j := deadLetterJSON{Attempts: d.Attempts, ErrorCode: d.ErrorCode, LastError: d.LastError, DeadAt: formatTime(d.DeadAt),
			InFlight: d.InFlight}
		if d.Message != nil {
			j.messageBody = s.bodyOf(d.Message)
		} else {
			// The message row is missing (reconciliation reports it).
			j.messageBody = messageBody{ID: strconv.FormatUint(d.MessageID, 10), VShard: int(d.VShard), OrderKey: d.OrderKey,
				Topic: topic, Headers: map[string]string{}}
		}
		items[i] = j
	}
	out := map[string]any{"dead_letters": items, "next_cursor": page.NextCursor, "missing_clusters": missingList(page.Missing)}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) purgeDead(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	code := r.URL.Query().Get("error_code")
	if len(code) > maxErrorCode {
		writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("error_code is longer than %d bytes", maxErrorCode)))
		return
	}
	n, err := s.subs.PurgeDead(r.Context(), topic, name, code)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"purged": n})
}

type redriveBody struct {
	IDs       []string `json:"ids"`
	ErrorCode string   `json:"error_code"`
	All       bool     `json:"all"`
	// DryRun answers how many dead letters the redrive would make ready
	// now, by error code, and changes nothing.
	DryRun bool `json:"dry_run"`
}

func (s *Server) redrive(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	var body redriveBody
	if e := s.decode(w, r, &body); e != nil {
		writeError(w, e)
		return
	}
	chosen := 0
	for _, set := range []bool{len(body.IDs) > 0, body.ErrorCode != "", body.All} {
		if set {
			chosen++
		}
	}
	if chosen != 1 {
		writeError(w, fail(CodeInvalidRequest, `give exactly one of "ids", "error_code" or "all": true`))
		return
	}
	if len(body.ErrorCode) > maxErrorCode {
		writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("error_code is longer than %d bytes", maxErrorCode)))
		return
	}
	if len(body.IDs) > s.limits.MaxBatch {
		writeError(w, fail(CodeBatchTooLarge, fmt.Sprintf("at most %d ids per redrive", s.limits.MaxBatch)))
		return
	}
	ids, e := messageIDs(body.IDs)
	if e != nil {
		writeError(w, e)
		return
	}
	if body.DryRun {
		counts, err := s.subs.DeadByCode(r.Context(), topic, name, ids, body.ErrorCode)
		if err != nil {
			s.subscriptionError(w, r, topic, name, err)
			return
		}
		var n int64
		for _, c := range counts.ByCode {
			n += c
		}
		writeJSON(w, http.StatusOK, map[string]any{"dry_run": true, "redriven": 0, "would_redrive": n, "by_error_code": codeCounts(counts.ByCode),
			"missing_clusters": missingList(counts.Missing)})
		return
	}
	n, err := s.subs.Redrive(r.Context(), topic, name, ids, body.ErrorCode)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"redriven": n})
}

// deadCodes answers a subscription's dead letters counted by error code,
// largest first (those leased to a dead-letter handler left out, as a
// redrive would leave them).
func (s *Server) deadCodes(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	counts, err := s.subs.DeadByCode(r.Context(), topic, name, nil, "")
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	var total int64
	for _, n := range counts.ByCode {
		total += n
	}
	writeJSON(w, http.StatusOK, map[string]any{"total": total, "codes": codeCounts(counts.ByCode), "missing_clusters": missingList(counts.Missing)})
}

type codeCount struct {
	ErrorCode string `json:"error_code"`
	Count     int64  `json:"count"`
}

// codeCounts lists counts by error code, largest first.
func codeCounts(m map[string]int64) []codeCount {
	out := make([]codeCount, 0, len(m))
	for c, n := range m {
		out = append(out, codeCount{ErrorCode: c, Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].ErrorCode < out[j].ErrorCode
	})
	return out
}

func (s *Server) claimDead(w http.ResponseWriter, r *http.Request) {
	s.claimWith(w, r, true)
}

var _ = time.Second
