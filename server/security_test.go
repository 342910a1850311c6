package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
	"github.com/shardmq/shardmq/internal/tlsconf/certtest"
	"github.com/shardmq/shardmq/store"
)

// secureEnv is a router with a token file; secrets by token name.
type secureEnv struct {
	*env
	secrets map[string]string
}

// setupSecure starts a router whose token file holds one token per entry
// of grants (name → scopes), each with the secret "secret-"+name.
func setupSecure(t *testing.T, grants map[string]map[auth.Scope][]string, rates map[string]auth.Rate, tune func(*Config)) *secureEnv {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	secrets := map[string]string{}
	for name, scopes := range grants {
		secrets[name] = "secret-" + name
		ft := auth.FileToken{Name: name, SHA256: auth.Hash(secrets[name]), Scopes: scopes}
		if r, ok := rates[name]; ok {
			ft.Rate = &r
		}
		if err := auth.PutEntry(path, ft); err != nil {
			t.Fatal(err)
		}
	}
	e := setupOn(t, bed, func(c *Config) {
		c.Security.TokensFile = path
		if tune != nil {
			tune(c)
		}
	})
	return &secureEnv{env: e, secrets: secrets}
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// send makes one request; token "" sends no Authorization header. hdr
// adds headers (Content-Type defaults to application/json with a body).
func (e *secureEnv) send(t *testing.T, token, method, path, body string, hdr map[string]string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(data)}
	_ = json.Unmarshal(data, &a.body)
	return a
}

