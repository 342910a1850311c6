package consuldouble

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The double answers as a Consul agent does in the cases shardmq meets:
// the same probes run against the double and, with CONSUL_HTTP_ADDR set,
// against a real agent, with one set of expected answers (checked
// against Consul 1.20.2).
func TestAnswersAsTheAgentOnDouble(t *testing.T) {
	t.Parallel()
	s := New(Options{MinSessionTTL: 10 * time.Second})
	t.Cleanup(s.Close)
	runProbes(t, s.URL())
}

func TestAnswersAsTheAgentOnAgent(t *testing.T) {
	addr := os.Getenv("CONSUL_HTTP_ADDR")
	if addr == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: no real Consul agent to compare with")
	}
	t.Parallel()
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	runProbes(t, addr)
}

type prober struct {
	t    *testing.T
	base string
	key  string // a key prefix of this run
}

func (p *prober) do(method, path, body string) (int, http.Header, string) {
	p.t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

// expect checks an answer; an error answer must be plain text, without a
// trailing newline, exactly wantBody.
func (p *prober) expect(what string, status int, h http.Header, body string, wantStatus int, wantBody string) {
	p.t.Helper()
	if status != wantStatus {
		p.t.Errorf("%s: status %d (%q), want %d", what, status, body, wantStatus)
		return
	}
	if wantStatus >= 400 && wantBody != "" && !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		p.t.Errorf("%s: Content-Type %q, want text/plain", what, h.Get("Content-Type"))
	}
	if wantBody != "" && strings.TrimSpace(body) != wantBody && body != wantBody {
		p.t.Errorf("%s: body %q, want %q", what, body, wantBody)
	}
	if wantStatus >= 400 && strings.HasSuffix(body, "\n") {
		p.t.Errorf("%s: body %q ends with a newline; the agent's does not", what, body)
	}
}

func (p *prober) session(body string) string {
	p.t.Helper()
	status, _, out := p.do("PUT", "/v1/session/create", body)
	var created struct{ ID string }
	if status != 200 || json.Unmarshal([]byte(out), &created) != nil || created.ID == "" {
		p.t.Fatalf("session create %s: %d %q", body, status, out)
	}
	return created.ID
}

