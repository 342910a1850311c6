package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/jsonscan"
)

// Request strictness (DESIGN §5 "Strictness"): unknown fields, duplicate
// object keys and invalid UTF-8 anywhere in a request body are 400, and
// numbers are range-checked before any arithmetic. encoding/json alone
// would accept all three silently: it ignores unknown fields, lets the last
// of two equal keys win and replaces invalid UTF-8 (and lone surrogate
// escapes such as "\udcff") with U+FFFD, so that two different keys could
// collide. The body is therefore read whole, checked by checkJSON on its raw
// bytes and only then decoded with DisallowUnknownFields.

// Bounds of fields kept in a column of their own size (store/limits.go).
const (
	maxConsumer  = domain.MaxConsumerBytes
	maxErrorCode = domain.MaxErrorCodeBytes
	maxLastError = domain.MaxLastErrorBytes
)

// strictError is what checkJSON found wrong, with where.
type strictError struct {
	path string // e.g. messages[3].headers["x"]; "" is the top level
	what string
}

func (e *strictError) Error() string {
	if e.path == "" {
		return e.what
	}
	return e.path + ": " + e.what
}

// span is a key's bytes in jsonChecker.arena.
type span struct{ off, n int }

// frame is one open object or array.
type frame struct {
	obj       bool
	expectKey bool                // object: the next string is a key
	keyStart  int                 // object: its keys are keys[keyStart:]
	index     int                 // array: the current element's index
	key       span                // object: the current member's key
	hasKey    bool                // object: key is set
	set       map[string]struct{} // object: its keys, once it has many
	sch       *schema             // what the value decodes into; nil: not checked
}

// manyKeys is how many keys an object holds before its duplicate check
// switches from a linear scan to a map.
const manyKeys = 16

// jsonChecker finds invalid UTF-8, lone surrogate escapes and duplicate
// object keys in one pass over a JSON text. It does not check the grammar
// (the decoder that runs next does); on malformed input it stops without a
// finding or reports one of the above, never panics, and runs in time
// linear in the input (objects with many keys use a map).
type jsonChecker struct {
	stack []frame
	keys  []span
	arena []byte
	root  *schema // the top-level value's schema; nil: names are not checked
}

var checkers = sync.Pool{New: func() any { return new(jsonChecker) }}

// checkJSON reports the first invalid UTF-8 sequence, lone surrogate escape
// or duplicate object key in b, or nil.
func checkJSON(b []byte) *strictError { return checkJSONFor(b, nil) }

// checkJSONFor is checkJSON that also holds every object key of b to the
// exact field names of what it decodes into (sch): encoding/json matches
// names without regard to case (and folds the Kelvin sign K to k), so
// {"KEY": …} would fill key, and {"key": "a", "KEY": "b"} would store "b".
func checkJSONFor(b []byte, sch *schema) *strictError {
	c := checkers.Get().(*jsonChecker)
	c.root = sch
	err := c.check(b)
	c.root = nil
	if cap(c.arena) <= 64<<10 && cap(c.stack) <= 1024 && cap(c.keys) <= 4096 {
		clear(c.stack)
		c.stack, c.keys, c.arena = c.stack[:0], c.keys[:0], c.arena[:0]
		checkers.Put(c)
	}
	return err
}

func (c *jsonChecker) check(b []byte) *strictError {
	for i := 0; i < len(b); {
		switch b[i] {
		case '{':
			c.stack = append(c.stack, frame{obj: true, expectKey: true, keyStart: len(c.keys), sch: c.childSchema()})
			i++
		case '[':
			c.stack = append(c.stack, frame{sch: c.childSchema()})
			i++
		case '}', ']':
			if len(c.stack) == 0 {
				return nil // malformed: the decoder says so
			}
			top := &c.stack[len(c.stack)-1]
			if top.obj {
				c.keys = c.keys[:top.keyStart]
			}
			*top = frame{}
			c.stack = c.stack[:len(c.stack)-1]
			i++
		case ',':
			if n := len(c.stack); n > 0 {
				top := &c.stack[n-1]
				if top.obj {
					top.expectKey = true
				} else {
					top.index++
				}
			}
			i++
		case '"':
			isKey := len(c.stack) > 0 && c.stack[len(c.stack)-1].obj && c.stack[len(c.stack)-1].expectKey
			end, escaped, err := c.scanString(b, i+1)
			if err != nil {
				if isKey {
					err.what = "an object key " + err.what
				}
				return err
			}
			if end < 0 {
				return nil // unterminated: the decoder says so
			}
			if isKey {
				if err := c.addKey(b[i+1:end], escaped); err != nil {
					return err
				}
			}
			i = end + 1
		default:
			if b[i] >= utf8.RuneSelf {
				// Outside a string only the grammar's ASCII is allowed; the
				// decoder rejects it, but name invalid UTF-8 as such.
				if r, size := utf8.DecodeRune(b[i:]); r == utf8.RuneError && size == 1 {
					return c.errorf("invalid UTF-8 at byte %d", i)
				}
			}
			i++
		}
	}
	return nil
}