// TestEndpointScopeTable sends every route with every kind of token: no
// token and a wrong one are 401, a token without the route's scope on the
// topic is 403, one with it gets past the guard.
func TestEndpointScopeTable(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const topic = "scopes.t1"
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"producer":    {auth.Produce: {"scopes.*"}},
		"consumer":    {auth.Consume: {topic}},
		"topic-admin": {auth.Admin: {"scopes.*"}},
		"admin":       {auth.Admin: {"*"}},
		"other":       {auth.Produce: {"other.*"}, auth.Consume: {"other.*"}, auth.Admin: {"other.*"}},
	}, nil, nil)
	// A receipt of the topic (the guard reads the topic from it; the
	// delivery does not exist, so an allowed ack answers not_found).
	rc := testReceipts.Encode(broker.Receipt{VShard: 7, Topic: topic, Lease: store.Lease{MessageID: 1, Token: 1, Subscription: "default"}})
	sub := "/v1/topics/" + topic + "/subscriptions/"

	// need: "" open, else scope and whether every topic must be covered.
	type need struct {
		scope  auth.Scope
		global bool
		open   bool
	}
	routes := []struct {
		method, path, body string
		need               need
	}{
		{"GET", "/healthz", "", need{open: true}},
		{"GET", "/readyz", "", need{open: true}},
		{"GET", "/metrics", "", need{scope: auth.Admin, global: true}},
		{"GET", "/ui/", "", need{open: true}},
		{"GET", "/ui/app.js", "", need{open: true}},
		{"POST", "/v1/topics/" + topic + "/messages", `{"messages":[{"key":"k1","payload":{"n":1}}]}`, need{scope: auth.Produce}},
		{"POST", sub + "default/claim", `{"max":1,"wait_ms":0}`, need{scope: auth.Consume}},
		{"POST", "/v1/ack", `{"receipts":["` + rc + `"]}`, need{scope: auth.Consume}},
		{"POST", "/v1/nack", `{"items":[{"receipt":"` + rc + `","error_code":"E"}]}`, need{scope: auth.Consume}},
		{"POST", "/v1/extend", `{"receipts":["` + rc + `"],"visibility_timeout_ms":1000}`, need{scope: auth.Consume}},
		{"GET", sub + "default", "", need{scope: auth.Consume}},
		{"PUT", sub + "billing", `{"max_attempts":3}`, need{scope: auth.Admin}},
		{"DELETE", sub + "gone", "", need{scope: auth.Admin}},
		{"GET", sub + "default/dead-letters", "", need{scope: auth.Consume}},
		{"DELETE", sub + "default/dead-letters", "", need{scope: auth.Admin}},
		{"POST", sub + "default/dead-letters/redrive", `{"all":true}`, need{scope: auth.Admin}},
		{"POST", sub + "default/dead-letters/redrive", `{"all":true,"dry_run":true}`, need{scope: auth.Admin}},
		{"GET", sub + "default/dead-letters/codes", "", need{scope: auth.Consume}},
		{"POST", sub + "default/dead-letters/claim", `{"max":1}`, need{scope: auth.Admin}},
		{"GET", "/v1/messages/k1/trace?topic=" + topic, "", need{scope: auth.Consume}},
		{"GET", "/v1/transactions/tx-1", "", need{scope: auth.Consume, global: true}},
		{"GET", "/v1/admin/topology", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/shardmap", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/stats", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/reconcile", "", need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/reconcile", `{"dry_run":true}`, need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/reconcile/transactions", `{"transaction_ids":["tx-1"]}`, need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/reshard", `{"ranges":[],"dry_run":true}`, need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/reshard/job-1", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/reshard", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/queues?limit=10", "", need{scope: auth.Admin, global: true}},
		{"GET", "/v1/admin/retention", "", need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/retention/run", `{}`, need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/retention/restore", `{"month":"2020-01"}`, need{scope: auth.Admin, global: true}},
		{"POST", "/v1/admin/retention/release", `{"month":"2020-01"}`, need{scope: auth.Admin, global: true}},
	}
	// allowed says what each token may do, written out from the token
	// file above rather than computed by the code under test.
	allowed := func(token string, n need) bool {
		switch token {
		case "admin":
			return true
		case "topic-admin":
			return !n.global
		case "producer":
			return n.scope == auth.Produce && !n.global
		case "consumer":
			return n.scope == auth.Consume && !n.global
		}
		return false
	}
	tokens := []string{"producer", "consumer", "topic-admin", "other", "admin"}
	for _, rt := range routes {
		name := rt.method + " " + rt.path
		for _, who := range []string{"", "not-a-token"} {
			a := e.send(t, who, rt.method, rt.path, rt.body, nil)
			if rt.need.open {
				if a.status == http.StatusUnauthorized || a.status == http.StatusForbidden {
					t.Errorf("%s without a valid token: %d, want it open", name, a.status)
				}
				continue
			}
			if a.status != http.StatusUnauthorized || a.code() != "unauthorized" || a.header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s with token %q: %d %s, want 401 unauthorized with WWW-Authenticate", name, who, a.status, a.raw)
			}
		}
		for _, tok := range tokens {
			a := e.send(t, e.secrets[tok], rt.method, rt.path, rt.body, nil)
			want := rt.need.open || allowed(tok, rt.need)
			switch {
			case want && (a.status == http.StatusUnauthorized || a.status == http.StatusForbidden):
				t.Errorf("%s as %s: %d %s, want it allowed", name, tok, a.status, a.raw)
			case !want && (a.status != http.StatusForbidden || a.code() != "forbidden"):
				t.Errorf("%s as %s: %d %s, want 403 forbidden", name, tok, a.status, a.raw)
			}
		}
	}

	// A receipt names its topic: a consumer of one topic cannot ack
	// another's deliveries, even in a batch with its own.
	other := testReceipts.Encode(broker.Receipt{VShard: 7, Topic: "payments", Lease: store.Lease{MessageID: 1, Token: 1, Subscription: "default"}})
	a := e.send(t, e.secrets["consumer"], "POST", "/v1/ack", `{"receipts":["`+rc+`","`+other+`"]}`, nil)
	if a.status != http.StatusForbidden || !strings.Contains(a.raw, "payments") {
		t.Fatalf("ack of another topic's receipt: %d %s, want 403 naming the topic", a.status, a.raw)
	}
	// An unknown path needs a valid token, then is the API's 404.
	if a := e.send(t, "", "GET", "/v1/nothing", "", nil); a.status != http.StatusUnauthorized {
		t.Fatalf("unknown path without a token: %d", a.status)
	}
	if a := e.send(t, e.secrets["consumer"], "GET", "/v1/nothing", "", nil); a.status != http.StatusNotFound || a.code() != "not_found" {
		t.Fatalf("unknown path with a token: %d %s", a.status, a.raw)
	}
}

