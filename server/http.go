package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/api"
)

// HTTPConfig bounds the router's HTTP connections, so that slow or idle
// clients cannot hold its file descriptors (shared with the MySQL pools)
// or its memory. Zero fields take the defaults named.
type HTTPConfig struct {
	// ReadHeaderTimeout bounds reading a request's headers. Defaults to 10s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included, from its
	// first byte: a body trickled slower is cut. Defaults to 30s (16 MiB,
	// the largest body, needs about 0.6 MB/s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its answer. It must exceed the longest claim wait (api.Limits
	// MaxWait, 20s) by at least 5s, or long-polls would be cut. Defaults
	// to 60s.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that carries no request
	// for this long. Defaults to 60s.
	IdleTimeout time.Duration
	// MaxConns caps the open client connections; one over the cap is
	// answered 503 too_many_connections (with Retry-After) and closed.
	// Defaults to 1024; -1 removes the cap.
	MaxConns int
	// ShutdownTimeout bounds how long a shutdown waits for in-flight
	// requests before closing their connections. Defaults to 30s.
	ShutdownTimeout time.Duration
}

// writeMargin is how much longer than the longest claim wait a request may
// take to be answered.
const writeMargin = 5 * time.Second

func (c HTTPConfig) withDefaults(limits api.Limits) (HTTPConfig, error) {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.ReadHeaderTimeout, 10*time.Second)
	def(&c.ReadTimeout, 30*time.Second)
	def(&c.WriteTimeout, 60*time.Second)
	def(&c.IdleTimeout, 60*time.Second)
	def(&c.ShutdownTimeout, 30*time.Second)
	if c.MaxConns == 0 {
		c.MaxConns = 1024
	}
	if wait := limits.WithDefaults().MaxWait; c.WriteTimeout < wait+writeMargin {
		return c, fmt.Errorf("config: HTTP.WriteTimeout %v must be at least the longest claim wait (%v) plus %v", c.WriteTimeout, wait, writeMargin)
	}
	return c, nil
}

// httpServer is the router's http.Server with its timeouts.
func (r *Router) httpServer() *http.Server {
	c := r.cfg.HTTP
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout,
		WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout}
	if l := r.listener.Load(); l != nil {
		srv.ConnState = l.connState
	}
	return srv
}

// connLimit wraps a listener so that at most max connections are open.
// A connection over the cap takes the place of the connection that has
// carried no request for longest (one accepted that has not sent a
// request yet, or a keep-alive between requests), which is closed: idle
// sockets, opened by anyone and authenticated or not, cannot lock others
// out, and a health check always gets in. A connection in the middle of a
// request is never closed; with every connection busy, one over the cap is
// accepted and answered 503 with the JSON error shape, then closed, so
// that its client sees at once why and when to come back instead of
// hanging in the accept queue.
type connLimit struct {
	net.Listener
	max  int64
	open atomic.Int64
	// rejecting bounds the goroutines that answer refused connections;
	// past it a refused connection is closed without an answer.
	rejecting chan struct{}

	mu   sync.Mutex
	idle map[*countedConn]time.Time // connections carrying no request, since when
	// evicted counts idle connections closed to make room.
	evicted atomic.Int64
}

func limitConns(ln net.Listener, max int) *connLimit {
	return &connLimit{Listener: ln, max: int64(max), rejecting: make(chan struct{}, 64), idle: map[*countedConn]time.Time{}}
}

// Accept implements net.Listener.
func (l *connLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			if !l.evictIdle() {
				select {
				case l.rejecting <- struct{}{}:
					go func() {
						defer func() { <-l.rejecting }()
						refuse(c, l.max)
					}()
				default:
					c.Close()
				}
				continue
			}
			l.open.Add(1)
		}
		cc := &countedConn{Conn: c, l: l}
		l.setIdle(cc, true) // no request yet
		return cc, nil
	}
}

// idleCount is how many connections carry no request now.
func (l *connLimit) idleCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.idle)
}

// evictIdle closes the connection idle longest, if any, and says whether
// it did (its slot is then free).
func (l *connLimit) evictIdle() bool {
	l.mu.Lock()
	var victim *countedConn
	var since time.Time
	for c, at := range l.idle {
		if victim == nil || at.Before(since) {
			victim, since = c, at
		}
	}
	if victim != nil {
		delete(l.idle, victim)
	}
	l.mu.Unlock()
	if victim == nil {
		return false
	}
	l.evicted.Add(1)
	victim.Close()
	return true
}

// setIdle records whether c carries no request now.
func (l *connLimit) setIdle(c *countedConn, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if idle && !c.closed {
		l.idle[c] = time.Now()
	} else {
		delete(l.idle, c)
	}
	c.idle.Store(idle && !c.closed)
}

// connState follows the HTTP server's connections (http.Server.ConnState)
// so that the limit knows which carry no request. The server says
// "active" only once a request's headers are read whole, so a connection
// also becomes busy at the first byte it reads (countedConn.Read): a
// request under way is never closed to make room.
func (l *connLimit) connState(c net.Conn, st http.ConnState) {
	cc := countedOf(c)
	if cc == nil {
		return
	}
	switch st {
	case http.StateNew, http.StateIdle:
		l.setIdle(cc, true)
	default: // active, hijacked, closed
		l.setIdle(cc, false)
	}
}

// countedOf finds the countedConn under the wrappers between it and the
// HTTP server (the JSON error writer, TLS).
func countedOf(c net.Conn) *countedConn {
	for c != nil {
		switch x := c.(type) {
		case *countedConn:
			return x
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// refuse answers a connection over the cap and closes it. It reads what
// the client sent (a little, for a second) before closing, so that the
// answer is not lost to a reset of unread data.
func refuse(c net.Conn, max int64) {
	defer c.Close()
	status, body := api.ErrorResponse(api.CodeTooManyConnections,
		"the router has "+strconv.FormatInt(max, 10)+" open connections, its cap; retry after a second")
	c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// OpenConns is how many client connections the router holds (-1 when it
// does not count them: no cap, or not serving).
func (r *Router) OpenConns() int64 {
	if l := r.listener.Load(); l != nil {
		return l.open.Load()
	}
	return -1
}

// countedConn gives its slot back when closed.
type countedConn struct {
	net.Conn
	l      *connLimit
	once   sync.Once
	closed bool        // under l.mu
	idle   atomic.Bool // in l.idle: carries no request
}

// Read implements net.Conn: the first bytes of a request make an idle
// connection busy.
func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.idle.Load() {
		c.l.setIdle(c, false)
	}
	return n, err
}

// Close implements net.Conn.
func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.closed = true
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		c.l.open.Add(-1)
	})
	return c.Conn.Close()
}
