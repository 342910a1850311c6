package api

import (
	"encoding/json"
	"fmt"
	"testing"
)

// produceBody is BenchmarkValidateProduce's body: 100 messages with a key,
// a small JSON payload, one header and a priority.
func produceBody() []byte {
	var msgs []map[string]any
	for i := 0; i < 100; i++ {
		msgs = append(msgs, map[string]any{"key": fmt.Sprint("order-", i, "-paid"), "payload": map[string]any{"order": i, "amount": "19.90"},
			"headers": map[string]string{"source": "bench"}, "priority": i % 10})
	}
	body, _ := json.Marshal(map[string]any{"messages": msgs})
	return body
}

// BenchmarkCheckJSON is the strictness scan alone (UTF-8, surrogates,
// duplicate keys) over the produce body.
func BenchmarkCheckJSON(b *testing.B) {
	body := produceBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if e := checkJSON(body); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkDecodeStrictProduce is what a produce costs before any SQL
// since requests are strict: the scan, decoding with unknown fields
// refused, and validation. Compare with BenchmarkValidateProduce (plain
// json.Unmarshal and validation, as before).
func BenchmarkDecodeStrictProduce(b *testing.B) {
	body := produceBody()
	s := New(nil, Limits{}, nil, nil)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var req produceRequest
		if e := decodeStrict(body, &req); e != nil {
			b.Fatal(e)
		}
		if _, e := s.validateProduce(&req); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkDecodeProduce is what the produce handler runs before any SQL
// (decodeProduce and validation), over the body above and over one of the
// load tester's shape.
func BenchmarkDecodeProduce(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{{"headers", produceBody()}, {"loadtest", loadtestBody()}} {
		b.Run(bc.name, func(b *testing.B) {
			s := New(nil, Limits{}, nil, nil)
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				var req produceRequest
				if e := decodeProduce(bc.body, &req); e != nil {
					b.Fatal(e)
				}
				if _, e := s.validateProduce(&req); e != nil {
					b.Fatal(e)
				}
			}
		})
	}
}
