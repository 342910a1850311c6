package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/api/apitest"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
)

func testReceipt(t testing.TB) string {
	t.Helper()
	r := broker.Receipt{VShard: 7, Topic: "orders"}
	r.MessageID, r.Token, r.Subscription = 42, 9, "default"
	return testReceipts.Encode(r)
}

func TestBadRequestsAreRefusedBeforeTheBroker(t *testing.T) {
	t.Parallel()
	s, b := newTestServer(t)
	for _, tc := range apitest.BadRequests(testReceipt(t)) {
		t.Run(tc.Name, func(t *testing.T) {
			rec := do(s, tc.Method, tc.Target, []byte(tc.Body))
			if rec.Code != tc.Status {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.Status, rec.Body)
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
			if out.Error.Code != tc.Code || !strings.Contains(out.Error.Message, tc.Says) {
				t.Errorf("error %s %q, want %s containing %q", out.Error.Code, out.Error.Message, tc.Code, tc.Says)
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
			`{"messages":[{"payload":1,"headers":` + apitest.HeadersOf(domain.MaxHeadersBytes) + `}]}`,
			func(t *testing.T, c call) {
				if n := len(c.args[1].([]broker.Message)[0].Headers); n != domain.MaxHeadersBytes {
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
				if len(e) > domain.MaxLastErrorBytes || !utf8.ValidString(e) || len(e) < domain.MaxLastErrorBytes-1 {
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
