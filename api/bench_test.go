package api

import (
	"encoding/json"
	"fmt"
	"testing"
)

// BenchmarkValidateProduce measures decoding and validating a produce body
// of 100 messages: the router's per-request CPU before any SQL.
func BenchmarkValidateProduce(b *testing.B) {
	var msgs []map[string]any
	for i := 0; i < 100; i++ {
		msgs = append(msgs, map[string]any{"key": fmt.Sprint("order-", i, "-paid"), "payload": map[string]any{"order": i, "amount": "19.90"},
			"headers": map[string]string{"source": "bench"}, "priority": i % 10})
	}
	body, _ := json.Marshal(map[string]any{"messages": msgs})
	s := New(nil, Limits{}, nil, nil)
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var req produceRequest
		if err := json.Unmarshal(body, &req); err != nil {
			b.Fatal(err)
		}
		if _, e := s.validateProduce(&req); e != nil {
			b.Fatal(e)
		}
	}
}
