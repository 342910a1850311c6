package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/forward"
	"github.com/shardmq/shardmq/subscription"
)

type produceRequest struct {
	Messages   []produceMessage `json:"messages"`
	Durability string           `json:"durability"`
}

type produceMessage struct {
	Key           string            `json:"key"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
	Headers       map[string]string `json:"headers"`
	Priority      *int              `json:"priority"`
	DelayMS       *int64            `json:"delay_ms"`
	DeliverAt     string            `json:"deliver_at"`
	OrderKey      string            `json:"order_key"`
	TransactionID string            `json:"transaction_id"`
}

type produceResult struct {
	Key    string               `json:"key"`
	ID     string               `json:"id,omitempty"`
	VShard int                  `json:"vshard"`
	Status domain.ProduceStatus `json:"status"`
	Error  *apiError            `json:"error,omitempty"`
}

func (s *Server) produce(w http.ResponseWriter, r *http.Request) {
	topic, e := pathName(r, "topic", CodeInvalidTopic)
	if e != nil {
		writeError(w, e)
		return
	}
	body, e := s.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req produceRequest
	if e := decodeProduce(body, &req); e != nil {
		writeError(w, e)
		return
	}
	msgs, e := s.validateProduce(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	dur := broker.DurabilityPrimary
	if req.Durability == "replicated" {
		dur = broker.DurabilityReplicated
	}
	res, err := s.b.Produce(r.Context(), topic, msgs, dur)
	if errors.Is(err, subscription.ErrTooManyTopics) {
		writeError(w, fail(CodeTooManyTopics, err.Error()))
		return
	}
	if err != nil {
		writeError(w, s.failure(r, fmt.Errorf("produce to %s: %w", topic, err)))
		return
	}
	out := make([]produceResult, len(res))
	hide := s.hider(r)
	for i, pr := range res {
		out[i] = produceResult{Key: pr.Key, VShard: int(pr.VShard), Status: pr.Status}
		if pr.ID != 0 {
			out[i].ID = strconv.FormatUint(pr.ID, 10)
		}
		switch pr.Status {
		case domain.ProduceUnavailable:
			w.Header().Set("Retry-After", retryAfterSeconds)
			if pr.Err != nil {
				out[i].Error = hide(CodeUnavailable, pr.Err)
			}
		case domain.ProduceUnknown: // may be stored: a retry with the same key is safe and tells
			w.Header().Set("Retry-After", retryAfterSeconds)
			if pr.Err != nil {
				out[i].Error = hide(CodeOutcomeUnknown, pr.Err)
			}
		case domain.ProduceRejected: // the database refused a value: no retry can succeed
			if pr.Err != nil {
				out[i].Error = fail(CodeInvalidRequest, pr.Err.Error())
			}
		}
	}
	buf := getBuffer()
	defer putBuffer(buf)
	buf.b = appendProduceResults(buf.b, out)
	writeBody(w, http.StatusOK, buf.b)
}

// validateProduce checks every limit before anything is written: a request
// that breaks one is rejected whole.
func (s *Server) validateProduce(req *produceRequest) ([]broker.Message, *apiError) {
	l := s.limits
	switch req.Durability {
	case "", "primary", "replicated":
	default:
		return nil, fail(CodeInvalidRequest, `durability must be "primary" or "replicated", got `+strconv.Quote(req.Durability))
	}
	if len(req.Messages) == 0 {
		return nil, fail(CodeInvalidRequest, "messages must hold at least one message")
	}
	if len(req.Messages) > l.MaxBatch {
		return nil, fail(CodeBatchTooLarge, fmt.Sprintf("a batch holds at most %d messages, got %d", l.MaxBatch, len(req.Messages)))
	}
	out := make([]broker.Message, len(req.Messages))
	for i, m := range req.Messages {
		at := func(format string, a ...any) *apiError {
			return fail(CodeInvalidRequest, fmt.Sprintf("messages[%d]: ", i)+fmt.Sprintf(format, a...))
		}
		for _, f := range [...]struct{ name, v string }{{"key", m.Key}, {"order_key", m.OrderKey}, {"transaction_id", m.TransactionID}} {
			if len(f.v) > l.MaxKey {
				return nil, at("%s is %d bytes, at most %d allowed", f.name, len(f.v), l.MaxKey)
			}
			if !utf8.ValidString(f.v) {
				return nil, at("%s is not valid UTF-8", f.name)
			}
		}
		msg := broker.Message{Key: m.Key, OrderKey: m.OrderKey, TransactionID: m.TransactionID}
		hasJSON := len(m.Payload) > 0 && !bytes.Equal(m.Payload, []byte("null"))
		switch {
		case hasJSON && m.PayloadBase64 != nil:
			return nil, at("give payload or payload_base64, not both")
		case hasJSON && !bytes.ContainsAny(m.Payload, " \t\r\n"):
			// Without a whitespace byte there is nothing to compact: the
			// decoder has validated the value, and a json.RawMessage holds
			// its own copy of it. (json.Compact here was 5 % of the
			// router's CPU under produce load.)
			msg.Payload, msg.PayloadJSON = m.Payload, true
		case hasJSON:
			var buf bytes.Buffer
			if err := json.Compact(&buf, m.Payload); err != nil {
				return nil, at("payload is not valid JSON: %v", err)
			}
			msg.Payload, msg.PayloadJSON = buf.Bytes(), true
		case m.PayloadBase64 != nil:
			p, err := base64.StdEncoding.DecodeString(*m.PayloadBase64)
			if err != nil {
				return nil, at("payload_base64 is not valid base64: %v", err)
			}
			msg.Payload = p
		default:
			return nil, at("payload or payload_base64 is required")
		}
		if len(msg.Payload) > l.MaxPayload {
			return nil, fail(CodePayloadTooLarge, fmt.Sprintf("messages[%d]: payload is %d bytes, at most %d allowed", i, len(msg.Payload), l.MaxPayload))
		}
		if m.Priority != nil {
			if *m.Priority < 0 || *m.Priority > 9 {
				return nil, at("priority must be 0-9, got %d", *m.Priority)
			}
			msg.Priority = *m.Priority
		}
		if m.DelayMS != nil && m.DeliverAt != "" {
			return nil, at("give delay_ms or deliver_at, not both")
		}
		if m.DelayMS != nil {
			d, e := millis(fmt.Sprintf("messages[%d].delay_ms", i), *m.DelayMS, 0, l.MaxDelay)
			if e != nil {
				return nil, e
			}
			msg.Delay = d
		}
		if m.DeliverAt != "" {
			t, err := time.Parse(time.RFC3339Nano, m.DeliverAt)
			if err != nil {
				return nil, at("deliver_at is not an RFC 3339 time: %v", err)
			}
			if time.Until(t) > l.MaxDelay {
				return nil, at("deliver_at is more than %s ahead", l.MaxDelay)
			}
			if now := time.Now(); t.Before(now) {
				t = now // the past means now (and stays inside what a DATETIME column holds)
			}
			msg.DeliverAt = t
		}
		if len(m.Headers) > 0 {
			h, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, at("headers: %v", err)
			}
			if len(h) > l.MaxHeaders {
				return nil, fail(CodePayloadTooLarge, fmt.Sprintf("messages[%d]: headers are %d bytes encoded as JSON, at most %d allowed", i, len(h), l.MaxHeaders))
			}
			msg.Headers = h
		}
		out[i] = msg
	}
	return out, nil
}

type claimRequest struct {
	Max          *int   `json:"max"`
	VisibilityMS *int64 `json:"visibility_timeout_ms"`
	WaitMS       *int64 `json:"wait_ms"`
	MaxBytes     *int64 `json:"max_bytes"`
	Consumer     string `json:"consumer"`
	ErrorCode    string `json:"error_code"` // dead-letter channel only
}

type claimedMessage struct {
	messageBody
	Attempt      int    `json:"attempt"`
	Receipt      string `json:"receipt"`
	LeaseExpires string `json:"lease_expires_at"`
	ErrorCode    string `json:"error_code,omitempty"` // dead-letter channel: why it died
}

func (s *Server) claim(w http.ResponseWriter, r *http.Request) { s.claimWith(w, r, false) }

// claimWith serves a claim on the subscription (dead false) or on its
// dead-letter channel (dead true), which may filter by error_code.
func (s *Server) claimWith(w http.ResponseWriter, r *http.Request, dead bool) {
	topic, sub, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	var req claimRequest
	if e := s.decodeOptional(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.ErrorCode != "" && !dead {
		writeError(w, fail(CodeInvalidRequest, "error_code filters only the dead-letter channel (…/dead-letters/claim)"))
		return
	}
	l := s.limits
	cr := broker.ClaimRequest{Topic: topic, Subscription: sub, Consumer: req.Consumer, Max: 1, Lease: l.DefaultLease,
		Dead: dead, ErrorCode: req.ErrorCode, MaxBytes: l.MaxClaimBytes}
	if req.MaxBytes != nil {
		if *req.MaxBytes < 1 || *req.MaxBytes > int64(l.MaxClaimBytes) {
			writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("max_bytes must be 1-%d", l.MaxClaimBytes)))
			return
		}
		cr.MaxBytes = int(*req.MaxBytes)
	}
	if req.Max != nil {
		if *req.Max < 1 || *req.Max > l.MaxClaim {
			writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("max must be 1-%d", l.MaxClaim)))
			return
		}
		cr.Max = *req.Max
	}
	if req.VisibilityMS != nil {
		v, e := millis("visibility_timeout_ms", *req.VisibilityMS, time.Millisecond, l.MaxLease)
		if e != nil {
			writeError(w, e)
			return
		}
		cr.Lease = v
	}
	if req.WaitMS != nil {
		v, e := millis("wait_ms", *req.WaitMS, 0, l.MaxWait)
		if e != nil {
			writeError(w, e)
			return
		}
		cr.Wait = v
	}
	if len(req.Consumer) > maxConsumer {
		writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("consumer is longer than %d bytes", maxConsumer)))
		return
	}
	if len(req.ErrorCode) > maxErrorCode {
		writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("error_code is longer than %d bytes", maxErrorCode)))
		return
	}
	if cr.Consumer == "" {
		cr.Consumer = consumerOf(r)
	}
	ctx := forward.WithRequest(r.Context(), r)
	var got []broker.Delivery
	var err error
	if cluster := r.Header.Get(forward.ClusterHeader); cluster != "" && !dead {
		// Another router's claim, for the one cluster whose unit this
		// router owns (docs/consume.md, "Owners").
		got, err = s.b.ClaimCluster(ctx, cluster, cr)
	} else {
		got, err = s.b.Claim(ctx, cr)
	}
	switch {
	case errors.Is(err, broker.ErrUnknownSubscription):
		writeError(w, fail(CodeUnknownSubscription, fmt.Sprintf("topic %s has no subscription %s", topic, sub)))
		return
	case err != nil:
		writeError(w, s.failure(r, fmt.Errorf("claim %s/%s: %w", topic, sub, err)))
		return
	}
	s.writeClaimed(w, got)
}

// writeClaimed answers a claim with the deliveries got (appendClaimed).
func (s *Server) writeClaimed(w http.ResponseWriter, got []broker.Delivery) {
	buf := getBuffer()
	defer putBuffer(buf)
	var err error
	if buf.b, err = s.appendClaimed(buf.b, got); err != nil {
		buf.b = buf.b[:0] // as encoding/json: the status alone
	}
	writeBody(w, http.StatusOK, buf.b)
}

// ackRequest is an ack's body: receipts only (a visibility timeout there
// is a misplaced field, refused as unknown).
type ackRequest struct {
	Receipts []string `json:"receipts"`
}

type extendRequest struct {
	Receipts     []string `json:"receipts"`
	VisibilityMS *int64   `json:"visibility_timeout_ms"`
}

type leaseResult struct {
	Receipt string             `json:"receipt"`
	Status  domain.LeaseStatus `json:"status"`
	Expires string             `json:"lease_expires_at,omitempty"`
	Error   *apiError          `json:"error,omitempty"`
}

// receipts decodes req, an ack's or extend's body whose receipts are
// *list, and reads the receipts.
func (s *Server) receipts(w http.ResponseWriter, r *http.Request, req any, list *[]string) ([]broker.Receipt, bool) {
	body, e := s.readBody(w, r)
	if e == nil {
		e = decodeReceiptsBody(body, req)
	}
	if e != nil {
		writeError(w, e)
		return nil, false
	}
	if len(*list) == 0 {
		writeError(w, fail(CodeInvalidRequest, "receipts must hold at least one receipt"))
		return nil, false
	}
	if len(*list) > s.limits.MaxBatch {
		writeError(w, fail(CodeBatchTooLarge, fmt.Sprintf("at most %d receipts per request", s.limits.MaxBatch)))
		return nil, false
	}
	rs, e := s.decodeReceipts(*list)
	if e != nil {
		writeError(w, e)
		return nil, false
	}
	return rs, true
}

// decodeReceiptsBody is decodeStrict for an ack's or extend's body, with
// a fast path for the ack body clients send, {"receipts":[…]} of plain
// strings (encoding/json's decoder was a third of an ack's CPU).
func decodeReceiptsBody(body []byte, req any) *apiError {
	if a, ok := req.(*ackRequest); ok {
		if list, ok := plainReceiptList(body); ok {
			a.Receipts = list
			return nil
		}
	}
	return decodeStrict(body, req)
}

// plainReceiptList reads body when it is {"receipts":["…",…]} (JSON
// whitespace between tokens allowed) with at least one string, each of
// printable ASCII with nothing escaped: a body decodeStrict decodes into
// the same list (FuzzPlainReceiptList). Anything else is no verdict and is
// left to decodeStrict. The strings share one copy of body.
func plainReceiptList(body []byte) ([]string, bool) {
	text := string(body)
	i := 0
	expect := func(tok string) bool {
		i = skipSpace(text, i)
		if !strings.HasPrefix(text[i:], tok) {
			return false
		}
		i += len(tok)
		return true
	}
	if !expect(`{`) || !expect(`"receipts"`) || !expect(`:`) || !expect(`[`) {
		return nil, false
	}
	list := make([]string, 0, strings.Count(text[i:], ",")+1)
	for {
		if !expect(`"`) {
			return nil, false
		}
		j := i
		for j < len(text) && plainByte[text[j]] {
			j++
		}
		if j == len(text) || text[j] != '"' {
			return nil, false
		}
		list = append(list, text[i:j])
		i = j + 1
		if !expect(`,`) {
			break
		}
	}
	if !expect(`]`) || !expect(`}`) || skipSpace(text, i) != len(text) {
		return nil, false
	}
	return list, true
}

