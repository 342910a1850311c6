package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/testtime"
)

// served is a router serving through Run on its own listener, so that
// its HTTP configuration applies.
type served struct {
	*env
	addr string
	stop context.CancelFunc
	done chan error // Run's answer
}

func serve(t *testing.T, tune func(*Config)) *served {
	t.Helper()
	e := setupOn(t, bed, tune)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{env: e, addr: ln.Addr().String(), stop: cancel, done: make(chan error, 1)}
	go func() { s.done <- e.r.Run(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// rawRequest writes one HTTP/1.1 request on c and reads its answer.
func rawRequest(t *testing.T, c net.Conn, br *bufio.Reader, method, path, body string) (*http.Response, map[string]any) {
	t.Helper()
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a guard against a hung test, not an assertion
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	json.Unmarshal(data, &out)
	return resp, out
}

// A request body trickled slower than ReadTimeout allows is cut: the
// router answers or closes the connection before the body is complete.
func TestSlowBodyIsCut(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.ReadTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 2000 // at one byte per 10ms, 20s to send it whole
	fmt.Fprintf(c, "POST /v1/topics/slow/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	var sent atomic.Int64
	go func() {
		for i := 0; i < size; i++ {
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
			sent.Add(1)
			time.Sleep(10 * time.Millisecond) // the trickle itself
		}
	}()
	c.SetReadDeadline(time.Now().Add(60 * time.Second)) // a guard, not an assertion
	_, err = io.ReadAll(c)                              // an answer, then the close; or the close alone
	if n := sent.Load(); n >= size {
		t.Fatalf("the whole trickled body (%d bytes) was read; the connection was not cut (read: %v)", n, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the router kept the connection open")
	}
}

// Over MaxConns, with every connection in the middle of a request, a
// connection is answered 503 too_many_connections and closed; a slot freed
// by a close is usable again.
func TestConnectionCap(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.MaxConns = 3 })
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Half a request: the connection is busy (never closed to make
		// room) until the header timeout.
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n"); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	testtime.UntilState(t, "three busy connections", func() (bool, string) {
		l := s.r.listener.Load()
		if l == nil {
			return false, "not serving yet"
		}
		n, idle := s.r.OpenConns(), l.idleCount()
		return n == 3 && idle == 0, fmt.Sprint(n, " open, ", idle, " idle")
	})
	extra, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	resp, body := rawRequest(t, extra, bufio.NewReader(extra), "GET", "/healthz", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || body["error"].(map[string]any)["code"] != "too_many_connections" {
		t.Fatalf("fourth connection: %d %v, want 503 too_many_connections with Retry-After", resp.StatusCode, body)
	}
	held[0].Close()
	testtime.UntilState(t, "a slot freed by a close", func() (bool, string) {
		n := s.r.OpenConns()
		return n == 2, fmt.Sprint(n, " open")
	})
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp, _ := rawRequest(t, c, bufio.NewReader(c), "GET", "/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("after a close: %d, want 200", resp.StatusCode)
	}
}

// Idle sockets cannot lock others out: with the cap taken by connections
// that carry no request (opened and silent, or kept alive after one), a
// new connection takes the place of the one idle longest and /healthz
// answers; a connection in the middle of a request keeps its place.
func TestIdleConnectionsCannotLockOthersOut(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.MaxConns = 4 })
	busy, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := io.WriteString(busy, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n"); err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	testtime.UntilState(t, "the cap taken", func() (bool, string) {
		l := s.r.listener.Load()
		if l == nil {
			return false, "not serving yet"
		}
		n, idle := s.r.OpenConns(), l.idleCount()
		return n == 4 && idle == 3, fmt.Sprint(n, " open, ", idle, " idle")
	})
	for i := 0; i < 5; i++ { // more than the idle ones: each new one takes an idle one's place
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		resp, body := rawRequest(t, c, bufio.NewReader(c), "GET", "/healthz", "")
		c.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("healthz %d with the cap taken by idle sockets: %d %v", i, resp.StatusCode, body)
		}
	}
	// The busy connection kept its place: its request completes.
	io.WriteString(busy, "\r\n")
	busy.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard, not an assertion
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the connection in the middle of a request: %v %v", resp, err)
	}
	// The first idle socket was closed to make room.
	idle[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the socket idle longest is still open")
	}
}

// A cap on requests in flight at or above the cap on connections could
// never shed (the connections run out first): the router refuses it, and
// by default sheds at three quarters of the connections.
func TestInFlightCapBelowConnections(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		inFlight, conns, want int
		ok                    bool
	}{
		{0, 1024, 768, true},
		{0, -1, 4096, true},
		{1000, 1024, 1000, true},
		{1024, 1024, 0, false},
		{4096, 1024, 0, false},
		{-1, 1024, -1, true},
		{5000, -1, 5000, true},
	} {
		got, err := inFlightCap(c.inFlight, c.conns)
		if (err == nil) != c.ok || (c.ok && got != c.want) {
			t.Errorf("in flight %d, conns %d: %d, %v; want %d (ok %v)", c.inFlight, c.conns, got, err, c.want, c.ok)
		}
	}
}

