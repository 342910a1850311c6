package api

import (
	"unicode/utf8"

	"github.com/shardmq/shardmq/internal/jsonscan"
)

// decodeProduce decodes a produce body into req with exactly the outcome
// of decodeStrict. The common shape of a body is decoded in one pass by
// produceDecoder; a body it does not take (any error, escapes in a field
// of ours, null values, numbers it does not parse itself, deep or wide
// payloads) is decoded again by decodeStrict, so that what is accepted
// and every error's text stay decodeStrict's. decodeStrict reads a body
// four times (the strictness scan, the decoder's scan for the value's
// end, its decoding scan and the payload's skip): that was 18 % of the
// router's CPU in a batched produce.
func decodeProduce(body []byte, req *produceRequest) *apiError {
	d := produceDecoder{b: body}
	if d.request(req) {
		return nil
	}
	*req = produceRequest{}
	return decodeStrict(body, req)
}

// produceDecoder is a single-pass decoder of the produce body's common
// shape. Each method reports false for what it does not take, and the
// caller then gives up: it never reports an error of its own. What it
// takes, decodeStrict takes and decodes to the same value: valid JSON
// (RFC 8259, as encoding/json reads it) whose field names are exactly
// the request's, without a duplicate key anywhere, a lone surrogate
// escape or invalid UTF-8.
type produceDecoder struct {
	b []byte
	i int
}

// maxPayloadDepth is how deeply a payload's arrays and objects nest
// before the decoder leaves the body to decodeStrict.
const maxPayloadDepth = 32

func (d *produceDecoder) request(req *produceRequest) bool {
	d.ws()
	if !d.eat('{') {
		return false
	}
	var seen uint8
	ok := d.members(func(name []byte) bool {
		switch string(name) {
		case "messages":
			if seen&1 != 0 {
				return false
			}
			seen |= 1
			return d.messages(req)
		case "durability":
			if seen&2 != 0 {
				return false
			}
			seen |= 2
			var ok bool
			req.Durability, ok = d.plainString()
			return ok
		}
		return false
	})
	if !ok {
		return false
	}
	d.ws()
	return d.i == len(d.b)
}