// TestRejectedRequestsWriteNothing: produce and subscription changes
// refused by the guard leave the database as it was.
func TestRejectedRequestsWriteNothing(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const topic = "guarded.orders"
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"consumer": {auth.Consume: {"*"}},
		"admin":    {auth.Admin: {"*"}},
	}, nil, nil)
	produce := `{"messages":[{"key":"evil-1","payload":{"n":1}}]}`
	path := "/v1/topics/" + topic + "/messages"
	for _, c := range []struct {
		name, token string
		hdr         map[string]string
		status      int
		code        string
	}{
		{"no token", "", nil, 401, "unauthorized"},
		{"no token, text/plain", "", map[string]string{"Content-Type": "text/plain"}, 401, "unauthorized"},
		{"wrong token", "smq_guess", nil, 401, "unauthorized"},
		{"consume scope only", e.secrets["consumer"], nil, 403, "forbidden"},
		{"cross-site form post", e.secrets["admin"], map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403, "origin_not_allowed"},
		{"text/plain body", e.secrets["admin"], map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"form body", e.secrets["admin"], map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
	} {
		a := e.send(t, c.token, "POST", path, produce, c.hdr)
		if a.status != c.status || a.code() != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, a.status, a.raw, c.status, c.code)
		}
	}
	for _, table := range []string{"message_store", "message_key", "message_queue"} {
		if n := total(e.count(t, "SELECT COUNT(*) FROM "+table)); n != 0 {
			t.Fatalf("%s holds %d rows after refused produces", table, n)
		}
	}

	// A subscription survives an unauthenticated or under-scoped DELETE,
	// and its configuration an under-scoped PUT.
	sub := "/v1/topics/" + topic + "/subscriptions/billing"
	if a := e.send(t, e.secrets["admin"], "PUT", sub, `{"max_attempts":3}`, nil); a.status != http.StatusCreated {
		t.Fatalf("PUT as admin: %d %s", a.status, a.raw)
	}
	for _, tok := range []string{"", e.secrets["consumer"]} {
		e.send(t, tok, "DELETE", sub, "", nil)
		e.send(t, tok, "PUT", sub, `{"max_attempts":9}`, nil)
	}
	a := e.send(t, e.secrets["admin"], "GET", sub, "", nil)
	if a.status != http.StatusOK || a.body["max_attempts"] != float64(3) {
		t.Fatalf("subscription after refused changes: %d %s", a.status, a.raw)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM subscription WHERE topic = ? AND deleted = 0", topic)); n == 0 {
		t.Fatal("subscription row gone")
	}
}

// TestRateLimitAnswers429: a token over its rate gets 429 rate_limited
// with Retry-After; other tokens are not affected.
func TestRateLimitAnswers429(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"slow": {auth.Admin: {"*"}},
		"fast": {auth.Admin: {"*"}},
	}, map[string]auth.Rate{"slow": {PerSecond: 0.01, Burst: 3}}, nil)
	for i := 0; i < 3; i++ {
		if a := e.send(t, e.secrets["slow"], "GET", "/v1/admin/shardmap", "", nil); a.status != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i+1, a.status, a.raw)
		}
	}
	a := e.send(t, e.secrets["slow"], "GET", "/v1/admin/shardmap", "", nil)
	if a.status != http.StatusTooManyRequests || a.code() != "rate_limited" {
		t.Fatalf("over the rate: %d %s, want 429 rate_limited", a.status, a.raw)
	}
	if ra := a.header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("429 without a Retry-After: %q", ra)
	}
	if a := e.send(t, e.secrets["fast"], "GET", "/v1/admin/shardmap", "", nil); a.status != http.StatusOK {
		t.Fatalf("another token: %d", a.status)
	}
}

