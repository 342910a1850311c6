package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/api/apitest"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
)

// The fuzz targets below feed arbitrary bodies (and query strings) to each
// request decoder through the whole handler, over a recording broker, and
// check that
//   - nothing panics and every answer is JSON in valid UTF-8;
//   - a refused request (4xx) never reached the broker;
//   - what did reach the broker is within every limit: a body that is not
//     valid UTF-8, or holds a duplicate key, never gets there.
// `make fuzz` (part of `make test`) runs each for a few seconds; the seeds
// are the tables of strict_test.go plus valid requests.

// fuzzSeeds are the bodies of badRequests aimed at target, and good.
func fuzzSeeds(f *testing.F, target string, good ...string) {
	for _, tc := range apitest.BadRequests(testReceipt(f)) {
		if tc.Target == target {
			f.Add([]byte(tc.Body))
		}
	}
	for _, g := range good {
		f.Add([]byte(g))
	}
}

// serveFuzz serves body and checks the properties common to every target;
// it returns the broker calls the request made.
func serveFuzz(t *testing.T, s *Server, b *recordingBroker, method, target string, body []byte) []call {
	t.Helper()
	rec := do(s, method, target, body)
	calls := b.taken()
	if !utf8.Valid(rec.Body.Bytes()) || !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("answer %d is not JSON in UTF-8: %q", rec.Code, rec.Body)
	}
	if rec.Code >= 400 {
		if len(calls) > 0 {
			t.Fatalf("refused with %d (%s) but reached the broker: %+v", rec.Code, rec.Body, calls)
		}
		var out struct{ Error *apiError }
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Error == nil || out.Error.Code == "" {
			t.Fatalf("answer %d is not the error shape: %q", rec.Code, rec.Body)
		}
		return nil
	}
	if rec.Code != http.StatusOK && rec.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if len(body) > 0 && (!utf8.Valid(body) || checkJSON(body) != nil) {
		t.Fatalf("a body with invalid UTF-8 or a duplicate key was accepted: %q", body)
	}
	return calls
}

func validText(t *testing.T, field, v string, max int) {
	t.Helper()
	if len(v) > max || !utf8.ValidString(v) {
		t.Fatalf("%s reached the broker as %q (%d bytes)", field, v, len(v))
	}
}

func FuzzProduce(f *testing.F) {
	const target = "/v1/topics/orders/messages"
	fuzzSeeds(f, target,
		`{"messages":[{"key":"order-42-paid","payload":{"order":42,"amount":"19.90"},"transaction_id":"tx-9"}]}`,
		`{"messages":[{"payload_base64":"AAEC/w==","headers":{"a":"b"},"priority":9,"delay_ms":5,"order_key":"o"}],"durability":"replicated"}`,
		`{"messages":[{"payload":"\ud83d\ude00","deliver_at":"2026-01-02T03:04:05Z"}]}`)
	s, b := newTestServer(f)
	l := s.limits
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range serveFuzz(t, s, b, "POST", target, body) {
			if c.op != "produce" {
				t.Fatalf("produce called %s", c.op)
			}
			msgs := c.args[1].([]broker.Message)
			if len(msgs) == 0 || len(msgs) > l.MaxBatch {
				t.Fatalf("%d messages reached the broker", len(msgs))
			}
			for _, m := range msgs {
				validText(t, "key", m.Key, l.MaxKey)
				validText(t, "order_key", m.OrderKey, l.MaxKey)
				validText(t, "transaction_id", m.TransactionID, l.MaxKey)
				if len(m.Payload) > l.MaxPayload || m.PayloadJSON && (!json.Valid(m.Payload) || !utf8.Valid(m.Payload) || checkJSON(m.Payload) != nil) {
					t.Fatalf("payload %q (json %v) reached the broker", m.Payload, m.PayloadJSON)
				}
				if len(m.Headers) > l.MaxHeaders || m.Headers != nil && (!utf8.Valid(m.Headers) || !json.Valid(m.Headers)) {
					t.Fatalf("headers %q reached the broker", m.Headers)
				}
				if m.Priority < 0 || m.Priority > 9 || m.Delay < 0 || m.Delay > l.MaxDelay || time.Until(m.DeliverAt) > l.MaxDelay {
					t.Fatalf("priority %d, delay %v, deliver_at %v reached the broker", m.Priority, m.Delay, m.DeliverAt)
				}
				if !m.DeliverAt.IsZero() && m.DeliverAt.Year() < 2000 {
					t.Fatalf("deliver_at %v reached the broker", m.DeliverAt)
				}
			}
		}
	})
}

