package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Router is the router's HTTP API as a Target.
type Router struct {
	base       string
	pool       *connPool
	poolErr    error
	durability string
	timeout    time.Duration
}

var _ Target = (*Router)(nil)

// NewRouter talks to the router at base (e.g. http://127.0.0.1:8080),
// keeping up to conns idle keep-alive connections so that every worker
// reuses its own (see connPool for why not net/http's client). durability
// is sent with every produce ("" for the router's default). Each request
// is bounded by 30 s (a claim by 30 s plus its wait).
func NewRouter(base string, conns int, durability string) *Router {
	base = strings.TrimSuffix(base, "/")
	pool, err := newConnPool(base, conns)
	return &Router{base: base, pool: pool, poolErr: err, durability: durability, timeout: 30 * time.Second}
}

// SetToken makes every request carry Authorization: Bearer token (a router
// with a token file asks for one; docs/security.md). Call it before the
// first request.
func (r *Router) SetToken(token string) {
	if r.pool != nil && token != "" {
		r.pool.auth = "Bearer " + token
	}
}

// Name implements Target.
func (r *Router) Name() string { return "router" }

// Close closes the connections.
func (r *Router) Close() {
	if r.pool != nil {
		r.pool.close()
	}
}

func (r *Router) do(ctx context.Context, method, path string, body []byte, timeout time.Duration, out any) error {
	if r.poolErr != nil {
		return r.poolErr
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := r.pool.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	data := resp.body
	if resp.status < 200 || resp.status > 299 {
		re := &RequestError{Status: resp.status, Code: "http_" + strconv.Itoa(resp.status), Message: strings.TrimSpace(string(data))}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
			re.Code, re.Message = e.Error.Code, e.Error.Message
		}
		if s, err := strconv.Atoi(resp.retryAfter); err == nil {
			re.RetryAfter = time.Duration(s) * time.Second
		}
		return re
	}
	if out == nil {
		return nil
	}
	if d, ok := out.(rawDecoder); ok {
		err = d.decodeJSON(data)
	} else {
		err = json.Unmarshal(data, out)
	}
	if err != nil {
		return &RequestError{Status: resp.status, Code: "bad_response", Message: err.Error()}
	}
	return nil
}

// rawDecoder is an answer that decodes itself (claimAnswer).
type rawDecoder interface{ decodeJSON(data []byte) error }

// Produce implements Target.
func (r *Router) Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error) {
	n := 64
	for _, m := range msgs {
		n += len(m.Key) + len(m.OrderKey) + len(m.Payload) + 48
	}
	b := make([]byte, 0, n)
	b = append(b, `{"messages":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendJSONString(b, m.Key)
		if m.OrderKey != "" {
			b = append(b, `,"order_key":`...)
			b = appendJSONString(b, m.OrderKey)
		}
		b = append(b, `,"payload":`...)
		b = append(b, m.Payload...)
		b = append(b, '}')
	}
	b = append(b, ']')
	if r.durability != "" {
		b = append(b, `,"durability":`...)
		b = appendJSONString(b, r.durability)
	}
	b = append(b, '}')
	var out struct {
		Results []struct {
			ID     string `json:"id"`
			VShard int    `json:"vshard"`
			Status string `json:"status"`
			Error  *struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"results"`
	}
	if err := r.do(ctx, http.MethodPost, "/v1/topics/"+url.PathEscape(topic)+"/messages", b, r.timeout, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(msgs) {
		return nil, &RequestError{Status: 200, Code: "bad_response", Message: fmt.Sprintf("%d results for %d messages", len(out.Results), len(msgs))}
	}
	res := make([]ProduceResult, len(msgs))
	for i, o := range out.Results {
		res[i] = ProduceResult{Status: o.Status, VShard: o.VShard}
		res[i].ID, _ = strconv.ParseUint(o.ID, 10, 64)
		if o.Error != nil {
			res[i].Code = o.Error.Code
		}
	}
	return res, nil
}

// appendJSONString appends s as a JSON string. Keys made by this package
// need no escaping; anything else is encoded properly.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Claim implements Target.
func (r *Router) Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	body, _ := json.Marshal(map[string]any{
		"max": req.Max, "visibility_timeout_ms": req.Lease.Milliseconds(), "wait_ms": req.Wait.Milliseconds(), "consumer": req.Consumer,
	})
	var out claimAnswer
	path := "/v1/topics/" + url.PathEscape(req.Topic) + "/subscriptions/" + url.PathEscape(req.Subscription) + "/claim"
	if err := r.do(ctx, http.MethodPost, path, body, r.timeout+req.Wait, &out); err != nil {
		return nil, err
	}
	return out.deliveries, nil
}

type statusResults struct {
	Results []struct {
		Status string `json:"status"`
	} `json:"results"`
}

func (s statusResults) list(n int) ([]string, error) {
	if len(s.Results) != n {
		return nil, &RequestError{Status: 200, Code: "bad_response", Message: fmt.Sprintf("%d results for %d items", len(s.Results), n)}
	}
	out := make([]string, n)
	for i, r := range s.Results {
		out[i] = r.Status
	}
	return out, nil
}

// Ack implements Target.
func (r *Router) Ack(ctx context.Context, receipts []Receipt) ([]string, error) {
	texts := make([]string, len(receipts))
	for i, rc := range receipts {
		texts[i] = rc.text
	}
	body, _ := json.Marshal(map[string]any{"receipts": texts})
	var out statusResults
	if err := r.do(ctx, http.MethodPost, "/v1/ack", body, r.timeout, &out); err != nil {
		return nil, err
	}
	return out.list(len(receipts))
}

// Nack implements Target.
func (r *Router) Nack(ctx context.Context, items []NackItem) ([]string, error) {
	type item struct {
		Receipt      string `json:"receipt"`
		ErrorCode    string `json:"error_code"`
		Error        string `json:"error"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	}
	list := make([]item, len(items))
	for i, it := range items {
		list[i] = item{Receipt: it.Receipt.text, ErrorCode: it.Code, Error: "load test nack", RetryAfterMS: it.RetryAfter.Milliseconds()}
	}
	body, _ := json.Marshal(map[string]any{"items": list})
	var out statusResults
	if err := r.do(ctx, http.MethodPost, "/v1/nack", body, r.timeout, &out); err != nil {
		return nil, err
	}
	return out.list(len(items))
}

// Subscribe implements Target with PUT /v1/topics/{topic}/subscriptions/{sub}.
func (r *Router) Subscribe(ctx context.Context, topic string, subs []string, maxAttempts int) error {
	for _, s := range subs {
		body, _ := json.Marshal(map[string]any{"max_attempts": maxAttempts})
		err := r.do(ctx, http.MethodPut, "/v1/topics/"+url.PathEscape(topic)+"/subscriptions/"+url.PathEscape(s), body, r.timeout, nil)
		if err != nil {
			return fmt.Errorf("create subscription %s/%s (the router needs the subscriptions API of DESIGN §5 for more than the default subscription): %w", topic, s, err)
		}
	}
	return nil
}

// Ready waits until GET /readyz answers 200, polling every 100 ms.
func (r *Router) Ready(ctx context.Context) error {
	if r.poolErr != nil {
		return r.poolErr
	}
	for {
		err := r.do(ctx, http.MethodGet, "/readyz", nil, time.Second, nil)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("router %s not ready: %w (last: %v)", r.base, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