// scanString checks the string whose contents start at b[i] and returns the
// index of its closing quote (-1 if there is none) and whether it holds
// escapes.
func (c *jsonChecker) scanString(b []byte, i int) (int, bool, *strictError) {
	escaped := false
	for i < len(b) {
		ch := b[i]
		switch {
		case ch == '"':
			return i, escaped, nil
		case ch == '\\':
			escaped = true
			if i+1 >= len(b) {
				return -1, escaped, nil
			}
			if b[i+1] != 'u' {
				i += 2
				continue
			}
			r, ok := jsonscan.Hex4(b, i+2)
			if !ok {
				return -1, escaped, nil // malformed escape: the decoder says so
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xdc00:
				r2, ok := rune(0), false
				if i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					r2, ok = jsonscan.Hex4(b, i+8)
				}
				if !ok || r2 < 0xdc00 || r2 > 0xdfff {
					return 0, escaped, c.errorf("string holds a lone surrogate escape \\u%04x (not valid Unicode)", r)
				}
				i += 12
			case utf16.IsSurrogate(r):
				return 0, escaped, c.errorf("string holds a lone surrogate escape \\u%04x (not valid Unicode)", r)
			default:
				i += 6
			}
		case ch < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, escaped, c.errorf("string is not valid UTF-8 (byte 0x%02x at offset %d)", ch, i)
			}
			i += size
		}
	}
	return -1, escaped, nil
}

// addKey records raw (the key's bytes between its quotes) as a key of the
// innermost object, unescaped when it holds escapes, and reports a
// duplicate.
func (c *jsonChecker) addKey(raw []byte, escaped bool) *strictError {
	top := &c.stack[len(c.stack)-1]
	off := len(c.arena)
	if escaped {
		var ok bool
		if c.arena, ok = unescape(c.arena, raw); !ok {
			return nil // malformed escape: the decoder says so
		}
	} else {
		c.arena = append(c.arena, raw...)
	}
	k := span{off, len(c.arena) - off}
	key := c.arena[off : off+k.n]
	own := c.keys[top.keyStart:]
	switch {
	case top.set != nil:
		if _, dup := top.set[string(key)]; dup {
			return c.errorf("duplicate object key %s", strconv.Quote(string(key)))
		}
		top.set[string(key)] = struct{}{}
	default:
		for _, o := range own {
			if bytes.Equal(c.arena[o.off:o.off+o.n], key) {
				return c.errorf("duplicate object key %s", strconv.Quote(string(key)))
			}
		}
		if len(own) >= manyKeys {
			top.set = make(map[string]struct{}, 2*len(own))
			for _, o := range own {
				top.set[string(c.arena[o.off:o.off+o.n])] = struct{}{}
			}
			top.set[string(key)] = struct{}{}
		}
	}
	c.keys = append(c.keys, k)
	top.key, top.hasKey, top.expectKey = k, true, false
	if top.sch != nil && top.sch.fields != nil {
		if _, ok := top.sch.fields[string(key)]; !ok {
			// Outside the member: the path names the object it is in.
			top.hasKey, top.expectKey = false, true
			err := c.errorf("unknown field %s (field names match exactly, case included)", strconv.Quote(string(key)))
			top.hasKey, top.expectKey = true, false
			return err
		}
	}
	return nil
}

