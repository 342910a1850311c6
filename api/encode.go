package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/jsonscan"
)

// Answers are encoded into a pooled buffer and written once with a
// Content-Length, rather than streamed to the connection in chunks.

// maxPooledBuffer is the largest buffer kept for reuse: a claim answer of
// a few MiB is encoded into a fresh one rather than pinned in the pool.
const maxPooledBuffer = 1 << 20

var buffers = sync.Pool{New: func() any { return new(buffer) }}

// buffer is a pooled answer being encoded.
type buffer struct{ b []byte }

func (b *buffer) Write(p []byte) (int, error) {
	b.b = append(b.b, p...)
	return len(p), nil
}

func getBuffer() *buffer { return buffers.Get().(*buffer) }

func putBuffer(b *buffer) {
	if cap(b.b) > maxPooledBuffer {
		return
	}
	b.b = b.b[:0]
	buffers.Put(b)
}

// writeBody answers status with body, a JSON document. An empty body
// (its encoding failed) answers the status alone, as a failed stream did.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if len(body) > 0 {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if len(body) > 0 {
		w.Write(body)
	}
}

// appendClaimed appends the answer to a claim of got, {"messages":[…]}
// and a newline, byte for byte as encoding/json encodes
// map[string]any{"messages": []claimedMessage} without HTML escaping: a
// claim of 100 is the router's largest answer under load, and reflection
// cost more than the rest of answering it. TestAppendClaimedMatchesJSON
// holds the two to the same bytes. An error (a stored JSON payload that
// is not JSON) is encoding/json's, and dst is then unusable.
func (s *Server) appendClaimed(dst []byte, got []broker.Delivery) ([]byte, error) {
	dst = append(dst, `{"messages":[`...)
	for i := range got {
		if i > 0 {
			dst = append(dst, ',')
		}
		d := &got[i]
		m := d.Message
		dst = append(dst, `{"id":"`...)
		dst = strconv.AppendUint(dst, m.ID, 10)
		dst = append(dst, `","key":`...)
		dst = appendJSONString(dst, m.Key)
		dst = append(dst, `,"topic":`...)
		dst = appendJSONString(dst, m.Topic)
		dst = append(dst, `,"vshard":`...)
		dst = strconv.AppendInt(dst, int64(m.VShard), 10)
		switch {
		case !m.PayloadJSON:
			// Standard base64 has no byte a JSON string escapes.
			dst = append(dst, `,"payload_base64":"`...)
			dst = base64.StdEncoding.AppendEncode(dst, m.Payload)
			dst = append(dst, '"')
		case len(m.Payload) > 0: // empty is omitted (omitempty)
			dst = append(dst, `,"payload":`...)
			var err error
			if dst, err = appendCompactJSON(dst, m.Payload); err != nil {
				return dst, err
			}
		}
		dst = append(dst, `,"headers":`...)
		if len(m.Headers) == 0 {
			dst = append(dst, `{}`...)
		} else {
			dst = appendStringMap(dst, s.headersOf(m))
		}
		dst = append(dst, `,"priority":`...)
		dst = strconv.AppendInt(dst, int64(m.Priority), 10)
		dst = append(dst, `,"order_key":`...)
		dst = appendJSONString(dst, m.OrderKey)
		dst = append(dst, `,"transaction_id":`...)
		dst = appendJSONString(dst, m.TransactionID)
		dst = append(dst, `,"produced_at":`...)
		dst = appendTime(dst, m.CreatedAt)
		dst = append(dst, `,"attempt":`...)
		dst = strconv.AppendInt(dst, int64(d.Attempt), 10)
		dst = append(dst, `,"receipt":`...)
		dst = appendJSONString(dst, d.Receipt)
		dst = append(dst, `,"lease_expires_at":`...)
		dst = appendTime(dst, d.LeaseExpires)
		if d.ErrorCode != "" {
			dst = append(dst, `,"error_code":`...)
			dst = appendJSONString(dst, d.ErrorCode)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}\n"...), nil
}

// appendLeaseResults appends the answer to an ack or extend,
// {"results":[…]} and a newline, byte for byte as encoding/json encodes
// map[string]any{"results": out} without HTML escaping
// (TestAppendLeaseResultsMatchesJSON).
func appendLeaseResults(dst []byte, out []leaseResult) []byte {
	dst = append(dst, `{"results":[`...)
	for i := range out {
		if i > 0 {
			dst = append(dst, ',')
		}
		r := &out[i]
		dst = append(dst, `{"receipt":`...)
		dst = appendJSONString(dst, r.Receipt)
		dst = append(dst, `,"status":`...)
		dst = appendJSONString(dst, string(r.Status))
		if r.Expires != "" {
			dst = append(dst, `,"lease_expires_at":`...)
			dst = appendJSONString(dst, r.Expires)
		}
		if r.Error != nil {
			dst = appendItemError(dst, r.Error)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}\n"...)
}

// appendProduceResults appends the answer to a produce, {"results":[…]}
// and a newline, byte for byte as encoding/json encodes
// map[string]any{"results": out} without HTML escaping
// (TestAppendProduceResultsMatchesJSON): reflection was 3 % of the
// router's CPU in a batched produce.
func appendProduceResults(dst []byte, out []produceResult) []byte {
	dst = append(dst, `{"results":[`...)
	for i := range out {
		if i > 0 {
			dst = append(dst, ',')
		}
		r := &out[i]
		dst = append(dst, `{"key":`...)
		dst = appendJSONString(dst, r.Key)
		if r.ID != "" {
			dst = append(dst, `,"id":`...)
			dst = appendJSONString(dst, r.ID)
		}
		dst = append(dst, `,"vshard":`...)
		dst = strconv.AppendInt(dst, int64(r.VShard), 10)
		dst = append(dst, `,"status":`...)
		dst = appendJSONString(dst, string(r.Status))
		if r.Error != nil {
			dst = appendItemError(dst, r.Error)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}\n"...)
}

// appendItemError appends an item's error member, ,"error":{…}, as
// encoding/json encodes an *apiError.
func appendItemError(dst []byte, e *apiError) []byte {
	dst = append(dst, `,"error":{"code":`...)
	dst = appendJSONString(dst, e.Code)
	dst = append(dst, `,"message":`...)
	dst = appendJSONString(dst, e.Message)
	return append(dst, '}')
}

// appendCompactJSON appends the JSON text src as encoding/json writes a
// json.RawMessage: compacted, and refused when it is not JSON. A payload
// stored by produce is already compact (produce compacts what is not), so
// it is checked here and copied; json.Compact, whose scanner cost four
// times as much, decides the rest.
func appendCompactJSON(dst, src []byte) ([]byte, error) {
	if isCompactJSON(src) {
		return append(dst, src...), nil
	}
	b := bytes.NewBuffer(dst)
	if err := json.Compact(b, src); err != nil {
		return dst, err
	}
	return b.Bytes(), nil
}

// appendTime appends formatTime(t) as a JSON string. RFC 3339 has no byte
// a JSON string escapes.
func appendTime(dst []byte, t time.Time) []byte {
	dst = append(dst, '"')
	if !t.IsZero() {
		dst = t.UTC().AppendFormat(dst, time.RFC3339Nano)
	}
	return append(dst, '"')
}

// appendStringMap appends m as encoding/json does: keys sorted, nil as null.
func appendStringMap(dst []byte, m map[string]string) []byte {
	if m == nil {
		return append(dst, "null"...)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	dst = append(dst, '{')
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = appendJSONString(dst, m[k])
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// plainByte holds the bytes a JSON string carries as they are: ASCII from
// space up, but for " and \.
var plainByte = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendJSONString appends s quoted as encoding/json does without HTML
// escaping: \" \\ \b \f \n \r \t, other control bytes as \u00XX, invalid
// UTF-8 as \ufffd, and U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if plainByte[b] {
			i++
			continue
		}
		if b < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// maxCheckedDepth is how deep isCompactJSON follows nested arrays and
// objects before it leaves the value to json.Compact.
const maxCheckedDepth = 64

// isCompactJSON reports whether p is one JSON value with no whitespace
// outside its strings: what encoding/json copies unchanged. False is no
// verdict: the value may be JSON that needs compacting, nested deeper than
// maxCheckedDepth, or no JSON at all.
func isCompactJSON(p []byte) bool {
	i, ok := skipValue(p, 0, 0)
	return ok && i == len(p)
}

// skipValue returns the index just past the JSON value at p[i:], and
// whether there is one there (with no whitespace).
func skipValue(p []byte, i, depth int) (int, bool) {
	if i >= len(p) {
		return i, false
	}
	switch c := p[i]; c {
	case '"':
		return jsonscan.SkipString(p, i)
	case '{', '[':
		if depth >= maxCheckedDepth {
			return i, false
		}
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i++
		if i < len(p) && p[i] == end {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i >= len(p) || p[i] != '"' {
					return i, false
				}
				if i, ok = jsonscan.SkipString(p, i); !ok || i >= len(p) || p[i] != ':' {
					return i, false
				}
				i++
			}
			if i, ok = skipValue(p, i, depth+1); !ok || i >= len(p) {
				return i, false
			}
			switch p[i] {
			case ',':
				i++
			case end:
				return i + 1, true
			default:
				return i, false
			}
		}
	case 't':
		return jsonscan.SkipLiteral(p, i, "true")
	case 'f':
		return jsonscan.SkipLiteral(p, i, "false")
	case 'n':
		return jsonscan.SkipLiteral(p, i, "null")
	}
	return jsonscan.SkipNumber(p, i)
}