func runProbes(t *testing.T, base string) {
	var rnd [4]byte
	rand.Read(rnd[:])
	p := &prober{t: t, base: base, key: "consuldouble-fidelity-" + hex.EncodeToString(rnd[:]) + "/"}
	t.Cleanup(func() { p.do("DELETE", "/v1/kv/"+p.key+"?recurse", "") })

	// A destroyed session: acquire, renew, info, release.
	dead := p.session(`{"TTL":"10s","Behavior":"release"}`)
	st, h, body := p.do("PUT", "/v1/session/destroy/"+dead, "")
	p.expect("destroy", st, h, body, 200, "true")
	st, h, body = p.do("PUT", "/v1/session/destroy/"+dead, "")
	p.expect("destroy again", st, h, body, 200, "true")
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"leader?acquire="+dead, "x")
	p.expect("acquire with a destroyed session", st, h, body, 500, `raft apply failed: invalid session "`+dead+`"`)
	st, h, body = p.do("PUT", "/v1/session/renew/"+dead, "")
	p.expect("renew a destroyed session", st, h, body, 404, "Session id '"+dead+"' not found")
	st, h, body = p.do("GET", "/v1/session/info/"+dead, "")
	p.expect("info of a destroyed session", st, h, body, 200, "[]")
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"leader?release="+dead, "x")
	p.expect("release with a destroyed session", st, h, body, 200, "false")

	// A lock held by another session.
	holder, other := p.session(`{"TTL":"10s","LockDelay":"1ms"}`), p.session(`{"TTL":"10s"}`)
	t.Cleanup(func() {
		p.do("PUT", "/v1/session/destroy/"+holder, "")
		p.do("PUT", "/v1/session/destroy/"+other, "")
	})
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"lock?acquire="+holder, "x")
	p.expect("acquire a free lock", st, h, body, 200, "true")
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"lock?acquire="+other, "x")
	p.expect("acquire a held lock", st, h, body, 200, "false")
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"lock?acquire="+holder, "y")
	p.expect("acquire again by the holder", st, h, body, 200, "true")

	// KV.
	st, h, body = p.do("GET", "/v1/kv/"+p.key+"missing", "")
	p.expect("get a missing key", st, h, body, 404, "")
	if body != "" || h.Get("X-Consul-Index") == "" {
		t.Errorf("get a missing key: body %q, X-Consul-Index %q; want no body and an index", body, h.Get("X-Consul-Index"))
	}
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"k?cas=abc", "x")
	p.expect("malformed cas", st, h, body, 500, `strconv.ParseUint: parsing "abc": invalid syntax`)
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"k?flags=abc", "x")
	p.expect("malformed flags", st, h, body, 500, `strconv.ParseUint: parsing "abc": invalid syntax`)
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"k?cas=0", "x")
	p.expect("create with cas=0", st, h, body, 200, "true")
	st, h, body = p.do("PUT", "/v1/kv/"+p.key+"k?cas=0", "x")
	p.expect("cas=0 on an existing key", st, h, body, 200, "false")
	st, h, body = p.do("DELETE", "/v1/kv/"+p.key+"missing?cas=5", "")
	p.expect("delete a missing key with cas", st, h, body, 200, "true")
	st, h, body = p.do("GET", "/v1/kv/"+p.key+"k?index=abc", "")
	p.expect("malformed index", st, h, body, 400, "Invalid index")
	st, h, body = p.do("GET", "/v1/kv/"+p.key+"k?index=1&wait=abc", "")
	p.expect("malformed wait", st, h, body, 400, "Invalid wait time")
	st, h, body = p.do("PUT", "/v1/kv/", "x")
	p.expect("put without a key", st, h, body, 400, "Missing key name")

	// Sessions.
	st, h, body = p.do("PUT", "/v1/session/create", `{"TTL":"1s"}`)
	p.expect("a TTL under the minimum", st, h, body, 500, "Invalid Session TTL '1000000000', must be between [10s=24h0m0s]")
	st, h, body = p.do("PUT", "/v1/session/create", `{"TTL":"abc"}`)
	p.expect("a malformed TTL", st, h, body, 500, `Session TTL 'abc' invalid: time: invalid duration "abc"`)
	st, h, body = p.do("PUT", "/v1/session/create", `{"Behavior":"foo"}`)
	p.expect("an unknown behavior", st, h, body, 500, "Invalid Behavior setting 'foo'")

	// Agent and catalog.
	st, h, body = p.do("PUT", "/v1/agent/check/pass/"+strings.TrimSuffix(p.key, "/"), "")
	p.expect("pass an unknown check", st, h, body, 404, `Unknown check ID "`+strings.TrimSuffix(p.key, "/")+`". Ensure that the check ID is passed, not the check name.`)
	st, h, body = p.do("PUT", "/v1/agent/service/deregister/"+strings.TrimSuffix(p.key, "/"), "")
	p.expect("deregister an unknown service", st, h, body, 404, `Unknown service ID "`+strings.TrimSuffix(p.key, "/")+`". Ensure that the service ID is passed, not the service name.`)
	st, h, body = p.do("PUT", "/v1/catalog/register", `{"Node":""}`)
	p.expect("register without a node", st, h, body, 500, "Must provide node")
	st, h, body = p.do("PUT", "/v1/catalog/register", `{"Node":"n"}`)
	p.expect("register without an address", st, h, body, 500, "Must provide address if SkipNodeUpdate is not set")
	st, h, body = p.do("GET", "/v1/health/service/"+strings.TrimSuffix(p.key, "/")+"?passing", "")
	p.expect("health of an unknown service", st, h, body, 200, "[]")
}