// TestBrowserRules: Content-Type, Origin (with CORS for configured
// origins) and Host.
func TestBrowserRules(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupSecure(t, map[string]map[auth.Scope][]string{"admin": {auth.Admin: {"*"}}}, nil, func(c *Config) {
		c.Security.AllowedOrigins = []string{"https://ops.example.com"}
	})
	tok := e.secrets["admin"]
	path := "/v1/topics/browser.t/messages"
	body := `{"messages":[{"key":"b1","payload":{}}]}`
	for _, c := range []struct {
		name   string
		hdr    map[string]string
		status int
	}{
		{"json", nil, 200},
		{"json with charset", map[string]string{"Content-Type": "application/json; charset=utf-8"}, 200},
		{"json with upper-case charset", map[string]string{"Content-Type": "Application/JSON;charset=UTF-8"}, 200},
		{"json in latin1", map[string]string{"Content-Type": "application/json; charset=iso-8859-1"}, 415},
		{"text/plain", map[string]string{"Content-Type": "text/plain"}, 415},
		{"multipart", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, 415},
		{"no content type", map[string]string{"Content-Type": ""}, 415},
		{"foreign origin", map[string]string{"Origin": "http://evil.example"}, 403},
		{"null origin", map[string]string{"Origin": "null"}, 403},
		{"configured origin", map[string]string{"Origin": "https://ops.example.com"}, 200},
	} {
		a := e.send(t, tok, "POST", path, body, c.hdr)
		if a.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, a.status, a.raw, c.status)
		}
		if a.status >= 400 && a.code() == "" {
			t.Errorf("%s: error not in the JSON shape: %s", c.name, a.raw)
		}
	}
	// A foreign origin is refused on reads too (a page must not read
	// traces), and a configured one gets CORS headers and a preflight.
	if a := e.send(t, tok, "GET", "/v1/admin/stats", "", map[string]string{"Origin": "http://evil.example"}); a.status != 403 || a.code() != "origin_not_allowed" {
		t.Fatalf("GET from a foreign origin: %d %s", a.status, a.raw)
	}
	a := e.send(t, "", "OPTIONS", path, "", map[string]string{"Origin": "https://ops.example.com", "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "authorization, content-type"})
	if a.status != http.StatusNoContent || a.header.Get("Access-Control-Allow-Origin") != "https://ops.example.com" ||
		!strings.Contains(a.header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight: %d %v", a.status, a.header)
	}
	// A bodiless request needs no Content-Type.
	if a := e.send(t, tok, "DELETE", "/v1/topics/browser.t/subscriptions/none", "", nil); a.status == 415 {
		t.Fatal("bodiless DELETE refused for its Content-Type")
	}
}

// TestHostRules: an open router (no tokens) serves only loopback names
// and IP literals, so a DNS-rebinding page gets nothing; -allowed-hosts
// names the hosts.
func TestHostRules(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	open := &secureEnv{env: setup(t)}
	for host, want := range map[string]int{"127.0.0.1": 200, "localhost:8080": 200, "[::1]:80": 200, "evil.example": 403, "rebind.evil.example:8080": 403} {
		a := open.send(t, "", "GET", "/v1/admin/shardmap", "", map[string]string{"Host": host})
		if a.status != want {
			t.Errorf("open router, Host %s: %d %s, want %d", host, a.status, a.raw, want)
		}
		if want == 403 && a.code() != "host_not_allowed" {
			t.Errorf("Host %s: code %q", host, a.code())
		}
	}
	named := setupSecure(t, map[string]map[auth.Scope][]string{"admin": {auth.Admin: {"*"}}}, nil, func(c *Config) {
		c.Security.AllowedHosts = []string{"mq.internal"}
	})
	for host, want := range map[string]int{"mq.internal:8080": 200, "MQ.internal": 200, "127.0.0.1": 403, "evil.example": 403} {
		a := named.send(t, named.secrets["admin"], "GET", "/v1/admin/shardmap", "", map[string]string{"Host": host})
		if a.status != want {
			t.Errorf("-allowed-hosts mq.internal, Host %s: %d %s, want %d", host, a.status, a.raw, want)
		}
	}
}

// TestTokenNameIsTheConsumer: a claim without "consumer" is traced under
// the token's name.
func TestTokenNameIsTheConsumer(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const topic = "named.consumer"
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"billing-worker": {auth.Consume: {topic}},
		"admin":          {auth.Admin: {"*"}},
	}, nil, nil)
	if a := e.send(t, e.secrets["admin"], "POST", "/v1/topics/"+topic+"/messages", `{"messages":[{"key":"n1","payload":{}}]}`, nil); a.status != 200 {
		t.Fatalf("produce: %d %s", a.status, a.raw)
	}
	a := e.send(t, e.secrets["billing-worker"], "POST", "/v1/topics/"+topic+"/subscriptions/default/claim", `{"max":1,"wait_ms":2000}`, nil)
	msgs, _ := a.body["messages"].([]any)
	if a.status != 200 || len(msgs) != 1 {
		t.Fatalf("claim: %d %s", a.status, a.raw)
	}
	rc := msgs[0].(map[string]any)["receipt"].(string)
	if a := e.send(t, e.secrets["billing-worker"], "POST", "/v1/ack", `{"receipts":["`+rc+`"]}`, nil); a.status != 200 {
		t.Fatalf("ack: %d %s", a.status, a.raw)
	}
	// The final ack is kept on the message row (docs/trace.md).
	n := total(e.count(t, "SELECT COUNT(*) FROM message_trace WHERE event = 'acked' AND consumer = 'billing-worker'")) +
		total(e.count(t, "SELECT COUNT(*) FROM message_store WHERE acked_by = 'billing-worker' OR LOCATE('billing-worker', ack_slot) > 0"))
	if n != 1 {
		var all []string
		for _, db := range e.dbs {
			rows, _ := db.Query("SELECT event, COALESCE(consumer,'') FROM message_trace")
			for rows != nil && rows.Next() {
				var ev, c string
				rows.Scan(&ev, &c)
				all = append(all, ev+"/"+c)
			}
		}
		t.Fatalf("acked events by billing-worker: %d (trace: %v)", n, all)
	}
	// The trace shows the MySQL endpoint to operators only.
	for who, want := range map[string]bool{"billing-worker": false, "admin": true} {
		a := e.send(t, e.secrets[who], "GET", "/v1/messages/n1/trace?topic="+topic, "", nil)
		ep, _ := a.body["endpoint"].(string)
		if a.status != 200 || (ep != "") != want || a.body["cluster"] == "" {
			t.Errorf("trace as %s: %d endpoint %q, want shown %v: %s", who, a.status, ep, want, a.raw)
		}
	}
}

