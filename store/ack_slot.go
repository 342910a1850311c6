package store

import (
	"encoding/binary"
	"encoding/hex"
	"time"
)

// The final ack's slot. A final ack used to write its details (the
// subscription, consumer, attempt, claim time, request and its own time)
// into columns of the message row that were NULL until then: the row grew
// by some 50 bytes, more than its page had free, so acking a page of
// fresh messages split it, on the primary and again on every replica
// (docs/performance.md, "the final ack splits the message row's page").
//
// ack_slot is a fixed-size column every message row carries from its
// insert (its default, ackSlotLen zero bytes, which the INSERT does not
// name, so the binary log does not carry it either). A final ack whose
// details fit writes them there, encoded to exactly that length, with the
// status byte: both are written in place, and the page does not split. A
// final ack that does not fit (a long consumer name or request id), and
// every final ack while a router that does not read the slot is a live
// member (Store.SetAckSlots), writes the acked_* columns as before;
// readers take whichever the row has.
//
// The slot is only in place when the row stored it at insert. MariaDB
// leaves out of a row the trailing columns that still hold the default of
// a column added instantly (ALTER TABLE … ADD COLUMN without a rebuild),
// so a message_store that held rows when migration 19 added the column
// keeps growing its rows at the final ack until it is rebuilt
// (`ALTER TABLE message_store FORCE`, online); migration 20 rebuilds the
// table itself when it is small (ackSlotRebuildMax rows).
//
// Layout, big-endian:
//
//	[0]      version: 0 empty (the default), 1
//	[1:9]    the ack's time, Unix microseconds
//	[9:17]   the claim's time, Unix microseconds (0: none)
//	[17:19]  the attempt
//	[19:]    subscription, consumer, request: each a length byte and its
//	         bytes; a request of 16 lowercase hex digits (the router's
//	         own ids) is packed into 8 bytes, its length byte 0x80|8.
//	         The rest is zero.
const ackSlotLen = 64

const (
	ackSlotVersion = 1
	ackSlotHead    = 19
	// ackSlotPacked marks a length byte whose bytes are hex digits packed
	// two to a byte.
	ackSlotPacked = 0x80
)

// The most message_store may hold for migration 20 to rebuild it (a few
// seconds of copying), and how long the rebuild waits for the table's
// metadata lock; a bigger table is left to its operator.
const (
	ackSlotRebuildMax      = 100_000
	ackSlotRebuildBytes    = 256 << 20
	ackSlotRebuildLockWait = 5 * time.Second
)

// emptyAckSlot is the slot of a message not acked through it: the
// column's default.
var emptyAckSlot = make([]byte, ackSlotLen)

// encodeAckSlot encodes a final ack written at at; false when it does not
// fit the slot (the caller writes the acked_* columns instead).
func encodeAckSlot(a finalAck, at time.Time) ([]byte, bool) {
	if a.columns || a.attempt < 0 || a.attempt > 0xFFFF {
		return nil, false
	}
	b := make([]byte, ackSlotHead, ackSlotLen)
	b[0] = ackSlotVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(at.UnixMicro()))
	if !a.claimedAt.IsZero() {
		binary.BigEndian.PutUint64(b[9:17], uint64(a.claimedAt.UnixMicro()))
	}
	binary.BigEndian.PutUint16(b[17:19], uint16(a.attempt))
	b = appendSlotString(b, a.sub, false)
	b = appendSlotString(b, a.consumer, false)
	b = appendSlotString(b, a.request, true)
	if b == nil || len(b) > ackSlotLen {
		return nil, false
	}
	return b[:ackSlotLen], true
}

// appendSlotString appends s with its length byte; nil when it is too long
// for a length byte. A request may be packed (see ackSlotLen).
func appendSlotString(b []byte, s string, pack bool) []byte {
	if b == nil {
		return nil
	}
	if pack && len(s) == 16 && isLowerHex(s) {
		b = append(b, ackSlotPacked|8)
		b, _ = hex.AppendDecode(b, []byte(s)) // lower hex: it decodes
		return b
	}
	if len(s) >= ackSlotPacked {
		return nil
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// decodeAckSlot reads a slot written by encodeAckSlot: the final ack and
// its time. false for an empty slot or one it cannot read (a newer
// version).
func decodeAckSlot(b []byte) (finalAck, time.Time, bool) {
	var a finalAck
	if len(b) != ackSlotLen || b[0] != ackSlotVersion {
		return a, time.Time{}, false
	}
	at := time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC()
	if c := binary.BigEndian.Uint64(b[9:17]); c != 0 {
		a.claimedAt = time.UnixMicro(int64(c)).UTC()
	}
	a.attempt = int(binary.BigEndian.Uint16(b[17:19]))
	rest := b[ackSlotHead:]
	var ok bool
	if a.sub, rest, ok = slotString(rest); !ok {
		return a, time.Time{}, false
	}
	if a.consumer, rest, ok = slotString(rest); !ok {
		return a, time.Time{}, false
	}
	if a.request, _, ok = slotString(rest); !ok {
		return a, time.Time{}, false
	}
	return a, at, true
}

// slotString reads one length-prefixed string off b.
func slotString(b []byte) (string, []byte, bool) {
	if len(b) == 0 {
		return "", nil, false
	}
	n, packed := int(b[0]&^ackSlotPacked), b[0]&ackSlotPacked != 0
	if len(b) < 1+n {
		return "", nil, false
	}
	s := b[1 : 1+n]
	if packed {
		return hex.EncodeToString(s), b[1+n:], true
	}
	return string(s), b[1+n:], true
}

// FinalAckSlot is the slot a final ack of subscription sub by consumer,
// at attempt, claimed at claimedAt, in request, written at at, leaves on
// its message row; false when it does not fit (the acked_* columns are
// written instead). The load tester's floor writes what the product
// writes with it.
func FinalAckSlot(sub, consumer, request string, attempt int, claimedAt, at time.Time) ([]byte, bool) {
	return encodeAckSlot(finalAck{sub: sub, consumer: consumer, request: request, attempt: attempt, claimedAt: claimedAt.UTC()}, at.Truncate(time.Microsecond))
}
