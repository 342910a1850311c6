package loadtest

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/internal/jsonscan"
)

// A claim's answer is most of what a drain's consumers read: about 500
// bytes of JSON per message. encoding/json read it at about 8 µs of the
// generator's CPU per message (it checks the whole answer, then decodes
// it by reflection), a twentieth of what a drain costs the machine per
// message, taken from the router and the servers the drain measures.
// decodeClaim reads the router's answer in one pass instead. It is exact
// or it declines: anything it is not sure to read as encoding/json would
// (an escape or invalid UTF-8 in a member name anywhere or in a string it
// keeps, a field name that differs from a kept one only in case,
// malformed JSON anywhere) makes it answer false, and the caller decodes
// the answer with encoding/json (TestDecodeClaimAsEncodingJSON,
// FuzzDecodeClaim).

// claimJSON is a claim's answer as encoding/json reads it.
type claimJSON struct {
	Messages []struct {
		ID         string          `json:"id"`
		Key        string          `json:"key"`
		Payload    json.RawMessage `json:"payload"`
		ProducedAt time.Time       `json:"produced_at"`
		Attempt    int             `json:"attempt"`
		Receipt    string          `json:"receipt"`
		VShard     int             `json:"vshard"`
	} `json:"messages"`
}

func (c claimJSON) deliveries() []Delivery {
	ds := make([]Delivery, len(c.Messages))
	for i, m := range c.Messages {
		ds[i] = Delivery{Key: m.Key, VShard: m.VShard, Attempt: m.Attempt, ProducedAt: m.ProducedAt, Payload: m.Payload, Receipt: Receipt{text: m.Receipt}}
		ds[i].ID, _ = strconv.ParseUint(m.ID, 10, 64)
	}
	return ds
}

// claimAnswer decodes a claim's answer for Router.do: decodeClaim, else
// encoding/json.
type claimAnswer struct{ deliveries []Delivery }

func (a *claimAnswer) decodeJSON(data []byte) error {
	if ds, ok := decodeClaim(data); ok {
		a.deliveries = ds
		return nil
	}
	var c claimJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return err
	}
	a.deliveries = c.deliveries()
	return nil
}

// decodeClaim reads {"messages":[…]} into deliveries whose payloads alias
// data; false when it cannot be sure to answer as encoding/json.
func decodeClaim(data []byte) ([]Delivery, bool) {
	s := scanner{b: data}
	out := []Delivery{} // never nil, as claimJSON.deliveries
	seen := false
	ok := s.object(func(name []byte) bool {
		if string(name) != "messages" {
			if bytes.EqualFold(name, []byte("messages")) {
				return false
			}
			return s.value()
		}
		if seen {
			return false // encoding/json decodes a repeat into the first's elements
		}
		seen = true
		if s.literal("null") {
			return true
		}
		return s.array(func() bool {
			var d Delivery
			if !s.delivery(&d) {
				return false
			}
			out = append(out, d)
			return true
		})
	})
	s.space()
	if !ok || s.i != len(s.b) {
		return nil, false
	}
	return out, true
}

// scanner walks JSON text; every method reports false on anything it
// does not accept.
type scanner struct {
	b     []byte
	i     int
	depth int
}

// maxDepth bounds the nesting value skips (encoding/json's is 10,000).
const maxDepth = 1000

func (s *scanner) space() { s.i = jsonscan.SkipSpace(s.b, s.i) }

// next skips white space and consumes c.
func (s *scanner) next(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) peek() byte {
	s.space()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) literal(lit string) bool {
	s.space()
	i, ok := jsonscan.SkipLiteral(s.b, s.i, lit)
	if ok {
		s.i = i
	}
	return ok
}

// object reads {…}, calling member for each name with the scanner before
// its value, which member must read. name aliases the text.
func (s *scanner) object(member func(name []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		name, ok := s.plain()
		if !ok || !s.next(':') || !member(name) {
			return false
		}
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// array reads […], calling elem for each element.
func (s *scanner) array(elem func() bool) bool {
	if !s.next('[') {
		return false
	}
	if s.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.next(']') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// plain reads a string without escapes, in valid UTF-8: its text is then
// exactly what encoding/json would decode. The answer aliases the text.
func (s *scanner) plain() ([]byte, bool) {
	s.space()
	v, next, ok := jsonscan.PlainString(s.b, s.i)
	if ok {
		s.i = next
	}
	return v, ok
}

func (s *scanner) plainString() (string, bool) {
	v, ok := s.plain()
	return string(v), ok
}

// value skips any JSON value, checking it as encoding/json would.
func (s *scanner) value() bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	defer func() { s.depth-- }()
	switch c := s.peek(); {
	case c == '{':
		return s.object(func([]byte) bool { return s.value() })
	case c == '[':
		return s.array(s.value)
	case c == '"':
		return s.anyString()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, ok := s.number()
		return ok
	}
	return false
}

// anyString skips a string, escapes included.
func (s *scanner) anyString() bool {
	s.space()
	i, ok := jsonscan.SkipString(s.b, s.i) // s.b[s.i] is '"': value peeked it
	s.i = i
	return ok
}

// number reads a JSON number's text.
func (s *scanner) number() ([]byte, bool) {
	s.space()
	start := s.i
	i, ok := jsonscan.SkipNumber(s.b, s.i)
	s.i = i
	return s.b[start:i], ok
}

// int reads a number that encoding/json would store in an int.
func (s *scanner) int() (int, bool) {
	t, ok := s.number()
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(t)) // no copy: t does not escape
	return n, err == nil
}

// claimFields are the fields of a delivery decodeClaim keeps.
var claimFields = [][]byte{[]byte("id"), []byte("key"), []byte("payload"), []byte("produced_at"), []byte("attempt"), []byte("receipt"), []byte("vshard")}

// delivery reads one message of a claim's answer into d.
func (s *scanner) delivery(d *Delivery) bool {
	if s.literal("null") {
		return true // encoding/json leaves a null element zero
	}
	return s.object(func(name []byte) bool { return s.field(d, name) })
}

// field reads the value of d's member name.
func (s *scanner) field(d *Delivery, name []byte) bool {
	switch string(name) {
	case "id":
		if s.literal("null") {
			return true
		}
		v, ok := s.plain()
		if !ok {
			return false
		}
		d.ID, _ = strconv.ParseUint(string(v), 10, 64)
		return true
	case "key", "receipt":
		if s.literal("null") {
			return true
		}
		v, ok := s.plainString()
		if !ok {
			return false
		}
		if name[0] == 'k' {
			d.Key = v
		} else {
			d.Receipt = Receipt{text: v}
		}
		return true
	case "payload":
		s.space()
		start := s.i
		if !s.value() {
			return false
		}
		// As json.RawMessage: the value's text, null included.
		d.Payload = s.b[start:s.i:s.i]
		return true
	case "produced_at":
		if s.literal("null") {
			return true
		}
		s.space()
		start := s.i
		if _, ok := s.plain(); !ok {
			return false
		}
		return d.ProducedAt.UnmarshalJSON(s.b[start:s.i]) == nil
	case "attempt", "vshard":
		if s.literal("null") {
			return true
		}
		n, ok := s.int()
		if !ok {
			return false
		}
		if name[0] == 'a' {
			d.Attempt = n
		} else {
			d.VShard = n
		}
		return true
	}
	for _, f := range claimFields {
		if bytes.EqualFold(name, f) {
			return false
		}
	}
	return s.value()
}