// members reads an object's members after its '{' through its '}',
// calling value with each member's name (which holds no escape) once the
// decoder stands at its value.
func (d *produceDecoder) members(value func(name []byte) bool) bool {
	d.ws()
	if d.eat('}') {
		return true
	}
	for {
		d.ws()
		name, ok := d.rawString()
		if !ok {
			return false
		}
		d.ws()
		if !d.eat(':') {
			return false
		}
		d.ws()
		if !value(name) {
			return false
		}
		d.ws()
		if d.eat('}') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

func (d *produceDecoder) messages(req *produceRequest) bool {
	if !d.eat('[') {
		return false
	}
	req.Messages = make([]produceMessage, 0, 16)
	d.ws()
	if d.eat(']') {
		return true
	}
	for {
		d.ws()
		req.Messages = append(req.Messages, produceMessage{})
		if !d.message(&req.Messages[len(req.Messages)-1]) {
			return false
		}
		d.ws()
		if d.eat(']') {
			return true
		}
		if !d.eat(',') {
			return false
		}
	}
}

func (d *produceDecoder) message(m *produceMessage) bool {
	if !d.eat('{') {
		return false
	}
	var seen uint16
	return d.members(func(name []byte) bool {
		var bit uint16
		var ok bool
		switch string(name) {
		case "key":
			bit = 1 << 0
			m.Key, ok = d.plainString()
		case "payload":
			bit = 1 << 1
			start := d.i
			if ok = d.peek() != 'n' && d.value(0); ok {
				m.Payload = append([]byte(nil), d.b[start:d.i]...)
			}
		case "payload_base64":
			bit = 1 << 2
			var s string
			if s, ok = d.plainString(); ok {
				m.PayloadBase64 = &s
			}
		case "headers":
			bit = 1 << 3
			ok = d.headers(m)
		case "priority":
			bit = 1 << 4
			var n int64
			if n, ok = d.integer(); ok && int64(int(n)) == n {
				p := int(n)
				m.Priority = &p
			} else {
				ok = false
			}
		case "delay_ms":
			bit = 1 << 5
			var n int64
			if n, ok = d.integer(); ok {
				m.DelayMS = &n
			}
		case "deliver_at":
			bit = 1 << 6
			m.DeliverAt, ok = d.plainString()
		case "order_key":
			bit = 1 << 7
			m.OrderKey, ok = d.plainString()
		case "transaction_id":
			bit = 1 << 8
			m.TransactionID, ok = d.plainString()
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
}

func (d *produceDecoder) headers(m *produceMessage) bool {
	if !d.eat('{') {
		return false
	}
	m.Headers = map[string]string{}
	return d.members(func(name []byte) bool {
		if _, dup := m.Headers[string(name)]; dup {
			return false
		}
		v, ok := d.plainString()
		m.Headers[string(name)] = v
		return ok
	})
}

// integer reads a JSON integer of at most 15 digits (no fraction or
// exponent), which every integer field holds exactly.
func (d *produceDecoder) integer() (int64, bool) {
	neg := d.eat('-')
	start := d.i
	var n int64
	for d.i < len(d.b) && '0' <= d.b[d.i] && d.b[d.i] <= '9' {
		n = n*10 + int64(d.b[d.i]-'0')
		d.i++
	}
	digits := d.i - start
	if digits == 0 || digits > 15 || digits > 1 && d.b[start] == '0' {
		return 0, false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}

// plainString reads a string without escapes as a Go string.
func (d *produceDecoder) plainString() (string, bool) {
	raw, ok := d.rawString()
	return string(raw), ok
}

// rawString reads a string without escapes and answers its contents,
// which are valid UTF-8.
func (d *produceDecoder) rawString() ([]byte, bool) {
	raw, next, ok := jsonscan.PlainString(d.b, d.i)
	if ok {
		d.i = next
	}
	return raw, ok
}

// value reads any JSON value at nesting depth depth.
func (d *produceDecoder) value(depth int) bool {
	switch d.peek() {
	case '{':
		if depth >= maxPayloadDepth {
			return false
		}
		d.i++
		// Keys are compared raw (they hold no escape) and linearly: an
		// object of more keys is left to decodeStrict.
		var keys [16][]byte
		n := 0
		return d.members(func(name []byte) bool {
			if n == len(keys) {
				return false
			}
			for _, k := range keys[:n] {
				if string(k) == string(name) {
					return false
				}
			}
			keys[n] = name
			n++
			return d.value(depth + 1)
		})
	case '[':
		if depth >= maxPayloadDepth {
			return false
		}
		d.i++
		d.ws()
		if d.eat(']') {
			return true
		}
		for {
			d.ws()
			if !d.value(depth + 1) {
				return false
			}
			d.ws()
			if d.eat(']') {
				return true
			}
			if !d.eat(',') {
				return false
			}
		}
	case '"':
		return d.str()
	}
	// Numbers and literals, as isCompactJSON reads them (encode.go).
	var ok bool
	switch d.peek() {
	case 't':
		d.i, ok = jsonscan.SkipLiteral(d.b, d.i, "true")
	case 'f':
		d.i, ok = jsonscan.SkipLiteral(d.b, d.i, "false")
	case 'n':
		d.i, ok = jsonscan.SkipLiteral(d.b, d.i, "null")
	default:
		d.i, ok = jsonscan.SkipNumber(d.b, d.i)
	}
	return ok
}

// str reads a string value, escapes allowed but for lone surrogates.
func (d *produceDecoder) str() bool {
	d.i++ // '"'
	start := d.i
	ascii := true
	for d.i < len(d.b) {
		ch := d.b[d.i]
		switch {
		case ch == '"':
			ok := ascii || utf8.Valid(d.b[start:d.i])
			d.i++
			return ok
		case ch < 0x20:
			return false
		case ch >= utf8.RuneSelf:
			ascii = false
			d.i++
		case ch != '\\':
			d.i++
		case d.i+1 >= len(d.b):
			return false
		default:
			switch d.b[d.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				d.i += 2
			case 'u':
				r, ok := jsonscan.Hex4(d.b, d.i+2)
				if !ok {
					return false
				}
				d.i += 6
				if 0xd800 <= r && r <= 0xdfff {
					// A high surrogate followed by a low one, or give up.
					if r >= 0xdc00 || d.i+6 > len(d.b) || d.b[d.i] != '\\' || d.b[d.i+1] != 'u' {
						return false
					}
					r2, ok := jsonscan.Hex4(d.b, d.i+2)
					if !ok || r2 < 0xdc00 || r2 > 0xdfff {
						return false
					}
					d.i += 6
				}
			default:
				return false
			}
		}
	}
	return false
}

func (d *produceDecoder) ws() { d.i = jsonscan.SkipSpace(d.b, d.i) }

func (d *produceDecoder) peek() byte {
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *produceDecoder) eat(ch byte) bool {
	if d.i < len(d.b) && d.b[d.i] == ch {
		d.i++
		return true
	}
	return false
}
