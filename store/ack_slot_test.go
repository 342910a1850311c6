package store

import (
	"strings"
	"testing"
	"time"
)

func TestAckSlotRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 11, 30, 0, 123456000, time.UTC)
	claimed := at.Add(-1500 * time.Millisecond)
	for _, c := range []struct {
		name string
		a    finalAck
		fits bool
	}{
		{"the router's request id, packed", finalAck{sub: "default", consumer: "lt-a1b2c3d4-c17", request: "0123456789abcdef", attempt: 1, claimedAt: claimed}, true},
		{"a client's request id", finalAck{sub: "billing", consumer: "w", request: "req-1", attempt: 3, claimedAt: claimed}, true},
		{"no consumer, request or claim time", finalAck{sub: "s", attempt: 0}, true},
		{"upper-case hex is not packed", finalAck{sub: "default", consumer: "c", request: "0123456789ABCDEF", attempt: 1, claimedAt: claimed}, true},
		{"the most attempts", finalAck{sub: "s", attempt: 0xFFFF}, true},
		{"exactly full", finalAck{sub: strings.Repeat("s", 64-ackSlotHead-3), attempt: 1}, true},
		{"one byte over", finalAck{sub: strings.Repeat("s", 64-ackSlotHead-2), attempt: 1}, false},
		{"a long consumer", finalAck{sub: "default", consumer: strings.Repeat("c", 40), request: "0123456789abcdef", attempt: 1}, false},
		{"a request of 64 characters", finalAck{sub: "default", consumer: "c", request: strings.Repeat("r", 64), attempt: 1}, false},
		{"too many attempts", finalAck{sub: "s", attempt: 0x10000}, false},
		{"a string longer than a length byte", finalAck{sub: strings.Repeat("s", 200), attempt: 1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			slot, ok := encodeAckSlot(c.a, at)
			if ok != c.fits {
				t.Fatalf("fits %v, want %v", ok, c.fits)
			}
			if !ok {
				return
			}
			if len(slot) != ackSlotLen {
				t.Fatalf("a slot of %d bytes", len(slot))
			}
			got, when, ok := decodeAckSlot(slot)
			if !ok || got != c.a || !when.Equal(at) {
				t.Fatalf("decoded %+v at %v (%v); want %+v at %v", got, when, ok, c.a, at)
			}
		})
	}
}

func TestAckSlotRefusesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	good, _ := encodeAckSlot(finalAck{sub: "default", consumer: "c", request: "r", attempt: 1}, time.Now())
	newer := append([]byte(nil), good...)
	newer[0] = 2
	truncated := append([]byte(nil), good...)
	truncated[ackSlotHead] = 60 // a subscription longer than the slot
	for name, b := range map[string][]byte{
		"empty (the default)":   emptyAckSlot,
		"a newer version":       newer,
		"a length past the end": truncated,
		"short":                 good[:32],
	} {
		if _, _, ok := decodeAckSlot(b); ok {
			t.Errorf("%s: decoded", name)
		}
	}
}
