package api

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The answers net/http gives before any handler runs come in the JSON
// error shape through JSONErrorListener; normal traffic, keep-alive
// included, is untouched.
func TestJSONErrorListener(t *testing.T) {
	t.Parallel()
	s, _ := newTestServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 1 << 10}
	go srv.Serve(JSONErrorListener(ln))
	t.Cleanup(func() { srv.Close() })

	raw := func(t *testing.T, req string) *http.Response {
		t.Helper()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"bad percent-encoding in the path", "GET /v1/messages/%zz/trace?topic=orders HTTP/1.1\r\nHost: x\r\n\r\n", 400, CodeInvalidRequest},
		{"space in the target", "GET /v1/a b HTTP/1.1\r\nHost: x\r\n\r\n", 400, CodeInvalidRequest},
		{"no Host header", "GET /healthz HTTP/1.1\r\n\r\n", 400, CodeInvalidRequest},
		{"headers too large", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", 413, CodeRequestTooLarge},
		{"unsupported transfer encoding", "POST /v1/ack HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := raw(t, tc.req)
			defer resp.Body.Close()
			var out struct {
				Error struct{ Code, Message string }
			}
			data, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(data, &out); err != nil || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %q %q is not the JSON error shape", resp.StatusCode, resp.Header.Get("Content-Type"), data)
			}
			if resp.StatusCode != tc.status || out.Error.Code != tc.code {
				t.Fatalf("%d %s, want %d %s (%s)", resp.StatusCode, out.Error.Code, tc.status, tc.code, out.Error.Message)
			}
		})
	}
	t.Run("keep-alive traffic untouched", func(t *testing.T) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		for i := 0; i < 2; i++ {
			fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(data), `"ok"`) {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, data)
			}
		}
	})
}

func TestRewriteServerErrorLeavesOtherWritesAlone(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
		"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		// a body that merely contains the signature is not net/http's own answer
		"HTTP/1.1 400 Bad Request" + serverErrorHeaders + "something else",
		"some body bytes HTTP/1.1 400 Bad Request" + serverErrorHeaders + "400 Bad Request",
	} {
		if _, ok := rewriteServerError([]byte(p)); ok {
			t.Errorf("rewrote %q", p)
		}
	}
}
