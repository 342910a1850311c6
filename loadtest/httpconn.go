package loadtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// connPool is a minimal HTTP/1.1 keep-alive client: each request takes an
// idle connection (or dials one), writes the request, reads the response
// and gives the connection back.
//
// It exists because the load generator shares the machine with what it
// measures. net/http's Transport hands every request between three
// goroutines (caller, writeLoop, readLoop); measured here under 64
// single-message clients it spent ~80 µs of CPU per request, a fifth of
// everything the box did per message. A worker that writes and reads its
// own connection spends a fraction of that, so the CPU goes to the router
// and MySQL, which is what a benchmark means to measure. It speaks only
// what the router answers: Content-Length or chunked bodies, keep-alive,
// Connection: close; no HEAD requests, and a server that answers before
// reading the whole request body shows as a write error.
type connPool struct {
	addr string // host:port
	host string // Host header
	auth string // Authorization header value; "" sends none
	idle chan *pooledConn
	// dial is net.Dialer.DialContext; one place so tests can count dials.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// staleAfter is how long a connection may sit idle before it is
	// checked for a close by the server (a restarted router) before reuse.
	staleAfter time.Duration
	mu         sync.Mutex
	all        map[*pooledConn]struct{} // every open connection, closed by close
	closed     bool
}

type pooledConn struct {
	c         net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
}

var errPoolClosed = errors.New("connection pool closed")

func newConnPool(base string, conns int) (*connPool, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("router URL %q: %w", base, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("router URL %q: only http:// is supported", base)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return nil, fmt.Errorf("router URL %q: give scheme, host and port only (the API's paths start at /)", base)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	if conns < 1 {
		conns = 1
	}
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &connPool{addr: addr, host: u.Host, idle: make(chan *pooledConn, conns), dial: d.DialContext, staleAfter: time.Second,
		all: map[*pooledConn]struct{}{}}, nil
}

func (p *connPool) get(ctx context.Context) (*pooledConn, error) {
	for {
		var pc *pooledConn
		select {
		case pc = <-p.idle:
		default:
		}
		if pc == nil {
			break
		}
		if time.Since(pc.idleSince) > p.staleAfter && !pc.alive() {
			p.discard(pc)
			continue
		}
		return pc, nil
	}
	c, err := p.dial(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	pc := &pooledConn{c: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 16<<10)}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, errPoolClosed
	}
	p.all[pc] = struct{}{}
	return pc, nil
}

// alive reports whether an idle connection is still open: a server that
// closed it (idle timeout, restart) makes a read end at once with EOF,
// while an open one times out after a millisecond. Only connections idle
// for the pool's staleAfter are checked, so a busy worker pays nothing.
func (pc *pooledConn) alive() bool {
	if pc.br.Buffered() > 0 {
		return false // bytes nobody asked for: the stream is out of step
	}
	_ = pc.c.SetReadDeadline(time.Now().Add(time.Millisecond))
	var one [1]byte
	n, err := pc.c.Read(one[:])
	var ne net.Error
	return n == 0 && errors.As(err, &ne) && ne.Timeout()
}

func (p *connPool) put(pc *pooledConn) {
	pc.idleSince = time.Now()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		p.discard(pc)
		return
	}
	select {
	case p.idle <- pc:
	default:
		p.discard(pc)
	}
}

func (p *connPool) discard(pc *pooledConn) {
	_ = pc.c.Close()
	p.mu.Lock()
	delete(p.all, pc)
	p.mu.Unlock()
}

// close closes every connection, idle or in use; requests after it fail.
func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	for pc := range p.all {
		_ = pc.c.Close()
	}
	p.all = map[*pooledConn]struct{}{}
	p.mu.Unlock()
	for {
		select {
		case <-p.idle:
		default:
			return
		}
	}
}

// response is what a request answered.
type response struct {
	status     int
	retryAfter string
	body       []byte
}

// do sends one request and reads its whole answer. A connection that
// fails, or whose answer asks to close it, is not reused. ctx bounds the
// whole exchange through the connection's deadline.
func (p *connPool) do(ctx context.Context, method, path string, body []byte) (response, error) {
	if err := ctx.Err(); err != nil {
		return response{}, err
	}
	pc, err := p.get(ctx)
	if err != nil {
		return response{}, err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	_ = pc.c.SetDeadline(deadline)
	// A cancelled ctx (the run ending) must not leave a worker blocked in
	// a read: closing the connection unblocks it.
	stop := context.AfterFunc(ctx, func() { _ = pc.c.SetDeadline(time.Unix(1, 0)) })
	resp, reuse, err := pc.exchange(method, p.host, p.auth, path, body)
	if !stop() {
		// ctx ended meanwhile: its deadline may land on the connection at
		// any moment, even during a later request, so it is not reused.
		reuse = false
	}
	if err != nil || !reuse {
		p.discard(pc)
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return resp, err
	}
	p.put(pc)
	return resp, nil
}

func (pc *pooledConn) exchange(method, host, auth, path string, body []byte) (response, bool, error) {
	w := pc.bw
	w.WriteString(method)
	w.WriteByte(' ')
	w.WriteString(path)
	w.WriteString(" HTTP/1.1\r\nHost: ")
	w.WriteString(host)
	if auth != "" {
		w.WriteString("\r\nAuthorization: ")
		w.WriteString(auth)
	}
	w.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	w.WriteString(strconv.Itoa(len(body)))
	w.WriteString("\r\n\r\n")
	w.Write(body)
	if err := w.Flush(); err != nil {
		return response{}, false, err
	}
	hr, err := http.ReadResponse(pc.br, nil)
	if err != nil {
		return response{}, false, err
	}
	var data []byte
	if n := hr.ContentLength; n >= 0 && n <= maxAnswer {
		// One allocation of the answer's size: io.ReadAll grows its
		// buffer from 512 bytes, copying a claim's answer a dozen times.
		data = make([]byte, n)
		_, err = io.ReadFull(hr.Body, data)
	} else {
		data, err = io.ReadAll(hr.Body)
	}
	hr.Body.Close()
	if err != nil {
		return response{}, false, err
	}
	if hr.ContentLength < 0 && !isChunked(hr) {
		// Delimited by close: the connection cannot carry another request.
		return response{status: hr.StatusCode, retryAfter: hr.Header.Get("Retry-After"), body: data}, false, nil
	}
	return response{status: hr.StatusCode, retryAfter: hr.Header.Get("Retry-After"), body: data}, !hr.Close, nil
}

// maxAnswer is the largest Content-Length read into a buffer of that size
// at once; a larger one is read as it comes.
const maxAnswer = 64 << 20

func isChunked(r *http.Response) bool {
	return len(r.TransferEncoding) > 0 && r.TransferEncoding[0] == "chunked"
}