// A keep-alive connection left idle is closed by the router.
func TestIdleConnectionIsClosed(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.IdleTimeout = 200 * time.Millisecond })
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if resp, _ := rawRequest(t, c, br, "GET", "/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard, not an assertion
	_, err = br.ReadByte()
	if err != io.EOF {
		t.Fatalf("idle connection: read %v, want EOF (closed by the router)", err)
	}
}

// A write timeout shorter than the longest claim wait would cut
// long-polls: the router refuses to start with it.
func TestWriteTimeoutMustOutlastClaimWait(t *testing.T) {
	t.Parallel()
	_, err := (HTTPConfig{WriteTimeout: 20 * time.Second}).withDefaults(Config{}.Limits)
	if err == nil || !strings.Contains(err.Error(), "WriteTimeout") {
		t.Fatalf("WriteTimeout 20s with claims of up to 20s: %v, want an error naming WriteTimeout", err)
	}
	if c, err := (HTTPConfig{}).withDefaults(Config{}.Limits); err != nil || c.WriteTimeout <= 25*time.Second {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
}

// A shutdown during a produce burst and a waiting long-poll: the long-poll
// is answered at once (empty), Run returns without hitting its wait, and
// every produce either got an answer that matches the database (created or
// duplicate ⇒ the row exists) or a connection error / unavailable item
// that a retry with the same key settles — each key stored exactly once.
//
// Two ways down: Run's shutdown (SIGTERM in the router's main), and
// Router.Close under a server that keeps serving (the broker must then
// answer unavailable, never drop a request).
func TestShutdownDuringProduceBurst(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, viaRun := range []bool{true, false} {
		t.Run(fmt.Sprintf("run=%v", viaRun), func(t *testing.T) {
			t.Parallel()
			shutdownDuringProduceBurst(t, viaRun)
		})
	}
}

func shutdownDuringProduceBurst(t *testing.T, viaRun bool) {
	s := serve(t, func(c *Config) { c.HTTP.ShutdownTimeout = 15 * time.Second })
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	post := func(url, body string) (int, map[string]any, error) {
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return resp.StatusCode, nil, err
		}
		return resp.StatusCode, out, nil
	}
	base := "http://" + s.addr
	if !viaRun {
		base = s.url // the httptest server, which outlives Router.Close
	}
	longPoll := make(chan error, 1)
	go func() {
		st, out, err := post(base+"/v1/topics/quiet/subscriptions/default/claim", `{"wait_ms":20000}`)
		if err == nil && (st != 200 || len(out["messages"].([]any)) != 0) {
			err = fmt.Errorf("long-poll answered %d %v, want 200 and no messages", st, out)
		}
		longPoll <- err
	}()
	e := s.env
	testtime.UntilState(t, "long-poll waiting", func() (bool, string) {
		topics, _ := e.r.Broker().Waiting()
		return topics == 1, fmt.Sprint(topics, " topics waited on")
	})

	type outcome struct {
		key, status string // status "" = connection error
	}
	const producers = 8
	outcomes := make(chan outcome, 100000)
	var answered atomic.Int64
	doneProducers := make(chan struct{}, producers)
	for p := 0; p < producers; p++ {
		go func() {
			defer func() { doneProducers <- struct{}{} }()
			for i := 0; ; i++ {
				keys := []string{fmt.Sprintf("p%d-%d-a", p, i), fmt.Sprintf("p%d-%d-b", p, i)}
				body := fmt.Sprintf(`{"messages":[{"key":%q,"payload":1},{"key":%q,"payload":2}]}`, keys[0], keys[1])
				st, out, err := post(base+"/v1/topics/burst/messages", body)
				if err != nil || st != 200 {
					for _, k := range keys {
						outcomes <- outcome{k, ""}
					}
					return // the router is gone (or going)
				}
				settled := true
				for j, r := range out["results"].([]any) {
					status := r.(map[string]any)["status"].(string)
					outcomes <- outcome{keys[j], status}
					settled = settled && (status == "created" || status == "duplicate")
				}
				if !settled {
					return // refused as unavailable: the router is closing
				}
				answered.Add(1)
			}
		}()
	}
	testtime.UntilState(t, "produce burst under way", func() (bool, string) {
		return answered.Load() >= 50, fmt.Sprint(answered.Load(), " answered")
	})
	if viaRun {
		s.stop()
		select {
		case err := <-s.done:
			s.done <- err // for the cleanup
			if err != nil {
				t.Fatalf("Run: %v, want a shutdown within its wait", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("Run did not return")
		}
	} else {
		s.r.Close()
	}
	if err := <-longPoll; err != nil {
		t.Fatal(err)
	}
	for p := 0; p < producers; p++ {
		<-doneProducers
	}
	close(outcomes)
	settled := map[string]bool{}
	var retry []string
	for o := range outcomes {
		switch o.status {
		case "created", "duplicate":
			settled[o.key] = true
		default:
			retry = append(retry, o.key)
		}
	}
	// Everything answered created must be in the database already.
	var keys []string
	for k := range settled {
		keys = append(keys, k)
	}
	if got := burstKeysStored(t, e, keys); got != len(keys) {
		t.Fatalf("%d keys answered created or duplicate, %d stored", len(keys), got)
	}
	// The rest is settled by a retry with the same keys on a new router.
	r2, err := New(context.Background(), Config{TopologyFile: e.r.cfg.TopologyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	var msgs []broker.Message
	for _, k := range retry {
		msgs = append(msgs, broker.Message{Key: k, Payload: []byte(payloadOf(k)), PayloadJSON: true})
	}
	if len(msgs) > 0 {
		res, err := r2.Broker().Produce(context.Background(), "burst", msgs, broker.DurabilityPrimary)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Status != "created" && r.Status != "duplicate" {
				t.Fatalf("retry of %s: %s %v", retry[i], r.Status, r.Err)
			}
		}
	}
	all := append(keys, retry...)
	if got := burstKeysStored(t, e, all); got != len(all) {
		t.Fatalf("%d keys produced, %d stored", len(all), got)
	}
	t.Logf("%d keys answered before the shutdown, %d settled by a retry", len(keys), len(retry))
}

// payloadOf is the payload TestShutdownDuringProduceBurst sent with key.
func payloadOf(key string) string {
	if strings.HasSuffix(key, "-a") {
		return "1"
	}
	return "2"
}

// burstKeysStored counts the messages of topic burst stored under keys.
func burstKeysStored(t *testing.T, e *env, keys []string) int {
	t.Helper()
	n := 0
	for _, db := range e.dbs {
		for start := 0; start < len(keys); start += 500 {
			chunk := keys[start:min(start+500, len(keys))]
			args := []any{"burst"}
			for _, k := range chunk {
				args = append(args, k)
			}
			var c int
			q := "SELECT COUNT(*) FROM message_store WHERE topic = ? AND msg_key IN (" + strings.TrimSuffix(strings.Repeat("?,", len(chunk)), ",") + ")"
			if err := db.QueryRow(q, args...).Scan(&c); err != nil {
				t.Fatal(err)
			}
			n += c
		}
	}
	return n
}

// With the default in-flight cap (three quarters of MaxConns) the router
// sheds before its connections run out: requests in flight up to the cap
// (long-polling claims here) leave a new connection room to be answered
// 503 overloaded with Retry-After — not cut — and /healthz passes; once
// the claims' connections close, requests are served again.
func TestDefaultsShedBeforeConnectionsRunOut(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const conns = 8
	s := serve(t, func(c *Config) { c.HTTP.MaxConns = conns })
	inFlightCap := s.r.cfg.Security.MaxInFlight
	if inFlightCap != conns*3/4 {
		t.Fatalf("in-flight cap %d with -max-conns %d, want %d", inFlightCap, conns, conns*3/4)
	}
	c0, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	if resp, body := rawRequest(t, c0, bufio.NewReader(c0), "PUT", "/v1/topics/shed/subscriptions/s", `{}`); resp.StatusCode/100 != 2 {
		t.Fatalf("subscription: %d %v", resp.StatusCode, body)
	}
	c0.Close()
	inFlight := func() float64 {
		fams, err := s.r.Metrics().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "shardmq_http_in_flight" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	// Fill the cap with claims that wait for messages that never come.
	var claims []net.Conn
	for i := 0; i < inFlightCap; i++ {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body := `{"max":1,"wait_ms":20000}`
		fmt.Fprintf(c, "POST /v1/topics/shed/subscriptions/s/claim HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		claims = append(claims, c)
	}
	testtime.UntilState(t, "the in-flight cap taken", func() (bool, string) {
		n := inFlight()
		return n == float64(inFlightCap), fmt.Sprint(n, " in flight")
	})
	if n := s.r.OpenConns(); n >= conns {
		t.Fatalf("%d connections open at the in-flight cap of %d, want fewer than %d", n, inFlightCap, conns)
	}
	for _, path := range []string{"/v1/admin/topology", "/v1/topics/shed/subscriptions/s"} {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		resp, body := rawRequest(t, c, bufio.NewReader(c), "GET", path, "")
		c.Close()
		code, _ := body["error"].(map[string]any)["code"].(string)
		if resp.StatusCode != 503 || code != "overloaded" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("GET %s at the in-flight cap: %d %v, want 503 overloaded with Retry-After", path, resp.StatusCode, body)
		}
	}
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := rawRequest(t, c, bufio.NewReader(c), "GET", "/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("/healthz at the in-flight cap: %d %v", resp.StatusCode, body)
	}
	c.Close()
	for _, c := range claims {
		c.Close()
	}
	testtime.UntilState(t, "the claims ended with their connections", func() (bool, string) {
		n := inFlight()
		return n == 0, fmt.Sprint(n, " in flight")
	})
	c, err = net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp, body := rawRequest(t, c, bufio.NewReader(c), "GET", "/v1/topics/shed/subscriptions/s", ""); resp.StatusCode != 200 {
		t.Fatalf("after the claims: %d %v", resp.StatusCode, body)
	}
}
