package api

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
)

// JSONErrorListener wraps l so that the few answers Go's HTTP server
// writes by itself, before any handler runs, use the API's JSON error
// shape too: a request line it cannot parse (bad percent-encoding in the
// path, a space in the target), a missing Host header, headers over the
// server's limit, an unsupported transfer encoding. net/http writes those
// as plain text straight to the connection in one write, with a fixed
// signature (text/plain, Connection: close, a body repeating the status),
// and closes it; the wrapper recognises exactly that write and replaces it.
// Every other byte passes through unchanged. Connections of a TLS listener
// (tls.NewListener) are passed through as they are.
func JSONErrorListener(l net.Listener) net.Listener { return jsonErrorListener{l} }

type jsonErrorListener struct{ net.Listener }

func (l jsonErrorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if _, ok := c.(*tls.Conn); ok {
		// net/http needs the *tls.Conn itself (handshake, r.TLS, ALPN);
		// over TLS its early answers stay plain text.
		return c, nil
	}
	return &jsonErrorConn{Conn: c}, nil
}

type jsonErrorConn struct{ net.Conn }

func (c *jsonErrorConn) Write(p []byte) (int, error) {
	if out, ok := rewriteServerError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// NetConn returns the connection it wraps.
func (c *jsonErrorConn) NetConn() net.Conn { return c.Conn }

// CloseWrite keeps the half-close net/http does before closing a
// connection it answered early (so the client reads the answer, not a reset).
func (c *jsonErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serverErrorHeaders is what net/http's own early answers carry.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// rewriteServerError returns the JSON form of one of net/http's own plain
// text answers, or false if p is anything else.
func rewriteServerError(p []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	status, body, ok := bytes.Cut(rest, []byte(serverErrorHeaders))
	if !ok || len(status) < 4 || status[3] != ' ' || !(bytes.Equal(body, status) || string(body) == "Unsupported transfer encoding") {
		return nil, false
	}
	n, err := strconv.Atoi(string(status[:3]))
	if err != nil || n < 400 || n > 599 {
		return nil, false
	}
	e := fail(CodeInvalidRequest, "malformed HTTP request ("+string(status[4:])+"): check the request line's percent-encoding and the headers")
	switch {
	case n == 431:
		e = fail(CodeRequestTooLarge, "request headers are too large")
	case string(body) == "Unsupported transfer encoding":
		e = fail(CodeInvalidRequest, "unsupported transfer encoding")
	}
	js, _ := json.Marshal(map[string]any{"error": e})
	js = append(js, '\n')
	st := statusOf[e.Code]
	var out []byte
	out = append(out, "HTTP/1.1 "+strconv.Itoa(st)+" "+http.StatusText(st)+"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "+
		strconv.Itoa(len(js))+"\r\n\r\n"...)
	return append(out, js...), true
}
