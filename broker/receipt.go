package broker

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"

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
	receiptV3   = 3 // v2 followed by its signature (receiptSigBytes)
	flagOrdered = 1 << 0
	// receiptSigBytes is the length of a receipt's signature: HMAC-SHA256
	// cut to 128 bits, as unguessable as the claim token twice over.
	receiptSigBytes = 16
	// MinReceiptKey is the shortest key that signs receipts.
	MinReceiptKey = 32
)

// ErrBadReceipt: the receipt is not one this router made.
var ErrBadReceipt = errors.New("malformed receipt")

// Receipts makes and reads receipts, signed with a key that every router
// of a fleet shares (a receipt made by one router is acked, forwarded or
// not, at any other). A receipt whose bytes were altered — its topic
// rewritten to one the caller's token covers, its message id, vshard or
// subscription changed — fails the signature and is refused as malformed
// before anything acts on it; the token scopes a receipt is checked
// against (api/guard.go) are therefore those of the delivery it was made
// for. Receipts of versions 1 and 2 carry no signature and are refused:
// their leases run out and the deliveries come again. Safe for concurrent
// use.
type Receipts struct {
	key []byte
	// macs keeps keyed HMAC states: hmac.New derives the key's inner and
	// outer pads and allocates two hashes, which cost more than signing
	// a receipt (every claimed message signs one, every ack checks one).
	macs sync.Pool
}

// NewReceipts returns receipts signed with key (at least MinReceiptKey
// bytes).
func NewReceipts(key []byte) (*Receipts, error) {
	if len(key) < MinReceiptKey {
		return nil, fmt.Errorf("a receipt key needs at least %d bytes, got %d", MinReceiptKey, len(key))
	}
	return newReceipts(bytes.Clone(key)), nil
}

func newReceipts(key []byte) *Receipts {
	k := &Receipts{key: key}
	k.macs.New = func() any { return hmac.New(sha256.New, k.key) }
	return k
}

// RandomReceipts returns receipts signed with a random key of their own:
// for a router that serves alone (no other router can read them).
func RandomReceipts() *Receipts {
	key := make([]byte, MinReceiptKey)
	if _, err := rand.Read(key); err != nil {
		panic("crypto/rand: " + err.Error()) // never fails on supported systems
	}
	return newReceipts(key)
}

// sign returns the signature of a receipt's bytes.
func (k *Receipts) sign(b []byte) []byte {
	m := k.macs.Get().(hash.Hash)
	m.Write(b)
	var sum [sha256.Size]byte
	sig := m.Sum(sum[:0])[:receiptSigBytes]
	m.Reset()
	k.macs.Put(m)
	return sig
}

// Encode returns r's opaque, signed text form (URL-safe base64).
func (k *Receipts) Encode(r Receipt) string {
	b := make([]byte, 0, 2+2+8+8+8+1+len(r.Topic)+len(r.Subscription)+receiptSigBytes)
	var flags byte
	if r.Ordered {
		flags |= flagOrdered
	}
	b = append(b, receiptV3, flags)
	b = binary.BigEndian.AppendUint16(b, uint16(r.VShard))
	b = binary.BigEndian.AppendUint64(b, r.MessageID)
	b = binary.BigEndian.AppendUint64(b, r.Token)
	b = binary.BigEndian.AppendUint64(b, r.Epoch)
	b = append(b, byte(len(r.Topic)))
	b = append(b, r.Topic...)
	b = append(b, r.Subscription...)
	b = append(b, k.sign(b)...)
	return receiptEncoding.EncodeToString(b)
}

// Decode parses a receipt's text form and checks its signature.
func (k *Receipts) Decode(s string) (Receipt, error) {
	// Go's base64 decoders skip CR and LF even when strict: refuse them, so
	// that one receipt has exactly one text form.
	if strings.ContainsAny(s, "\r\n") {
		return Receipt{}, ErrBadReceipt
	}
	b, err := receiptEncoding.DecodeString(s)
	if err != nil || len(b) < 31+receiptSigBytes || b[0] != receiptV3 || b[1]&^flagOrdered != 0 {
		return Receipt{}, ErrBadReceipt
	}
	body, sig := b[:len(b)-receiptSigBytes], b[len(b)-receiptSigBytes:]
	if !hmac.Equal(sig, k.sign(body)) {
		return Receipt{}, ErrBadReceipt
	}
	r := Receipt{VShard: shard.ID(binary.BigEndian.Uint16(body[2:4]))}
	r.Ordered = body[1]&flagOrdered != 0
	r.MessageID = binary.BigEndian.Uint64(body[4:12])
	r.Token = binary.BigEndian.Uint64(body[12:20])
	r.Epoch = binary.BigEndian.Uint64(body[20:28])
	rest := body[28:]
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