// TestClusterErrorsAreHidden: a SQL error (the test's tables dropped
// under the router) reaches the client as a code and a request id, never
// as SQL text, a database name or an address; the log has the detail.
func TestClusterErrorsAreHidden(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	logs := &syncBuffer{}
	e := setupSecure(t, map[string]map[auth.Scope][]string{"admin": {auth.Admin: {"*"}}}, nil, func(c *Config) {
		c.Log = slog.New(slog.NewTextHandler(logs, nil))
	})
	for _, db := range e.dbs {
		if _, err := db.ExecContext(context.Background(), "DROP TABLE message_key"); err != nil {
			t.Fatal(err)
		}
	}
	tok := e.secrets["admin"]
	for _, rq := range []struct{ method, path, body string }{
		{"POST", "/v1/topics/hidden.t/messages", `{"messages":[{"key":"h1","payload":{}},{"key":"h2","payload":{}}]}`},
		{"GET", "/v1/messages/h1/trace?topic=hidden.t", ""},
	} {
		a := e.send(t, tok, rq.method, rq.path, rq.body, nil)
		for _, leak := range []string{"Error 1146", "message_key", e.name, "127.0.0.1", "tcp(", "SELECT", "INSERT"} {
			if strings.Contains(a.raw, leak) {
				t.Errorf("%s %s answered %d with %q in it: %s", rq.method, rq.path, a.status, leak, a.raw)
			}
		}
		id := a.header.Get("X-Request-Id")
		if id == "" || !strings.Contains(a.raw, "request id "+id) {
			t.Errorf("%s %s: answer %s does not name the request id %q", rq.method, rq.path, a.raw, id)
		}
		if !strings.Contains(logs.String(), id) {
			t.Errorf("log has no line for request %s", id)
		}
		if a.status == 200 && !strings.Contains(a.raw, `"unavailable"`) {
			t.Errorf("%s %s: %s", rq.method, rq.path, a.raw)
		}
	}
	if !strings.Contains(logs.String(), "1146") {
		t.Errorf("the log lacks the SQL error's detail:\n%s", logs.String())
	}
}

