package loadtest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testtime"
)

func TestConnPool(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/echo":
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
		case "/chunked":
			w.Write([]byte(`{"a":`))
			w.(http.Flusher).Flush() // no Content-Length: chunked
			w.Write([]byte(`1}`))
		case "/close":
			w.Header().Set("Connection", "close")
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"unavailable"}}`))
		case "/slow":
			<-r.Context().Done()
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p, err := newConnPool(srv.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ctx := context.Background()

	for i := 0; i < 20; i++ {
		resp, err := p.do(ctx, http.MethodPost, "/echo", []byte(`{"n":1}`))
		if err != nil || resp.status != 200 || string(resp.body) != `{"n":1}` {
			t.Fatalf("echo %d: %+v %v", i, resp, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("20 sequential requests opened %d connections, want 1 (keep-alive)", n)
	}

	resp, err := p.do(ctx, http.MethodGet, "/chunked", nil)
	if err != nil || string(resp.body) != `{"a":1}` {
		t.Fatalf("chunked: %+v %v", resp, err)
	}

	resp, err = p.do(ctx, http.MethodPost, "/close", []byte(`{}`))
	if err != nil || resp.status != 503 || resp.retryAfter != "3" || !strings.Contains(string(resp.body), "unavailable") {
		t.Fatalf("close: %+v %v", resp, err)
	}
	before := conns.Load()
	if _, err := p.do(ctx, http.MethodPost, "/echo", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if conns.Load() != before+1 {
		t.Fatal("a connection the server closed was reused")
	}

	// A cancelled context ends a request the server never answers.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := p.do(cctx, http.MethodPost, "/slow", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("slow request after cancel: %v, want context.Canceled", err)
	}

	for _, bad := range []string{"https://127.0.0.1:1", "http://127.0.0.1:1/prefix", "http://127.0.0.1:1?x=1"} {
		if _, err := newConnPool(bad, 1); err == nil {
			t.Errorf("router URL %s accepted", bad)
		}
	}

	p.close()
	if _, err := p.do(ctx, http.MethodPost, "/echo", nil); err == nil {
		t.Fatal("a closed pool sent a request")
	}
}

// A connection the server closed while it sat idle (an idle timeout, a
// restarted router) is noticed before reuse: the request goes out on a
// new connection instead of failing.
func TestConnPoolSkipsConnectionsClosedWhileIdle(t *testing.T) {
	var conns, closed atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{}`))
	}))
	srv.Config.IdleTimeout = 100 * time.Millisecond
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p, err := newConnPool(srv.URL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.staleAfter = 10 * time.Millisecond
	ctx := context.Background()
	if _, err := p.do(ctx, http.MethodGet, "/", nil); err != nil {
		t.Fatal(err)
	}
	testtime.Within(t, 10*time.Second, "the server closing the idle connection", func() bool { return closed.Load() != 0 })
	if _, err := p.do(ctx, http.MethodGet, "/", nil); err != nil {
		t.Fatalf("request after the server closed the idle connection: %v", err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the closed one replaced)", n)
	}
}
