package api

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

func testReceipt(t testing.TB) string {
	t.Helper()
	r := broker.Receipt{VShard: 7, Topic: "orders"}
	r.MessageID, r.Token, r.Subscription = 42, 9, "default"
	return r.Encode()
}

// headersOf returns a headers object whose JSON encoding is n bytes.
func headersOf(n int) string {
	return `{"h":"` + strings.Repeat("x", n-len(`{"h":""}`)) + `"}`
}

type badRequest struct {
	name, method, target, body string
	status                     int
	code, says                 string // says: a part of the message
}

// badRequests is every kind of request the API must refuse whole: each
// answers 4xx in the JSON error shape and never reaches the broker. The
// server package runs the same table against real MariaDB (no row written).
func badRequests(receipt string) []badRequest {
	const produce = "/v1/topics/orders/messages"
	const claim = "/v1/topics/orders/subscriptions/default/claim"
	const sub = "/v1/topics/orders/subscriptions/billing"
	const dead = "/v1/topics/orders/subscriptions/default/dead-letters"
	one := func(fields string) string { return `{"messages":[{"payload":{"a":1}` + fields + `}]}` }
	rc := `"` + receipt + `"`
	maxI64 := fmt.Sprint(int64(math.MaxInt64))
	return []badRequest{
		// invalid UTF-8 and lone surrogates, anywhere
		{"key invalid UTF-8", "POST", produce, one(`,"key":"coll` + "\xff" + `"`), 400, CodeInvalidRequest, "messages[0].key: string is not valid UTF-8"},
		{"order_key invalid UTF-8", "POST", produce, one(`,"order_key":"o` + "\xfe" + `"`), 400, CodeInvalidRequest, "messages[0].order_key"},
		{"transaction_id invalid UTF-8", "POST", produce, one(`,"transaction_id":"` + "\xc3\x28" + `"`), 400, CodeInvalidRequest, "messages[0].transaction_id"},
		{"header name invalid UTF-8", "POST", produce, one(`,"headers":{"a` + "\xff" + `":"v"}`), 400, CodeInvalidRequest, "object key"},
		{"header value invalid UTF-8", "POST", produce, one(`,"headers":{"a":"` + "\xed\xa0\x80" + `"}`), 400, CodeInvalidRequest, "messages[0].headers.a"},
		{"payload string invalid UTF-8", "POST", produce, `{"messages":[{"payload":{"s":"` + "\x80" + `"}}]}`, 400, CodeInvalidRequest, "messages[0].payload.s"},
		{"payload key invalid UTF-8", "POST", produce, `{"messages":[{"payload":{"` + "\xf8" + `":1}}]}`, 400, CodeInvalidRequest, "not valid UTF-8"},
		{"key lone surrogate", "POST", produce, one(`,"key":"coll\udcff"`), 400, CodeInvalidRequest, "lone surrogate"},
		{"key high surrogate alone", "POST", produce, one(`,"key":"coll\ud800x"`), 400, CodeInvalidRequest, "lone surrogate"},
		{"UTF-8 outside strings", "POST", produce, "\xff" + one(""), 400, CodeInvalidRequest, "UTF-8"},
		{"claim consumer invalid UTF-8", "POST", claim, `{"consumer":"w` + "\xff" + `"}`, 400, CodeInvalidRequest, "consumer"},
		{"ack receipt invalid UTF-8", "POST", "/v1/ack", `{"receipts":["` + "\xff" + `"]}`, 400, CodeInvalidRequest, "receipts[0]"},
		{"nack error invalid UTF-8", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"error":"` + "\xff" + `"}]}`, 400, CodeInvalidRequest, "items[0].error"},
		{"subscription invalid UTF-8", "PUT", sub, `{"dead_letter_alarm":{"window":"1h` + "\xff" + `"}}`, 400, CodeInvalidRequest, "dead_letter_alarm.window"},
		{"redrive invalid UTF-8", "POST", dead + "/redrive", `{"error_code":"E` + "\xff" + `"}`, 400, CodeInvalidRequest, "error_code"},
		// unknown fields
		{"produce unknown top field", "POST", produce, `{"messages":[{"payload":1}],"durabilty":"replicated"}`, 400, CodeInvalidRequest, `unknown field "durabilty"`},
		{"produce unknown message field", "POST", produce, one(`,"prio":3`), 400, CodeInvalidRequest, `unknown field "prio"`},
		{"claim unknown field", "POST", claim, `{"maxx":5}`, 400, CodeInvalidRequest, `unknown field "maxx"`},
		{"ack unknown field", "POST", "/v1/ack", `{"receipts":[` + rc + `],"reciepts":[]}`, 400, CodeInvalidRequest, `unknown field "reciepts"`},
		{"nack unknown item field", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after":5}]}`, 400, CodeInvalidRequest, `unknown field "retry_after"`},
		{"extend unknown field", "POST", "/v1/extend", `{"receipts":[` + rc + `],"visibility_ms":5}`, 400, CodeInvalidRequest, `unknown field "visibility_ms"`},
		{"subscription unknown field", "PUT", sub, `{"max_attemps":1}`, 400, CodeInvalidRequest, `unknown field "max_attemps"`},
		{"subscription unknown backoff field", "PUT", sub, `{"backoff":{"initial":5}}`, 400, CodeInvalidRequest, `unknown field "initial"`},
		{"redrive unknown field", "POST", dead + "/redrive", `{"al":true}`, 400, CodeInvalidRequest, `unknown field "al"`},
		{"dead claim unknown field", "POST", dead + "/claim", `{"errorcode":"E"}`, 400, CodeInvalidRequest, `unknown field "errorcode"`},
		// duplicate keys, at every depth
		{"produce duplicate top key", "POST", produce, `{"messages":[{"payload":1}],"messages":[{"payload":2}]}`, 400, CodeInvalidRequest, `duplicate object key "messages"`},
		{"produce duplicate message key", "POST", produce, one(`,"key":"a","key":"b"`), 400, CodeInvalidRequest, `messages[0]: duplicate object key "key"`},
		{"produce duplicate escaped key", "POST", produce, one(`,"key":"a","\u006bey":"b"`), 400, CodeInvalidRequest, `duplicate object key "key"`},
		{"produce duplicate header", "POST", produce, one(`,"headers":{"a":"1","a":"2"}`), 400, CodeInvalidRequest, `messages[0].headers: duplicate object key "a"`},
		{"produce duplicate in payload", "POST", produce, `{"messages":[{"payload":{"x":[{"a":1,"b":2,"a":3}]}}]}`, 400, CodeInvalidRequest, `messages[0].payload.x[0]: duplicate object key "a"`},
		{"claim duplicate key", "POST", claim, `{"max":1,"max":1000}`, 400, CodeInvalidRequest, `duplicate object key "max"`},
		{"nack duplicate key", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"receipt":` + rc + `}]}`, 400, CodeInvalidRequest, `items[0]: duplicate object key "receipt"`},
		{"subscription duplicate key", "PUT", sub, `{"max_attempts":3,"max_attempts":1}`, 400, CodeInvalidRequest, `duplicate object key "max_attempts"`},
		{"redrive duplicate key", "POST", dead + "/redrive", `{"all":true,"all":false}`, 400, CodeInvalidRequest, `duplicate object key "all"`},
		// numbers: range-checked before any arithmetic; no floats, strings or overflow
		{"delay_ms max int64", "POST", produce, one(`,"delay_ms":` + maxI64), 400, CodeInvalidRequest, "messages[0].delay_ms must be 0-"},
		{"delay_ms just past int64/1e6", "POST", produce, one(`,"delay_ms":9223372036855`), 400, CodeInvalidRequest, "delay_ms must be"},
		{"delay_ms over int64", "POST", produce, one(`,"delay_ms":9223372036854775808`), 400, CodeInvalidRequest, "delay_ms must be an integer"},
		{"delay_ms negative", "POST", produce, one(`,"delay_ms":-1`), 400, CodeInvalidRequest, "delay_ms must be"},
		{"delay_ms float", "POST", produce, one(`,"delay_ms":1.5`), 400, CodeInvalidRequest, "delay_ms must be an integer"},
		{"delay_ms exponent", "POST", produce, one(`,"delay_ms":1e3`), 400, CodeInvalidRequest, "delay_ms must be an integer"},
		{"delay_ms string", "POST", produce, one(`,"delay_ms":"5"`), 400, CodeInvalidRequest, "delay_ms must be an integer"},
		{"priority 10", "POST", produce, one(`,"priority":10`), 400, CodeInvalidRequest, "priority must be 0-9"},
		{"priority huge", "POST", produce, one(`,"priority":1e400`), 400, CodeInvalidRequest, "priority"},
		{"priority negative", "POST", produce, one(`,"priority":-1`), 400, CodeInvalidRequest, "priority must be 0-9"},
		{"deliver_at past year 9999", "POST", produce, one(`,"deliver_at":"9999-12-31T23:59:59Z"`), 400, CodeInvalidRequest, "deliver_at is more than"},
		{"visibility max int64", "POST", claim, `{"visibility_timeout_ms":` + maxI64 + `}`, 400, CodeInvalidRequest, "visibility_timeout_ms must be 1-"},
		{"visibility wraps to small", "POST", claim, `{"visibility_timeout_ms":9223372036854776}`, 400, CodeInvalidRequest, "visibility_timeout_ms must be 1-"},
		{"visibility zero", "POST", claim, `{"visibility_timeout_ms":0}`, 400, CodeInvalidRequest, "visibility_timeout_ms must be 1-"},
		{"wait_ms max int64", "POST", claim, `{"wait_ms":` + maxI64 + `}`, 400, CodeInvalidRequest, "wait_ms must be 0-"},
		{"wait_ms negative", "POST", claim, `{"wait_ms":-1}`, 400, CodeInvalidRequest, "wait_ms must be 0-"},
		{"max float", "POST", claim, `{"max":2.5}`, 400, CodeInvalidRequest, "max must be an integer"},
		{"max zero", "POST", claim, `{"max":0}`, 400, CodeInvalidRequest, "max must be 1-"},
		{"max huge", "POST", claim, `{"max":9223372036854775807}`, 400, CodeInvalidRequest, "max must be 1-"},
		{"extend visibility max int64", "POST", "/v1/extend", `{"receipts":[` + rc + `],"visibility_timeout_ms":` + maxI64 + `}`, 400, CodeInvalidRequest, "visibility_timeout_ms must be 1-"},
		{"nack retry_after max int64", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after_ms":` + maxI64 + `}]}`, 400, CodeInvalidRequest, "items[0].retry_after_ms must be 0-"},
		{"nack retry_after negative", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after_ms":-5}]}`, 400, CodeInvalidRequest, "retry_after_ms must be 0-"},
		{"backoff initial max int64", "PUT", sub, `{"backoff":{"initial_ms":` + maxI64 + `}}`, 400, CodeInvalidRequest, "backoff.initial_ms"},
		{"backoff multiplier huge", "PUT", sub, `{"backoff":{"multiplier":1e400}}`, 400, CodeInvalidRequest, "backoff.multiplier"},
		{"backoff jitter over 1", "PUT", sub, `{"backoff":{"jitter":1.5}}`, 400, CodeInvalidRequest, "backoff.jitter"},
		{"max_attempts float", "PUT", sub, `{"max_attempts":2.5}`, 400, CodeInvalidRequest, "max_attempts must be an integer"},
		{"max_attempts huge", "PUT", sub, `{"max_attempts":100000}`, 400, CodeInvalidRequest, "max_attempts must be 1-"},
		// sizes that a column could not hold
		{"headers one byte over the column", "POST", produce, one(`,"headers":` + headersOf(store.MaxHeadersBytes+1)), 413, CodePayloadTooLarge, "at most 65535"},
		{"key over the column", "POST", produce, one(`,"key":"` + strings.Repeat("k", store.MaxKeyBytes+1) + `"`), 400, CodeInvalidRequest, "key is 257 bytes"},
		{"error_code over the column", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"error_code":"` + strings.Repeat("E", 65) + `"}]}`, 400, CodeInvalidRequest, "error_code is longer than 64"},
		{"consumer over the column", "POST", claim, `{"consumer":"` + strings.Repeat("c", 129) + `"}`, 400, CodeInvalidRequest, "consumer is longer than 128"},
		// query strings
		{"limit with semicolon", "GET", dead + "?limit=1;DROP", "", 400, CodeInvalidRequest, "query string is malformed"},
		{"limit not a number", "GET", dead + "?limit=abc", "", 400, CodeInvalidRequest, `limit must be an integer 1-1000, got "abc"`},
		{"limit negative", "GET", dead + "?limit=-1", "", 400, CodeInvalidRequest, "limit must be"},
		{"limit huge", "GET", dead + "?limit=99999999999999999999", "", 400, CodeInvalidRequest, "limit must be"},
		{"limit empty", "GET", dead + "?limit=", "", 400, CodeInvalidRequest, "limit must be"},
		{"limit twice", "GET", dead + "?limit=1&limit=2", "", 400, CodeInvalidRequest, "given 2 times"},
		{"bad percent-encoding in query", "GET", dead + "?error_code=%zz", "", 400, CodeInvalidRequest, "query string is malformed"},
		{"invalid UTF-8 in query", "GET", dead + "?error_code=%ff", "", 400, CodeInvalidRequest, "not valid UTF-8"},
		{"unknown query parameter", "GET", dead + "?limt=5", "", 400, CodeInvalidRequest, `unknown query parameter "limt"`},
		{"query on produce", "POST", produce + "?durability=replicated", one(""), 400, CodeInvalidRequest, `unknown query parameter "durability"`},
		{"purge with bad query", "DELETE", dead + "?error_code=E&x=1", "", 400, CodeInvalidRequest, `unknown query parameter "x"`},
		{"trace topic bad escape", "GET", "/v1/messages/k/trace?topic=%zz", "", 400, CodeInvalidRequest, "query string is malformed"},
		// routing
		{"unknown path", "GET", "/v1/nothing-here", "", 404, CodeNotFound, "no such endpoint"},
		{"wrong method", "GET", "/v1/ack", "", 405, CodeMethodNotAllowed, "GET is not allowed"},
	}
}

func TestBadRequestsAreRefusedBeforeTheBroker(t *testing.T) {
	t.Parallel()
	s, b := newTestServer(t)
	for _, tc := range badRequests(testReceipt(t)) {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(s, tc.method, tc.target, []byte(tc.body))
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if !utf8.Valid(rec.Body.Bytes()) {
				t.Errorf("answer is not valid UTF-8: %q", rec.Body)
			}
			var out struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatalf("answer is not the JSON error shape: %q", rec.Body)
			}
			if out.Error.Code != tc.code || !strings.Contains(out.Error.Message, tc.says) {
				t.Errorf("error %s %q, want %s containing %q", out.Error.Code, out.Error.Message, tc.code, tc.says)
			}
			if calls := b.taken(); len(calls) > 0 {
				t.Errorf("a refused request reached the broker: %+v", calls)
			}
		})
	}
}

// TestStrictAcceptsWhatIsValid: the checks refuse only what is wrong —
// escapes that are not duplicates, surrogate pairs, values at the edge of
// every range and headers that exactly fill their column pass unchanged.
func TestStrictAcceptsWhatIsValid(t *testing.T) {
	t.Parallel()
	s, b := newTestServer(t)
	l := s.limits
	rc := `"` + testReceipt(t) + `"`
	cases := []struct {
		name, method, target, body string
		check                      func(t *testing.T, c call)
	}{
		{"escaped keys that differ, pairs, edge values", "POST", "/v1/topics/orders/messages",
			`{"messages":[{"key":"k\ud83d\ude00","payload":{"a":1,"\u0062":2,"c":{"a":3}},"headers":{"a":"1","A":"2"},"priority":9,` +
				`"delay_ms":` + fmt.Sprint(l.MaxDelay.Milliseconds()) + `}],"durability":"primary"}`,
			func(t *testing.T, c call) {
				m := c.args[1].([]broker.Message)[0]
				if m.Key != "k😀" || m.Delay != l.MaxDelay || m.Priority != 9 || string(m.Payload) != `{"a":1,"\u0062":2,"c":{"a":3}}` {
					t.Errorf("got %+v", m)
				}
			}},
		{"headers filling the column", "POST", "/v1/topics/orders/messages",
			`{"messages":[{"payload":1,"headers":` + headersOf(store.MaxHeadersBytes) + `}]}`,
			func(t *testing.T, c call) {
				if n := len(c.args[1].([]broker.Message)[0].Headers); n != store.MaxHeadersBytes {
					t.Errorf("headers %d bytes", n)
				}
			}},
		{"a deliver_at in the past means now", "POST", "/v1/topics/orders/messages",
			`{"messages":[{"payload":1,"deliver_at":"0001-01-01T00:00:00Z"}]}`,
			func(t *testing.T, c call) {
				if at := c.args[1].([]broker.Message)[0].DeliverAt; time.Since(at) > time.Minute {
					t.Errorf("deliver_at %v", at)
				}
			}},
		{"claim at the limits", "POST", "/v1/topics/orders/subscriptions/default/claim",
			fmt.Sprintf(`{"max":%d,"visibility_timeout_ms":%d,"wait_ms":%d}`, l.MaxClaim, l.MaxLease.Milliseconds(), l.MaxWait.Milliseconds()),
			func(t *testing.T, c call) {
				req := c.args[0].(broker.ClaimRequest)
				if req.Max != l.MaxClaim || req.Lease != l.MaxLease || req.Wait != l.MaxWait {
					t.Errorf("got %+v", req)
				}
			}},
		{"an empty claim body takes the defaults", "POST", "/v1/topics/orders/subscriptions/default/claim", ``,
			func(t *testing.T, c call) {
				if req := c.args[0].(broker.ClaimRequest); req.Max != 1 || req.Lease != l.DefaultLease {
					t.Errorf("got %+v", req)
				}
			}},
		{"a long nack error is cut on a character boundary", "POST", "/v1/nack",
			`{"items":[{"receipt":` + rc + `,"error":"` + strings.Repeat("é", 1500) + `"}]}`,
			func(t *testing.T, c call) {
				e := c.args[0].([]broker.NackItem)[0].Error
				if len(e) > store.MaxLastErrorBytes || !utf8.ValidString(e) || len(e) < store.MaxLastErrorBytes-1 {
					t.Errorf("error cut to %d bytes, valid UTF-8 %v", len(e), utf8.ValidString(e))
				}
			}},
		{"dead letters with every parameter", "GET", "/v1/topics/orders/subscriptions/default/dead-letters?error_code=E%20X&limit=1000&cursor=", "",
			func(t *testing.T, c call) {
				if c.args[2] != "E X" || c.args[4] != 1000 {
					t.Errorf("got %v", c.args)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(s, tc.method, tc.target, []byte(tc.body))
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			calls := b.taken()
			if len(calls) != 1 {
				t.Fatalf("broker calls %v", calls)
			}
			tc.check(t, calls[0])
		})
	}
}

func TestCheckJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{}`, ""},
		{`{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`, ""},
		{`{"a":"\"}\"","b":"\\","c":"\\\"a"}`, ""},
		{`{"a":1,"\u0041":2}`, ""},
		{`"\ud83d\ude00"`, ""},
		{`{"a":1,"a":2}`, `duplicate object key "a"`},
		{`{"x":{"a":1,"\u0061":2}}`, `x: duplicate object key "a"`},
		{`{"a\\":1,"a\u005c":2}`, `duplicate object key "a\\"`},
		{`[{"a":1},{"b":1,"b":2}]`, `[1]: duplicate object key "b"`},
		{`{"a b":{"c":"` + "\xff" + `"}}`, `["a b"].c: string is not valid UTF-8`},
		{`"\ude00"`, "lone surrogate"},
		{`"\ud83dx"`, "lone surrogate"},
		{`"\ud83d\u0041"`, "lone surrogate"},
		// malformed JSON is left to the decoder
		{`{"a":1,"a`, ""},
		{`}}]]`, ""},
		{`"\u12`, ""},
		{`{"a":"\`, ""},
	} {
		got := ""
		if e := checkJSON([]byte(tc.in)); e != nil {
			got = e.Error()
		}
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("checkJSON(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// Many keys switch to a map; the finding is the same.
	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&sb, `"k%d":%d,`, i, i)
	}
	sb.WriteString(`"k4999":0}`)
	if e := checkJSON([]byte(sb.String())); e == nil || !strings.Contains(e.Error(), `"k4999"`) {
		t.Errorf("5001 keys with one duplicate: %v", e)
	}
}