// syncBuffer is a log destination tests read while the router writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestListenRefusesOpenNonLoopback: without tokens the router serves only
// loopback addresses unless told Insecure (checked before anything
// listens).
func TestListenRefusesOpenNonLoopback(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, c := range []struct {
		addr           string
		open, insecure bool
		ok             bool
	}{
		{"127.0.0.1:8080", true, false, true},
		{"[::1]:8080", true, false, true},
		{"localhost:8080", true, false, true},
		{"127.0.0.2:8080", true, false, true},
		{"0.0.0.0:8080", true, false, false},
		{":8080", true, false, false},
		{"10.1.2.3:8080", true, false, false},
		{"mq.example.com:8080", true, false, false},
		{"0.0.0.0:8080", true, true, true},
		{"0.0.0.0:8080", false, false, true},
	} {
		err := checkListen(c.addr, c.open, c.insecure)
		if (err == nil) != c.ok {
			t.Errorf("checkListen(%q, open %v, insecure %v) = %v, want ok %v", c.addr, c.open, c.insecure, err, c.ok)
		}
	}
	e := setup(t)
	e.r.cfg.Listen = "0.0.0.0:0"
	if ln, err := e.r.Listen(); err == nil {
		ln.Close()
		t.Fatal("an open router listened on 0.0.0.0")
	} else if !strings.Contains(err.Error(), "-tokens") {
		t.Fatalf("error does not say what to do: %v", err)
	}
}

// TestTLSListener serves the API over TLS end to end with a certificate
// made here, and picks up a replaced certificate without a restart.
func TestTLSListener(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "test-ca")
	certPath, keyPath := ca.Issue(t, dir, "router-one", false)
	e := setupSecure(t, map[string]map[auth.Scope][]string{"admin": {auth.Admin: {"*"}}}, nil, func(c *Config) {
		c.Listen = "127.0.0.1:0"
		c.Security.TLSCert, c.Security.TLSKey = certPath, keyPath
	})
	ln, err := e.r.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.r.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	addr := ln.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	req, _ := http.NewRequest("GET", "https://"+addr+"/v1/admin/shardmap", nil)
	req.Header.Set("Authorization", "Bearer "+e.secrets["admin"])
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "router-one" {
		t.Fatalf("HTTPS: status %d, TLS %v", resp.StatusCode, resp.TLS != nil)
	}
	// Plain HTTP on the TLS port gets nothing from the API.
	if resp, err := testClient.Get("http://" + addr + "/v1/admin/shardmap"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}

	// Renewal: new files in place; new handshakes present the new
	// certificate within the reload check.
	newCert, newKey := ca.Issue(t, dir, "router-two", false)
	for _, mv := range [][2]string{{newKey, keyPath}, {newCert, certPath}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	testtime.WithinState(t, 20*time.Second, "the replaced certificate served", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("router stopped: %v", err)
		default:
		}
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool()})
		if err != nil {
			t.Fatal(err)
		}
		cn := conn.ConnectionState().PeerCertificates[0].Subject.CommonName
		conn.Close()
		return cn == "router-two", "serving " + cn
	})
}

// TestTokensFromConsul: a router whose token file lives in Consul KV
// follows changes made there.
func TestTokensFromConsul(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	srv := consuldouble.New(consuldouble.Options{})
	t.Cleanup(srv.Close)
	client, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	key := "shardmq/" + auth.ConsulKey
	put := func(name, secret string) {
		t.Helper()
		y := fmt.Sprintf("tokens:\n  - name: %s\n    sha256: %s\n    scopes: {admin: ['*']}\n", name, auth.Hash(secret))
		if _, err := client.KV().Put(&consulapi.KVPair{Key: key, Value: []byte(y)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("first", "secret-1")
	st, err := auth.OpenConsul(context.Background(), client.KV(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &secureEnv{env: setupOn(t, bed, func(c *Config) { c.Security.Tokens = st })}
	if a := e.send(t, "secret-1", "GET", "/v1/admin/shardmap", "", nil); a.status != 200 {
		t.Fatalf("token from Consul: %d %s", a.status, a.raw)
	}
	put("second", "secret-2")
	testtime.Within(t, 10*time.Second, "token put into Consul accepted", func() bool {
		return e.send(t, "secret-2", "GET", "/v1/admin/shardmap", "", nil).status == 200
	})
	if a := e.send(t, "secret-1", "GET", "/v1/admin/shardmap", "", nil); a.status != 401 {
		t.Fatalf("token removed from Consul: %d", a.status)
	}
}
