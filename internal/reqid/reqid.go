// Package reqid carries a request's id through a context, from the HTTP
// layer that assigns it down to the store, which writes it into the trace
// events the request causes. It is a package of its own so that both ends
// can import it without importing each other.
package reqid

import (
	"context"
	"math/rand/v2"
	"strconv"
)

type ctxKey struct{}

// MaxLen is the longest id accepted from a client (and the width of the
// trace column that keeps it).
const MaxLen = 64

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// From returns the id ctx carries, or "".
func From(ctx context.Context) string {
	id, _ := ctx.Value(ctxKey{}).(string)
	return id
}

// Valid reports whether a client-given id may be used as is: 1 to MaxLen
// bytes of letters, digits and . _ : - (what fits a header, a log line and
// a trace column without escaping).
func Valid(id string) bool {
	if len(id) == 0 || len(id) > MaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// New returns a fresh id: 16 hex digits, random enough to tell requests
// apart in logs (not a secret).
func New() string {
	s := strconv.FormatUint(rand.Uint64(), 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}