func FuzzClaim(f *testing.F) {
	const target = "/v1/topics/orders/subscriptions/default/claim"
	fuzzSeeds(f, target, `{"max":10,"visibility_timeout_ms":30000,"wait_ms":1000,"consumer":"worker-7"}`, ``, `{}`)
	fuzzSeeds(f, "/v1/topics/orders/subscriptions/default/dead-letters/claim", `{"max":10,"error_code":"E_STOCK"}`)
	s, b := newTestServer(f)
	l := s.limits
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, dead := range []bool{false, true} {
			path := target
			if dead {
				path = "/v1/topics/orders/subscriptions/default/dead-letters/claim"
			}
			for _, c := range serveFuzz(t, s, b, "POST", path, body) {
				req := c.args[0].(broker.ClaimRequest)
				if req.Max < 1 || req.Max > l.MaxClaim || req.Lease < time.Millisecond || req.Lease > l.MaxLease || req.Wait < 0 || req.Wait > l.MaxWait {
					t.Fatalf("claim %+v reached the broker", req)
				}
				validText(t, "consumer", req.Consumer, maxConsumer)
				validText(t, "error_code", req.ErrorCode, maxErrorCode)
				if req.Dead != dead || !dead && req.ErrorCode != "" {
					t.Fatalf("claim %+v on %s", req, path)
				}
			}
		}
	})
}

func FuzzAckExtend(f *testing.F) {
	rc := testReceipt(f)
	fuzzSeeds(f, "/v1/ack", `{"receipts":["`+rc+`"]}`)
	fuzzSeeds(f, "/v1/extend", `{"receipts":["`+rc+`"],"visibility_timeout_ms":60000}`)
	s, b := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/ack", "/v1/extend"} {
			for _, c := range serveFuzz(t, s, b, "POST", path, body) {
				rs := c.args[0].([]broker.Receipt)
				if len(rs) == 0 || len(rs) > s.limits.MaxBatch {
					t.Fatalf("%d receipts reached the broker", len(rs))
				}
				checkReceipts(t, rs...)
				if c.op == "extend" {
					if d := c.args[1].(time.Duration); d < time.Millisecond || d > s.limits.MaxLease {
						t.Fatalf("lease %v reached the broker", d)
					}
				}
			}
		}
	})
}

func checkReceipts(t *testing.T, rs ...broker.Receipt) {
	t.Helper()
	for _, r := range rs {
		if !topology.NameRE.MatchString(r.Topic) || !topology.NameRE.MatchString(r.Subscription) || r.Token == 0 {
			t.Fatalf("receipt %+v reached the broker", r)
		}
	}
}

func FuzzNack(f *testing.F) {
	rc := testReceipt(f)
	fuzzSeeds(f, "/v1/nack", `{"items":[{"receipt":"`+rc+`","error_code":"E_STOCK","error":"out of stock","retry_after_ms":100}]}`)
	s, b := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range serveFuzz(t, s, b, "POST", "/v1/nack", body) {
			items := c.args[0].([]broker.NackItem)
			if len(items) == 0 || len(items) > s.limits.MaxBatch {
				t.Fatalf("%d items reached the broker", len(items))
			}
			for _, it := range items {
				checkReceipts(t, it.Receipt)
				validText(t, "error_code", it.ErrorCode, maxErrorCode)
				validText(t, "error", it.Error, maxLastError)
				if it.RetryAfter < 0 || it.RetryAfter > s.limits.MaxDelay {
					t.Fatalf("retry_after %v reached the broker", it.RetryAfter)
				}
			}
		}
	})
}

func FuzzSubscriptionPut(f *testing.F) {
	const target = "/v1/topics/orders/subscriptions/billing"
	fuzzSeeds(f, target, `{"max_attempts":3,"backoff":{"initial_ms":500,"max_ms":60000,"multiplier":2,"jitter":0.2},"ordered":true,`+
		`"dead_letter_alarm":{"growth_percent":50,"window":"1h"}}`, ``)
	s, b := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range serveFuzz(t, s, b, "PUT", target, body) {
			if c.op != "put_subscription" {
				t.Fatalf("PUT called %s", c.op)
			}
			if err := c.args[0].(subscription.Subscription).WithDefaults().Validate(); err != nil {
				t.Fatalf("an invalid subscription reached the broker: %v", err)
			}
		}
	})
}

func FuzzRedrive(f *testing.F) {
	const target = "/v1/topics/orders/subscriptions/default/dead-letters/redrive"
	fuzzSeeds(f, target, `{"ids":["1","18446744073709551615"]}`, `{"error_code":"E_STOCK"}`, `{"all":true}`,
		`{"error_code":"E_STOCK","dry_run":true}`, `{"ids":["7"],"dry_run":false}`)
	s, b := newTestServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, c := range serveFuzz(t, s, b, "POST", target, body) {
			ids, code := c.args[2].([]uint64), c.args[3].(string)
			validText(t, "error_code", code, maxErrorCode)
			if len(ids) > s.limits.MaxBatch {
				t.Fatalf("%d ids reached the broker", len(ids))
			}
			for _, id := range ids {
				if id == 0 {
					t.Fatal("id 0 reached the broker")
				}
			}
		}
	})
}

