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
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, len(body), body)
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
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.ReadTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 2000 // at one byte per 10ms, 20s to send it whole
	fmt.Fprintf(c, "POST /v1/topics/slow/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
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

// Over MaxConns a connection is answered 503 too_many_connections and
// closed; a slot freed by a close is usable again.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	s := serve(t, func(c *Config) { c.HTTP.MaxConns = 3 })
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if resp, _ := rawRequest(t, c, bufio.NewReader(c), "GET", "/healthz", ""); resp.StatusCode != 200 {
			t.Fatalf("connection %d: %d", i, resp.StatusCode)
		}
		held = append(held, c)
	}
	extra, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	resp, body := rawRequest(t, extra, bufio.NewReader(extra), "GET", "/healthz", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || body["error"].(map[string]any)["code"] != "too_many_connections" {
		t.Fatalf("fourth connection: %d %v, want 503 too_many_connections with Retry-After", resp.StatusCode, body)
	}
	if n := s.r.OpenConns(); n != 3 {
		t.Fatalf("%d connections counted, want 3", n)
	}
	held[0].Close()
	waitUntil(t, 10*time.Second, "a slot freed by a close", func() (bool, string) {
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

// A keep-alive connection left idle is closed by the router.
func TestIdleConnectionIsClosed(t *testing.T) {
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
