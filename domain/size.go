package domain

import "unicode/utf8"

// StoredSize is what a message weighs in the statements that write it
// (payload, headers and keys, plus a row's fixed columns): what a group
// commit's byte cap counts, to keep a transaction's statements under the
// server's max_allowed_packet.
func StoredSize(m *Message) int {
	return len(m.Payload) + len(m.Headers) + len(m.Key) + len(m.OrderKey) + len(m.TransactionID) + 64
}

// EncodedSize is what a message counts against an answer's byte cap (a
// claim's max_bytes, a dead-letter or transaction listing's max_bytes):
// the size of its JSON in the answer (payload as JSON or base64, headers,
// keys escaped), plus the fields every answered message carries (about
// 300 bytes with a receipt). Counting the encoded form, not the stored
// bytes, keeps an answer of binary payloads (a third larger in base64)
// under the cap it was asked for.
func EncodedSize(m *Message) int {
	return EncodedSizeOf(m.Topic, m.Key, m.OrderKey, m.TransactionID, len(m.Headers), len(m.Payload), m.PayloadJSON)
}

// EncodedSizeOf is EncodedSize from a message's lengths, for a listing
// that sizes its page before it reads any payload.
func EncodedSizeOf(topic, key, orderKey, txID string, headers, payload int, payloadJSON bool) int {
	n := 300 + headers + JSONStringLen(key) + JSONStringLen(orderKey) + JSONStringLen(txID) + JSONStringLen(topic)
	if payloadJSON {
		return n + payload
	}
	return n + 2 + (payload+2)/3*4
}

// JSONStringLen is the length of s as a JSON string without HTML
// escaping, quotes included.
func JSONStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
				n += 2
			case c < 0x20:
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6 // \ufffd
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
