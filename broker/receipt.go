package broker

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"

	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// Receipt is what a consumer gets with a leased delivery: where the
// delivery lives (vshard), which it is (message id, topic, subscription)
// and the lease's claim token. Only the current lease holder's receipt matches the
// token in the database, so only it can ack, nack or extend.
type Receipt struct {
	VShard shard.ID
	Topic  string
	// Epoch is the epoch of the unit's owner that handed the lease out
	// (0 for receipts of the dead-letter channel and of version 1): a
	// router that does not know an owner of that epoch reads the owner
	// records again before it routes the receipt.
	Epoch uint64
	store.Lease
}

const (
	receiptV1   = 1 // vshard, message id, token, topic, subscription
	receiptV2   = 2 // v1 with the owner's epoch after the token
	flagOrdered = 1 << 0
)

// ErrBadReceipt: the receipt is not one this router made.
var ErrBadReceipt = errors.New("malformed receipt")

// Encode returns the opaque text form (URL-safe base64).
func (r Receipt) Encode() string {
	b := make([]byte, 0, 2+2+8+8+8+1+len(r.Topic)+len(r.Subscription))
	var flags byte
	if r.Ordered {
		flags |= flagOrdered
	}
	b = append(b, receiptV2, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(r.VShard))
	b = binary.BigEndian.AppendUint64(b, r.MessageID)
	b = binary.BigEndian.AppendUint64(b, r.Token)
	b = binary.BigEndian.AppendUint64(b, r.Epoch)
	b = append(b, byte(len(r.Topic)))
	b = append(b, r.Topic...)
	b = append(b, r.Subscription...)
	return receiptEncoding.EncodeToString(b)
}

// DecodeReceipt parses a receipt's text form.
func DecodeReceipt(s string) (Receipt, error) {
	// Go's base64 decoders skip CR and LF even when strict: refuse them, so
	// that one receipt has exactly one text form.
	if strings.ContainsAny(s, "\r\n") {
		return Receipt{}, ErrBadReceipt
	}
	b, err := receiptEncoding.DecodeString(s)
	if err != nil || len(b) < 22 || (b[0] != receiptV1 && b[0] != receiptV2) || b[1]&^flagOrdered != 0 {
		return Receipt{}, ErrBadReceipt
	}
	r := Receipt{VShard: shard.ID(binary.BigEndian.Uint16(b[2:4]))}
	r.Ordered = b[1]&flagOrdered != 0
	r.MessageID = binary.BigEndian.Uint64(b[4:12])
	r.Token = binary.BigEndian.Uint64(b[12:20])
	rest := b[20:]
	if b[0] == receiptV2 {
		if len(rest) < 9 {
			return Receipt{}, ErrBadReceipt
		}
		r.Epoch = binary.BigEndian.Uint64(rest[:8])
		rest = rest[8:]
	}
	n := int(rest[0])
	if len(rest) < 1+n {
		return Receipt{}, ErrBadReceipt
	}
	r.Topic = string(rest[1 : 1+n])
	r.Subscription = string(rest[1+n:])
	if int(r.VShard) >= shard.Count || r.Token == 0 || !receiptName(r.Topic) || !receiptName(r.Subscription) {
		return Receipt{}, ErrBadReceipt
	}
	return r, nil
}

// receiptEncoding is strict so that one receipt has exactly one text form.
var receiptEncoding = base64.RawURLEncoding.Strict()

// receiptName reports whether a receipt's topic or subscription is a name
// the router could have put there (topology.NameRE: [a-zA-Z0-9._-]{1,128}),
// so that a forged receipt carries no other bytes (invalid UTF-8, quotes)
// further in.
func receiptName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '.' || c == '_' || c == '-' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