// skipSpace returns the index of the first byte from i on that is not
// JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

func (s *Server) writeLeaseResults(w http.ResponseWriter, r *http.Request, receipts []string, res []broker.LeaseResult) {
	out := make([]leaseResult, len(res))
	hide := s.hider(r)
	for i, lr := range res {
		out[i] = leaseResult{Receipt: receipts[i], Status: lr.Status, Expires: formatTime(lr.Expires)}
		if lr.Status == domain.LeaseUnavailable {
			w.Header().Set("Retry-After", retryAfterSeconds)
			if lr.Err != nil {
				out[i].Error = hide(CodeUnavailable, lr.Err)
			}
		}
	}
	buf := getBuffer()
	defer putBuffer(buf)
	buf.b = appendLeaseResults(buf.b, out)
	writeBody(w, http.StatusOK, buf.b)
}

func (s *Server) ack(w http.ResponseWriter, r *http.Request) {
	var req ackRequest
	rs, ok := s.receipts(w, r, &req, &req.Receipts)
	if !ok {
		return
	}
	ctx := forward.WithRequest(r.Context(), r)
	if r.Header.Get(forward.Header) != "" {
		s.writeLeaseResults(w, r, req.Receipts, s.b.AckHere(ctx, rs))
		return
	}
	s.writeLeaseResults(w, r, req.Receipts, s.b.Ack(ctx, rs))
}