// childSchema is the schema of a value opening now: the member's field of
// the object it is in, the element of the array, or the root.
func (c *jsonChecker) childSchema() *schema {
	if len(c.stack) == 0 {
		return c.root
	}
	top := &c.stack[len(c.stack)-1]
	switch {
	case top.sch == nil:
		return nil
	case !top.obj:
		return top.sch.elem
	case top.sch.fields != nil:
		if !top.hasKey {
			return nil
		}
		return top.sch.fields[string(c.arena[top.key.off:top.key.off+top.key.n])]
	default: // a map: every value is its element
		return top.sch.elem
	}
}

// schema is what the checker knows of a Go type a JSON value decodes
// into: the exact field names of a struct (with their schemas), or the
// element of a slice or map. A nil schema checks nothing below it
// (json.RawMessage, any, scalars).
type schema struct {
	fields map[string]*schema // a struct's JSON names; nil for others
	elem   *schema            // a slice's or map's element
}

var schemas sync.Map // reflect.Type → *schema

// schemaOf returns the schema of t, built once per type.
func schemaOf(t reflect.Type) *schema {
	if v, ok := schemas.Load(t); ok {
		return v.(*schema)
	}
	sch := buildSchema(t, map[reflect.Type]*schema{})
	schemas.Store(t, sch)
	return sch
}

func buildSchema(t reflect.Type, seen map[reflect.Type]*schema) *schema {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[json.RawMessage]() {
		return nil
	}
	if s, ok := seen[t]; ok {
		return s
	}
	switch t.Kind() {
	case reflect.Struct:
		s := &schema{fields: map[string]*schema{}}
		seen[t] = s
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case name == "-":
				continue
			case name == "" && f.Anonymous && ft.Kind() == reflect.Struct:
				// Embedded: its fields are the outer struct's.
				if inner := buildSchema(ft, seen); inner != nil {
					for n, fs := range inner.fields {
						if _, ok := s.fields[n]; !ok {
							s.fields[n] = fs
						}
					}
				}
				continue
			case name == "":
				name = f.Name
			}
			s.fields[name] = buildSchema(f.Type, seen)
		}
		return s
	case reflect.Slice, reflect.Array, reflect.Map:
		if e := buildSchema(t.Elem(), seen); e != nil {
			return &schema{elem: e}
		}
	}
	return nil
}

// unescape appends the unescaped form of a JSON string's contents to dst.
func unescape(dst, s []byte) ([]byte, bool) {
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			dst = append(dst, s[i])
			i++
			continue
		}
		if i+1 >= len(s) {
			return dst, false
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			dst = append(dst, e)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := jsonscan.Hex4(s, i+2)
			if !ok {
				return dst, false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				r2, ok := jsonscan.Hex4(s, i+2)
				if !ok || i+1 >= len(s) || s[i] != '\\' || s[i+1] != 'u' {
					return dst, false
				}
				r = utf16.DecodeRune(r, r2)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			return dst, false
		}
		i += 2
	}
	return dst, true
}

// errorf makes a finding at the current path.
func (c *jsonChecker) errorf(format string, a ...any) *strictError {
	return &strictError{path: c.path(), what: fmt.Sprintf(format, a...)}
}

// path renders where the scan is, e.g. messages[3].headers["a b"].
func (c *jsonChecker) path() string {
	var sb strings.Builder
	for i := range c.stack {
		f := &c.stack[i]
		if !f.obj {
			sb.WriteString("[" + strconv.Itoa(f.index) + "]")
			continue
		}
		if f.expectKey || !f.hasKey {
			break // between members: the object itself
		}
		k := string(c.arena[f.key.off : f.key.off+f.key.n])
		if plainName(k) {
			if sb.Len() > 0 {
				sb.WriteByte('.')
			}
			sb.WriteString(k)
		} else {
			sb.WriteString("[" + strconv.Quote(k) + "]")
		}
	}
	return sb.String()
}

func plainName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		ch := k[i]
		if !(ch == '_' || ch == '-' || 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9') {
			return false
		}
	}
	return true
}

// readBody reads the request body within MaxBody.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body := http.MaxBytesReader(w, r.Body, s.limits.MaxBody)
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= s.limits.MaxBody {
		buf.Grow(int(r.ContentLength) + 1)
	}
	if _, err := buf.ReadFrom(body); err != nil {
		return nil, s.bodyError(err)
	}
	return buf.Bytes(), nil
}

