package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// discardWriter is a ResponseWriter that keeps nothing, so a benchmark
// measures the encoding alone.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

// benchDeliveries is a claim of n messages shaped like the load tester's:
// a JSON object payload of 100-300 bytes, no headers.
func benchDeliveries(n int, binary bool) []broker.Delivery {
	pad := strings.Repeat("abcdefghijklmnopqrstuvwxyz0123456789", 9)
	now := time.Date(2026, 12, 2, 3, 4, 5, 123456789, time.UTC)
	got := make([]broker.Delivery, n)
	for i := range got {
		key := "run-1.k" + strings.Repeat("7", i%5) + "-paid"
		payload := []byte(`{"k":"` + key + `","p":"` + pad[:80+(i*37)%200] + `"}`)
		m := &domain.Message{ID: 1234567890123 + uint64(i), VShard: uint16(i * 7 % 1024), Topic: "orders", Key: key,
			Priority: i % 10, PayloadJSON: !binary, Payload: payload, CreatedAt: now.Add(-time.Duration(i) * time.Millisecond)}
		got[i] = broker.Delivery{Claimed: store.Claimed{Message: m, Attempt: 1, LeaseExpires: now.Add(30 * time.Second)},
			Receipt: "v1.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDE" + strings.Repeat("x", i%3)}
	}
	return got
}

// BenchmarkWriteClaimed measures answering a claim of 100 messages: the
// router's CPU per claim after the store answered.
func BenchmarkWriteClaimed(b *testing.B) {
	for _, c := range []struct {
		name   string
		binary bool
	}{{"json", false}, {"base64", true}} {
		b.Run(c.name, func(b *testing.B) {
			s := New(nil, Limits{}, nil, nil)
			got := benchDeliveries(100, c.binary)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				s.writeClaimed(w, got)
			}
		})
	}
}

// BenchmarkWriteLeaseResults measures answering an ack of 100 receipts.
func BenchmarkWriteLeaseResults(b *testing.B) {
	s := New(nil, Limits{}, nil, nil)
	receipts := make([]string, 100)
	res := make([]broker.LeaseResult, 100)
	for i := range receipts {
		receipts[i] = "v1.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDE"
		res[i] = broker.LeaseResult{Status: domain.LeaseOK}
	}
	r, _ := http.NewRequest(http.MethodPost, "/", nil)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		s.writeLeaseResults(w, r, receipts, res)
	}
}

// BenchmarkWriteProduceResults measures answering a produce of 100
// messages: appendProduceResults, and encoding/json (what it replaced).
func BenchmarkWriteProduceResults(b *testing.B) {
	out := make([]produceResult, 100)
	for i := range out {
		out[i] = produceResult{Key: "run-1.k" + strings.Repeat("7", i%5) + "-paid", ID: strconv.FormatUint(1234567890123+uint64(i), 10),
			VShard: i * 7 % 1024, Status: domain.ProduceCreated}
	}
	w := &discardWriter{h: http.Header{}}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf := getBuffer()
			buf.b = appendProduceResults(buf.b, out)
			writeBody(w, http.StatusOK, buf.b)
			putBuffer(buf)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			writeJSON(w, http.StatusOK, map[string]any{"results": out})
		}
	})
}

// BenchmarkDecodeAck measures reading an ack body of 100 receipts:
// decodeStrict alone, and the ack's path (decodeReceiptsBody).
func BenchmarkDecodeAck(b *testing.B) {
	receipts := make([]string, 100)
	for i := range receipts {
		receipts[i] = "v1.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDE"
	}
	body, _ := json.Marshal(ackRequest{Receipts: receipts})
	for _, c := range []struct {
		name   string
		decode func([]byte, any) *apiError
	}{{"strict", decodeStrict}, {"ack", decodeReceiptsBody}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var req ackRequest
				if e := c.decode(body, &req); e != nil || len(req.Receipts) != 100 {
					b.Fatal(e)
				}
			}
		})
	}
}