func (s *Server) extend(w http.ResponseWriter, r *http.Request) {
	var req extendRequest
	rs, ok := s.receipts(w, r, &req, &req.Receipts)
	if !ok {
		return
	}
	lease := s.limits.DefaultLease
	if req.VisibilityMS != nil {
		var e *apiError
		if lease, e = millis("visibility_timeout_ms", *req.VisibilityMS, time.Millisecond, s.limits.MaxLease); e != nil {
			writeError(w, e)
			return
		}
	}
	ctx := forward.WithRequest(r.Context(), r)
	if r.Header.Get(forward.Header) != "" {
		s.writeLeaseResults(w, r, req.Receipts, s.b.ExtendHere(ctx, rs, lease))
		return
	}
	s.writeLeaseResults(w, r, req.Receipts, s.b.Extend(ctx, rs, lease))
}

type nackRequest struct {
	Items []struct {
		Receipt      string `json:"receipt"`
		ErrorCode    string `json:"error_code"`
		Error        string `json:"error"`
		RetryAfterMS *int64 `json:"retry_after_ms"`
	} `json:"items"`
}

type nackResult struct {
	Receipt       string            `json:"receipt"`
	Status        domain.NackStatus `json:"status"`
	NextAttemptAt string            `json:"next_attempt_at,omitempty"`
	Error         *apiError         `json:"error,omitempty"`
}