// bodyError is the answer to a request whose body could not be read: 413
// over MaxBody, 408 when it did not arrive in time (a slow or stalled
// client), else 400. The text never carries the connection's addresses.
func (s *Server) bodyError(err error) *apiError {
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		return fail(CodeRequestTooLarge, "request body exceeds "+strconv.FormatInt(s.limits.MaxBody, 10)+" bytes")
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, os.ErrDeadlineExceeded):
		return fail(CodeRequestTimeout, "the request body did not arrive in time")
	}
	return fail(CodeInvalidRequest, "the request body could not be read whole")
}

// tooLarge answers a request whose Content-Length already says its body is
// over MaxBody, before anything reads it — so that a client sending
// "Expect: 100-continue" gets 413 instead of "100 Continue".
func (s *Server) tooLarge(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength <= s.limits.MaxBody {
		return false
	}
	writeError(w, fail(CodeRequestTooLarge, "request body of "+strconv.FormatInt(r.ContentLength, 10)+" bytes exceeds "+
		strconv.FormatInt(s.limits.MaxBody, 10)+" bytes"))
	return true
}

// canonicalPath says whether r's path is in the form the routes are
// written in: no empty, "." or ".." segments (compared escaped, as the
// routes match, so an escaped "/" inside a key is fine). http.ServeMux
// would answer other forms with an HTML redirect; the API answers them
// 404 in its JSON shape instead.
func canonicalPath(r *http.Request) (string, bool) {
	p := r.URL.EscapedPath()
	if p == "" || p[0] != '/' {
		return "/" + p, false
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean, clean == p
}

// decodeStrict decodes one JSON value from body into v, refusing invalid
// UTF-8, lone surrogates, duplicate keys, unknown fields, values of the
// wrong type or range for their field, and anything after the value.
func decodeStrict(body []byte, v any) *apiError {
	if len(bytes.TrimLeft(body, " \t\r\n")) == 0 {
		return fail(CodeInvalidJSON, emptyBody)
	}
	if e := checkJSONFor(body, schemaOf(reflect.TypeOf(v))); e != nil {
		return fail(CodeInvalidRequest, "request body: "+e.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fail(CodeInvalidJSON, "request body has data after the JSON value")
	}
	return nil
}

// decodeError turns a decoder error into the answer: the field and what it
// needs for a wrong type or unknown field, the offset for a syntax error.
func decodeError(err error) *apiError {
	var typ *json.UnmarshalTypeError
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return fail(CodeInvalidJSON, "request body must be a JSON object, not "+typ.Value)
		}
		return fail(CodeInvalidRequest, fmt.Sprintf("field %s must be %s, got %s", field, kindName(typ.Type.String()), typ.Value))
	case errors.As(err, &syn):
		return fail(CodeInvalidJSON, fmt.Sprintf("request body is not valid JSON at byte %d: %v", syn.Offset, err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fail(CodeInvalidJSON, "request body is not valid JSON: it ends too early")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		// encoding/json has no typed error for an unknown field.
		return fail(CodeInvalidRequest, "unknown field "+f)
	}
	return fail(CodeInvalidJSON, "request body is not valid JSON for this endpoint: "+err.Error())
}

// kindName says in the API's words what a Go type accepts.
func kindName(goType string) string {
	goType = strings.TrimPrefix(goType, "*")
	switch goType {
	case "int", "int64", "int32":
		return "an integer in range"
	case "float64":
		return "a number in range"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	}
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["):
		return "an object of strings"
	}
	return "an object"
}

// millis converts a field given in milliseconds after checking it lies in
// [lo, hi]: the check is on the integer itself, so that no multiplication
// can overflow first (9223372036854775807 ms is refused, not wrapped).
func millis(field string, v int64, lo, hi time.Duration) (time.Duration, *apiError) {
	if v < lo.Milliseconds() || v > hi.Milliseconds() {
		return 0, fail(CodeInvalidRequest, fmt.Sprintf("%s must be %d-%d, got %d", field, lo.Milliseconds(), hi.Milliseconds(), v))
	}
	return time.Duration(v) * time.Millisecond, nil
}

// cutUTF8 shortens s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
