// Package jsonscan holds the byte-level steps of shardmq's one-pass JSON
// readers (the router's produce decoder and compactness check, the load
// tester's claim reader): each answers the index just past what it read
// and whether it was there, valid as encoding/json reads JSON. The readers
// built on them decline what they are not sure of and leave it to
// encoding/json.
package jsonscan

import "unicode/utf8"

// SkipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func SkipSpace(p []byte, i int) int {
	for i < len(p) {
		switch p[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// PlainString reads the string that opens at p[i] when it holds no escape
// and is valid UTF-8: its contents (aliasing p), the index past it, and
// false for any other string.
func PlainString(p []byte, i int) (raw []byte, next int, ok bool) {
	if i >= len(p) || p[i] != '"' {
		return nil, i, false
	}
	i++
	start := i
	ascii := true
	for i < len(p) {
		ch := p[i]
		switch {
		case ch == '"':
			raw := p[start:i]
			return raw, i + 1, ascii || utf8.Valid(raw)
		case ch == '\\' || ch < 0x20:
			return nil, i, false
		case ch >= utf8.RuneSelf:
			ascii = false
		}
		i++
	}
	return nil, i, false
}

// SkipLiteral returns the index just past lit at p[i:].
func SkipLiteral(p []byte, i int, lit string) (int, bool) {
	if len(p)-i < len(lit) || string(p[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// SkipString returns the index just past the string that opens at p[i].
// Bytes from 0x80 up pass unchecked, as encoding/json's scanner passes them.
func SkipString(p []byte, i int) (int, bool) {
	for i++; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			i++
			if i >= len(p) {
				return i, false
			}
			switch p[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if _, ok := Hex4(p, i+1); !ok {
					return i, false
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

// SkipNumber returns the index just past the number at p[i:]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func SkipNumber(p []byte, i int) (int, bool) {
	if i < len(p) && p[i] == '-' {
		i++
	}
	switch {
	case i >= len(p):
		return i, false
	case p[i] == '0':
		i++
	case '1' <= p[i] && p[i] <= '9':
		i = digits(p, i+1)
	default:
		return i, false
	}
	if i < len(p) && p[i] == '.' {
		start := i + 1
		if i = digits(p, start); i == start {
			return i, false
		}
	}
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		if i < len(p) && (p[i] == '+' || p[i] == '-') {
			i++
		}
		start := i
		if i = digits(p, start); i == start {
			return i, false
		}
	}
	return i, true
}

func digits(p []byte, i int) int {
	for i < len(p) && '0' <= p[i] && p[i] <= '9' {
		i++
	}
	return i
}

// Hex4 reads the four hex digits of a \u escape at b[i:].
func Hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, ch := range b[i : i+4] {
		switch {
		case '0' <= ch && ch <= '9':
			ch -= '0'
		case 'a' <= ch && ch <= 'f':
			ch = ch - 'a' + 10
		case 'A' <= ch && ch <= 'F':
			ch = ch - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(ch)
	}
	return r, true
}