func (s *Server) nack(w http.ResponseWriter, r *http.Request) {
	var req nackRequest
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if len(req.Items) == 0 {
		writeError(w, fail(CodeInvalidRequest, "items must hold at least one item"))
		return
	}
	if len(req.Items) > s.limits.MaxBatch {
		writeError(w, fail(CodeBatchTooLarge, fmt.Sprintf("at most %d items per request", s.limits.MaxBatch)))
		return
	}
	items := make([]broker.NackItem, len(req.Items))
	for i, it := range req.Items {
		rc, err := s.b.DecodeReceipt(it.Receipt)
		if err != nil {
			writeError(w, fail(CodeInvalidReceipt, fmt.Sprintf("items[%d].receipt is not a receipt issued by shardmq", i)))
			return
		}
		if len(it.ErrorCode) > maxErrorCode {
			writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("items[%d].error_code is longer than %d bytes", i, maxErrorCode)))
			return
		}
		// Kept for the trace; a longer error is cut at a character boundary, not refused.
		items[i] = broker.NackItem{Receipt: rc, ErrorCode: it.ErrorCode, Error: cutUTF8(it.Error, maxLastError)}
		if it.RetryAfterMS != nil {
			d, e := millis(fmt.Sprintf("items[%d].retry_after_ms", i), *it.RetryAfterMS, 0, s.limits.MaxDelay)
			if e != nil {
				writeError(w, e)
				return
			}
			// Given, it replaces the backoff: 0 is "claimable again at once".
			items[i].RetryAfter, items[i].RetryNow = d, d == 0
		}
	}
	ctx := forward.WithRequest(r.Context(), r)
	var res []broker.NackResult
	if r.Header.Get(forward.Header) != "" {
		res = s.b.NackHere(ctx, items)
	} else {
		res = s.b.Nack(ctx, items)
	}
	out := make([]nackResult, len(res))
	hide := s.hider(r)
	for i, nr := range res {
		out[i] = nackResult{Receipt: req.Items[i].Receipt, Status: nr.Status, NextAttemptAt: formatTime(nr.NextAttemptAt)}
		if nr.Status == domain.NackUnavailable {
			w.Header().Set("Retry-After", retryAfterSeconds)
			if nr.Err != nil {
				out[i].Error = hide(CodeUnavailable, nr.Err)
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": out})
}
