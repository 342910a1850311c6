package broker

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func BenchmarkFingerprintKey(b *testing.B) {
	p := []byte(`{"order":42,"amount":"19.90","currency":"EUR"}`)
	for i := 0; i < b.N; i++ {
		FingerprintKey("orders", "tx-9", p)
	}
}

func BenchmarkReceiptRoundTrip(b *testing.B) {
	k := RandomReceipts()
	r := Receipt{VShard: 517, Topic: "orders"}
	r.MessageID, r.Token, r.Subscription = 385432089608519680, 0xdeadbeef, "billing"
	for i := 0; i < b.N; i++ {
		if _, err := k.Decode(k.Encode(r)); err != nil {
			b.Fatal(err)
		}
	}
}

// A receipt reads back as it was made; one altered anywhere — a byte of
// it flipped, its topic rewritten to another of the same length, signed
// with another key, cut short, or unsigned as versions 1 and 2 were — is
// refused.
func TestReceiptRoundTripAndTampering(t *testing.T) {
	t.Parallel()
	k, err := NewReceipts([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewReceipts([]byte("short")); err == nil {
		t.Fatal("a 5-byte receipt key accepted")
	}
	r := Receipt{VShard: 1023, Topic: "orders.v2", Epoch: 7}
	r.MessageID, r.Token, r.Subscription, r.Ordered = 385432089608519680, 0xdeadbeef, "billing", true
	text := k.Encode(r)
	got, err := k.Decode(text)
	if err != nil || got != r {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, r)
	}
	raw, err := receiptEncoding.DecodeString(text)
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		for _, bit := range []byte{1, 0x20, 0x80} {
			b := bytes.Clone(raw)
			b[i] ^= bit
			if got, err := k.Decode(receiptEncoding.EncodeToString(b)); err == nil {
				t.Fatalf("byte %d flipped by %#x: accepted as %+v", i, bit, got)
			}
		}
	}
	other := bytes.Replace(raw, []byte("orders.v2"), []byte("payments9"), 1)
	if _, err := k.Decode(receiptEncoding.EncodeToString(other)); err == nil {
		t.Fatal("a receipt with its topic rewritten accepted")
	}
	if _, err := RandomReceipts().Decode(text); err == nil {
		t.Fatal("a receipt accepted under another key")
	}
	// Versions 1 and 2 (unsigned), as routers before signing made them.
	for _, v := range []byte{receiptV1, receiptV2} {
		u := []byte{v, 1, 0x03, 0xff}
		u = binary.BigEndian.AppendUint64(u, r.MessageID)
		u = binary.BigEndian.AppendUint64(u, r.Token)
		if v == receiptV2 {
			u = binary.BigEndian.AppendUint64(u, r.Epoch)
		}
		u = append(append(append(u, byte(len(r.Topic))), r.Topic...), r.Subscription...)
		if _, err := k.Decode(receiptEncoding.EncodeToString(u)); err == nil {
			t.Fatalf("an unsigned version %d receipt accepted", v)
		}
	}
	for _, bad := range []string{"", "AQ", "!!!", text[:20], text[:len(text)-1], text + "\n", text[:30]} {
		if _, err := k.Decode(bad); err == nil {
			t.Errorf("Decode(%q) accepted", bad)
		}
	}
}