// FuzzQuery fuzzes the query strings of the endpoints that take one (dead
// letters list and purge, trace) and of one that takes none.
func FuzzQuery(f *testing.F) {
	for _, tc := range apitest.BadRequests(testReceipt(f)) {
		if _, q, ok := strings.Cut(tc.Target, "?"); ok {
			f.Add(q)
		}
	}
	for _, q := range []string{"", "limit=10", "error_code=E_STOCK&limit=1000&cursor=abc", "topic=orders&order_key=o%20k"} {
		f.Add(q)
	}
	s, b := newTestServer(f)
	f.Fuzz(func(t *testing.T, q string) {
		for _, p := range []struct{ method, path string }{
			{"GET", "/v1/topics/orders/subscriptions/default/dead-letters"},
			{"DELETE", "/v1/topics/orders/subscriptions/default/dead-letters"},
			{"GET", "/v1/messages/k/trace"},
			{"GET", "/v1/transactions/tx-9"},
		} {
			target := p.path + "?" + q
			if !validRequestTarget(target) {
				return
			}
			rec := do(s, p.method, target, nil)
			calls := b.taken()
			if !json.Valid(rec.Body.Bytes()) || !utf8.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %s: answer %q", p.method, target, rec.Body)
			}
			if rec.Code == http.StatusBadRequest && len(calls) > 0 {
				t.Fatalf("%s %s refused but reached the broker: %+v", p.method, target, calls)
			}
			for _, c := range calls {
				for _, a := range c.args {
					if s, ok := a.(string); ok && !utf8.ValidString(s) {
						t.Fatalf("%s %s: %q reached the broker", p.method, target, s)
					}
					if n, ok := a.(int); ok && c.op == "list_dead" && (n < 1 || n > maxDeadPage) {
						t.Fatalf("%s %s: limit %d reached the broker", p.method, target, n)
					}
				}
			}
		}
	})
}

// validRequestTarget reports whether an HTTP server would route target to
// a handler at all (httptest.NewRequest panics on what it would refuse).
func validRequestTarget(target string) bool {
	for i := 0; i < len(target); i++ {
		if c := target[i]; c <= ' ' || c == 0x7f || c >= 0x80 {
			return false
		}
	}
	return true
}

// FuzzDecodeReceipt: the receipt parser never panics, accepts only
// receipts naming a valid topic and subscription, and its text form is
// canonical (one receipt, one string).
func FuzzDecodeReceipt(f *testing.F) {
	f.Add(testReceipt(f))
	f.Add("")
	f.Add("AQAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("AwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	r := broker.Receipt{VShard: 1023, Topic: strings.Repeat("t", 128)}
	r.MessageID, r.Token, r.Subscription, r.Ordered = 1<<63, 1, strings.Repeat("s", 128), true
	f.Add(testReceipts.Encode(r))
	f.Fuzz(func(t *testing.T, s string) {
		r, err := testReceipts.Decode(s)
		if err != nil {
			return
		}
		checkReceipts(t, r)
		if again := testReceipts.Encode(r); again != s {
			t.Fatalf("receipt %q decodes to %+v which encodes as %q", s, r, again)
		}
	})
}

// FuzzCheckJSON compares checkJSON with a slow reference on valid JSON: a
// token walk of encoding/json that remembers each object's keys.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":{"b":[{"c":1,"\u0063":2}]}}`, `["\ud83d\ude00","\udc00"]`, `{"":1,"\"":2,"\\":3}`, "\"\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got := checkJSON(b)
		if !json.Valid(b) {
			return
		}
		if !utf8.Valid(b) {
			if got == nil {
				t.Fatalf("invalid UTF-8 passed: %q", b)
			}
			return
		}
		want, dup := referenceDuplicate(b)
		switch {
		case got == nil && dup:
			t.Fatalf("%q: checkJSON found nothing, the reference a duplicate %q", b, want)
		case got != nil && !dup && !strings.Contains(got.what, "surrogate"):
			t.Fatalf("%q: checkJSON found %v, the reference nothing", b, got)
		}
	})
}

func referenceDuplicate(b []byte) (string, bool) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	type obj struct {
		keys      map[string]bool
		expectKey bool
	}
	var stack []*obj
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *obj
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				if top != nil && top.keys != nil {
					top.expectKey = true
				}
				stack = append(stack, &obj{keys: map[string]bool{}, expectKey: true})
			case '[':
				if top != nil && top.keys != nil {
					top.expectKey = true
				}
				stack = append(stack, &obj{})
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if top != nil && top.keys != nil && top.expectKey {
				if top.keys[v] {
					return v, true
				}
				top.keys[v] = true
				top.expectKey = false
				continue
			}
			if top != nil && top.keys != nil {
				top.expectKey = true
			}
		default:
			if top != nil && top.keys != nil {
				top.expectKey = true
			}
		}
	}
}
