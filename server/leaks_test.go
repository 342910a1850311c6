package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/testbed"
)

// A body trickled slower than the read timeout is answered 408
// request_timeout in the JSON shape, naming no address.
func TestSlowBodyAnswers408(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.ReadTimeout = 500 * time.Millisecond })
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"messages":[{"key":"slow","payload":1}]}`
	fmt.Fprintf(c, "POST /v1/topics/slow/messages HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body)+100, body[:5])
	c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard, not an assertion
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	data, _ := io.ReadAll(resp.Body)
	var out struct {
		Error struct{ Code, Message string }
	}
	if resp.StatusCode != http.StatusRequestTimeout || json.Unmarshal(data, &out) != nil || out.Error.Code != "request_timeout" {
		t.Fatalf("slow body: %d %s, want 408 request_timeout", resp.StatusCode, data)
	}
	if strings.Contains(string(data), "127.0.0.1") || strings.Contains(string(data), "tcp") {
		t.Fatalf("the answer names an address: %s", data)
	}
}

// rawAnswer sends one raw HTTP/1.1 request and reads the first answer
// (for "Expect: 100-continue", whatever comes first: 100 or the final one).
func rawAnswer(t *testing.T, addr, request string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second)) // a guard, not an assertion
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	if strings.Contains(line, " 100 ") {
		return &http.Response{StatusCode: 100}, line
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(line), br)), nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

// Small leaks closed: a non-canonical path is a JSON 404 (after the token
// check, as any unknown path), never an HTML redirect; a body whose
// Content-Length is over the limit is 413 before "100 Continue".
func TestPathsAndSizesAnswerJSONFirst(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupSecure(t, map[string]map[auth.Scope][]string{"admin": {auth.Admin: {"*"}}}, nil, nil)
	s := strings.TrimPrefix(e.url, "http://")
	tok := e.secrets["admin"]
	for _, p := range []string{"//v1/ack", "/v1//ack", "/v1/./ack", "/v1/x/../ack", "/v1/topics/t/subscriptions/s/../claim"} {
		for _, c := range []struct {
			token string
			want  int
			code  string
		}{{"", 401, "unauthorized"}, {tok, 404, "not_found"}} {
			auth := ""
			if c.token != "" {
				auth = "Authorization: Bearer " + c.token + "\r\n"
			}
			resp, body := rawAnswer(t, s, "POST "+p+" HTTP/1.1\r\nHost: localhost\r\n"+auth+"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			if resp.StatusCode != c.want || !strings.Contains(body, `"code":"`+c.code+`"`) || resp.Header.Get("Location") != "" {
				t.Fatalf("POST %s (token %v): %d %q (Location %q), want %d %s in JSON", p, c.token != "", resp.StatusCode, body, resp.Header.Get("Location"), c.want, c.code)
			}
		}
	}
	// An escaped "/" or ".." inside a key is a key, not a path segment.
	a := e.send(t, tok, "GET", "/v1/messages/a%2F..%2Fb/trace?topic=t", "", nil)
	if a.status != 404 || a.code() != "not_found" || !strings.Contains(a.raw, "a/../b") {
		t.Fatalf("trace of key a/../b: %d %s", a.status, a.raw)
	}
	huge := "POST /v1/topics/t/messages HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " + tok +
		"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 1000000000\r\n\r\n"
	resp, body := rawAnswer(t, s, huge)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":"request_too_large"`) {
		t.Fatalf("Expect: 100-continue with 1 GB: %d %q, want 413 request_too_large before 100 Continue", resp.StatusCode, body)
	}
	// Without a token it is refused as well, and still not invited to send.
	resp, _ = rawAnswer(t, s, strings.Replace(huge, "Authorization: Bearer "+tok+"\r\n", "", 1))
	if resp.StatusCode == 100 {
		t.Fatal("100 Continue for 1 GB without a token")
	}
}

// A router refuses to start with "null" (or "*", or a non-origin) among
// its allowed origins: any site can send Origin: null (sandboxed frames,
// file: pages), so allowing it would let any page drive the router.
func TestNullOriginIsRefused(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	for _, origins := range [][]string{{"null"}, {"https://ops.example.com", "NULL"}, {"*"}, {"ops.example.com"}, {"https://ops.example.com/ui"}} {
		cfg := Config{TopologyFile: e.topology}
		cfg.Broker.Receipts = testReceipts
		cfg.Security.AllowedOrigins = origins
		r, err := New(context.Background(), cfg)
		if err == nil {
			r.Close()
			t.Fatalf("a router started with allowed origins %q", origins)
		}
		if !strings.Contains(err.Error(), "allowed-origins") {
			t.Fatalf("allowed origins %q: %v, want an error naming -allowed-origins", origins, err)
		}
	}
}
