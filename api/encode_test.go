package api

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// encodeClaimedReference is the claim answer as encoding/json writes it:
// what appendClaimed must reproduce byte for byte.
func encodeClaimedReference(s *Server, got []broker.Delivery) ([]byte, error) {
	out := make([]claimedMessage, len(got))
	for i, d := range got {
		out[i] = claimedMessage{messageBody: s.bodyOf(d.Message), Attempt: d.Attempt, Receipt: d.Receipt,
			LeaseExpires: formatTime(d.LeaseExpires), ErrorCode: d.ErrorCode}
	}
	return encodeReference(map[string]any{"messages": out})
}

// encodeReference is v as writeJSON wrote every answer before the
// hand-written encoders: encoding/json, no HTML escaping, a newline.
func encodeReference(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return buf.Bytes(), err
}

func checkClaimedMatches(t *testing.T, s *Server, got []broker.Delivery) {
	t.Helper()
	want, wantErr := encodeClaimedReference(s, got)
	have, err := s.appendClaimed(nil, got)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("appendClaimed error %v, encoding/json error %v", err, wantErr)
	}
	if err == nil && !bytes.Equal(have, want) {
		t.Fatalf("appendClaimed differs from encoding/json:\nhave %q\nwant %q", have, want)
	}
}

// trickyStrings are the strings whose encoding differs between naive
// quoting and encoding/json.
var trickyStrings = []string{
	"", "plain", "order-17-paid", `quo"te`, `back\slash`, "tab\there", "nl\nand\rcr", "\b\f", "\x00\x01\x1f\x7f",
	"<html>&amp;</html>", "héllo wörld", "日本語", "emoji 😀", "\u2028line\u2029para", "bad utf8 \xff\xfe end",
	"truncated \xe2\x82", "\xed\xa0\x80 surrogate", "/slash", "ü\x00ü", string(rune(0xfffd)),
}

func TestAppendClaimedMatchesJSON(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	when := time.Date(2026, 12, 2, 3, 4, 5, 120000000, time.FixedZone("CET", 3600))
	msg := func(m domain.Message) *domain.Message { return &m }
	deliver := func(m *domain.Message, receipt, errorCode string, attempt int, lease time.Time) broker.Delivery {
		return broker.Delivery{Claimed: store.Claimed{Message: m, Attempt: attempt, LeaseExpires: lease, ErrorCode: errorCode}, Receipt: receipt}
	}
	base := domain.Message{ID: 42, VShard: 7, Topic: "orders", Key: "k1", Priority: 3, PayloadJSON: true,
		Payload: []byte(`{"a":1}`), CreatedAt: when}
	with := func(f func(m *domain.Message)) *domain.Message {
		m := base
		f(&m)
		return &m
	}
	cases := map[string][]broker.Delivery{
		"none":      {},
		"load-like": benchDeliveries(100, false),
		"base64":    benchDeliveries(10, true),
		"one":       {deliver(msg(base), "r1", "", 1, when.Add(time.Minute))},
		"extremes": {deliver(with(func(m *domain.Message) {
			m.ID, m.VShard, m.Priority = math.MaxUint64, math.MaxUint16, 9
		}), "r", "", math.MaxInt32, when)},
		"zero times":           {deliver(with(func(m *domain.Message) { m.CreatedAt = time.Time{} }), "r", "", 0, time.Time{})},
		"whole seconds":        {deliver(with(func(m *domain.Message) { m.CreatedAt = when.Truncate(time.Second) }), "r", "", 2, when.Truncate(time.Second))},
		"dead letter":          {deliver(msg(base), "r", "timeout", 5, when), deliver(msg(base), "r", `err "x"<&>`, 5, when)},
		"empty JSON payload":   {deliver(with(func(m *domain.Message) { m.Payload = nil }), "r", "", 1, when)},
		"empty binary payload": {deliver(with(func(m *domain.Message) { m.PayloadJSON, m.Payload = false, nil }), "r", "", 1, when)},
		"binary payload": {deliver(with(func(m *domain.Message) {
			m.PayloadJSON, m.Payload = false, []byte{0, 1, 2, 0xfb, 0xfc, 0xfd, 0xfe, 0xff, '"', '\\', '<'}
		}), "r", "", 1, when)},
		"JSON payload with spaces": {deliver(with(func(m *domain.Message) {
			m.Payload = []byte(" { \"a\" : [ 1 , 2 ],\n\t\"b\":\"x y <&> \u2028\" } ")
		}), "r", "", 1, when)},
		"JSON scalar payloads": {
			deliver(with(func(m *domain.Message) { m.Payload = []byte(`"a\u0041<"`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Payload = []byte(`null`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Payload = []byte(`-1.5e3`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Payload = []byte(`true`) }), "r", "", 1, when),
		},
		"headers": {
			deliver(with(func(m *domain.Message) { m.Headers = []byte(`{}`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Headers = []byte(`null`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) {
				m.Headers = []byte(`{"z":"1","a":"\u003chtml\u003e","m":"tab\tq\"\\","é":"\u2028","":""}`)
			}), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Headers = []byte(`{"a":"1",`) }), "r", "", 1, when),
			deliver(with(func(m *domain.Message) { m.Headers = []byte(`[1]`) }), "r", "", 1, when),
		},
	}
	for i, str := range trickyStrings {
		cases["string "+strconv.Itoa(i)] = []broker.Delivery{deliver(with(func(m *domain.Message) {
			m.Key, m.Topic, m.OrderKey, m.TransactionID = str, str, str, str
			h, _ := json.Marshal(map[string]string{str: str, "k": str})
			m.Headers = h
		}), str, str, 1, when)}
	}
	for name, got := range cases {
		t.Run(name, func(t *testing.T) { checkClaimedMatches(t, s, got) })
	}
}

func TestAppendClaimedRandom(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	rnd := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", `"`, `\`, "\n", "\x00", "\x1f", "\x7f", "<", "&", "é", "😀", "\u2028", "\xff", "\xe2\x80", "/"}
	str := func() string {
		var b []byte
		for range rnd.IntN(12) {
			b = append(b, alphabet[rnd.IntN(len(alphabet))]...)
		}
		return string(b)
	}
	for range 300 {
		got := make([]broker.Delivery, rnd.IntN(5))
		for i := range got {
			m := &domain.Message{ID: rnd.Uint64(), VShard: uint16(rnd.IntN(1024)), Topic: str(), Key: str(), OrderKey: str(),
				TransactionID: str(), Priority: rnd.IntN(10), CreatedAt: time.Unix(0, rnd.Int64N(4e18))}
			if rnd.IntN(2) == 0 {
				m.PayloadJSON = true
				m.Payload, _ = json.Marshal(map[string]any{str(): str(), "n": rnd.Float64(), "l": []string{str()}})
			} else {
				m.Payload = []byte(str())
			}
			if rnd.IntN(2) == 0 {
				m.Headers, _ = json.Marshal(map[string]string{str(): str(), str(): str()})
			}
			var lease time.Time
			if rnd.IntN(4) > 0 {
				lease = time.Unix(0, rnd.Int64N(4e18))
			}
			got[i] = broker.Delivery{Claimed: store.Claimed{Message: m, Attempt: rnd.IntN(6), LeaseExpires: lease, ErrorCode: str()},
				Receipt: str()}
		}
		checkClaimedMatches(t, s, got)
	}
}

// A stored JSON payload that is not JSON fails the encoding as it did
// with encoding/json: the claim is answered with its status alone.
func TestWriteClaimedInvalidPayload(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	got := benchDeliveries(3, false)
	got[1].Message.Payload = []byte(`{"a":`)
	checkClaimedMatches(t, s, got)
	rec := httptest.NewRecorder()
	s.writeClaimed(rec, got)
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Length") != "" {
		t.Fatalf("answered %d %q with Content-Length %q, want 200 with no body", rec.Code, rec.Body, rec.Header().Get("Content-Length"))
	}
}

func TestWriteClaimedContentLength(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	got := benchDeliveries(100, false)
	want, err := encodeClaimedReference(s, got)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.writeClaimed(rec, got)
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want) {
		t.Fatalf("answered %d %q, want 200 %q", rec.Code, rec.Body, want)
	}
	if h := rec.Header(); h.Get("Content-Type") != "application/json" || h.Get("Content-Length") != strconv.Itoa(len(want)) {
		t.Fatalf("headers %v, want application/json of %d bytes", h, len(want))
	}
}

// FuzzAppendClaimed holds appendClaimed to encoding/json's bytes for
// arbitrary strings, payloads and stored headers.
func FuzzAppendClaimed(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s, []byte(`{"k":"`+s+`"}`), true, []byte(`{"h":"v"}`), s)
	}
	f.Add("k", []byte("\x00\xff"), false, []byte(nil), "")
	f.Add("k", []byte(` [1, "<\u2028>" ]`), true, []byte(`{"a":"\u003c"}`), "")
	f.Add("k", []byte(`{`), true, []byte(`{`), "")
	s := New(nil, Limits{}, nil, nil)
	f.Fuzz(func(t *testing.T, str string, payload []byte, isJSON bool, headers []byte, errorCode string) {
		m := &domain.Message{ID: 1, Topic: str, Key: str, OrderKey: str, TransactionID: str, PayloadJSON: isJSON, Payload: payload,
			Headers: headers, CreatedAt: time.Unix(1700000000, 5)}
		checkClaimedMatches(t, s, []broker.Delivery{{Claimed: store.Claimed{Message: m, Attempt: 1, ErrorCode: errorCode}, Receipt: str}})
	})
}

// compactByJSON is what encoding/json makes of p as a json.RawMessage.
func compactByJSON(p []byte) ([]byte, bool) {
	var b bytes.Buffer
	if err := json.Compact(&b, p); err != nil {
		return nil, false
	}
	return b.Bytes(), true
}

func TestIsCompactJSON(t *testing.T) {
	t.Parallel()
	compact := []string{
		`{}`, `[]`, `""`, `0`, `-0`, `1.5`, `-12e+3`, `1E-7`, `0.0e0`, `true`, `false`, `null`,
		`{"k":"run-1.k7-paid","p":"abcdefghijklmnopqrstuvwxyz0123456789"}`, `[1,"a",{"b":[null,true]},[]]`,
		`"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00"`, `"raw é 😀 \u2028 <&>"`, "\"\xff bad utf8\"", `{"":{"":""}}`,
		strings.Repeat("[", maxCheckedDepth) + strings.Repeat("]", maxCheckedDepth),
	}
	for _, p := range compact {
		if !isCompactJSON([]byte(p)) {
			t.Errorf("isCompactJSON(%q) = false, want true", p)
		}
		if out, ok := compactByJSON([]byte(p)); !ok || string(out) != p {
			t.Errorf("the table is wrong: json.Compact(%q) = %q, %v", p, out, ok)
		}
	}
	notCompact := []string{
		``, ` `, ` 1`, `1 `, `{ }`, `[1, 2]`, `{"a" :1}`, "{\"a\":\n1}", // JSON, but not compact
		strings.Repeat("[", maxCheckedDepth+1) + strings.Repeat("]", maxCheckedDepth+1), // left to json.Compact
		`{`, `[`, `}`, `]`, `[1,]`, `{"a":1,}`, `{"a"}`, `{a:1}`, `{"a":1"b":2}`, `[1 2]`, `01`, `-`, `1.`, `.5`, `1e`, `1e+`,
		`+1`, `0x1`, `NaN`, `tru`, `nul`, `truex`, `"abc`, "\"a\x01\"", `"\x"`, `"\u12"`, `"\u12g4"`, `'a'`, `1 1`, `""""`,
	}
	for _, p := range notCompact {
		if isCompactJSON([]byte(p)) {
			t.Errorf("isCompactJSON(%q) = true, want false", p)
		}
	}
}

// FuzzIsCompactJSON holds isCompactJSON to encoding/json: what it accepts
// is JSON that json.Compact leaves as it is.
func FuzzIsCompactJSON(f *testing.F) {
	for _, s := range []string{`{"k":"v","n":[1,-2.5e3,true,null]}`, `[ 1 ]`, `"\u00e9"`, `{"a":{"b":[]}}`, `01`, `1e5`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if !isCompactJSON(p) {
			return
		}
		if out, ok := compactByJSON(p); !ok || !bytes.Equal(out, p) {
			t.Fatalf("isCompactJSON(%q) = true, but json.Compact gives %q, %v", p, out, ok)
		}
	})
}

func TestAppendLeaseResultsMatchesJSON(t *testing.T) {
	t.Parallel()
	cases := [][]leaseResult{
		{},
		{{Receipt: "v1.abc", Status: domain.LeaseOK}},
		{{Receipt: "v1.abc", Status: domain.LeaseOK, Expires: "2026-12-02T03:04:05.12Z"}, {Receipt: "", Status: domain.LeaseLost},
			{Receipt: "r", Status: domain.LeaseNotFound}},
		{{Receipt: "r", Status: domain.LeaseUnavailable, Error: fail(CodeUnavailable, `cluster c1: dial "tcp" <10.0.0.1> & more`)},
			{Receipt: "r2", Status: domain.LeaseUnavailable, Error: fail(CodeUnavailable, "")}},
	}
	for _, str := range trickyStrings {
		cases = append(cases, []leaseResult{{Receipt: str, Status: domain.LeaseStatus(str), Expires: str, Error: fail(str, str)}})
	}
	for _, out := range cases {
		want, err := encodeReference(map[string]any{"results": out})
		if err != nil {
			t.Fatal(err)
		}
		if have := appendLeaseResults(nil, out); !bytes.Equal(have, want) {
			t.Errorf("appendLeaseResults differs from encoding/json:\nhave %q\nwant %q", have, want)
		}
	}
}

func TestAppendProduceResultsMatchesJSON(t *testing.T) {
	t.Parallel()
	cases := [][]produceResult{
		{},
		{{Key: "order-1", ID: "123456789012345678", VShard: 0, Status: domain.ProduceCreated}},
		{{Key: "fp-00ff", ID: "9", VShard: 1023, Status: domain.ProduceDuplicate}, {Key: "", Status: domain.ProduceConflict, ID: "1"},
			{Key: "k", VShard: 5, Status: domain.ProduceUnavailable, Error: fail(CodeUnavailable, `cluster c1: dial "tcp" <10.0.0.1> & more`)},
			{Key: "k2", VShard: 6, Status: domain.ProduceUnknown, Error: fail(CodeOutcomeUnknown, "")}},
	}
	for _, str := range trickyStrings {
		cases = append(cases, []produceResult{{Key: str, ID: str, VShard: 7, Status: domain.ProduceStatus(str), Error: fail(str, str)}})
	}
	for _, out := range cases {
		want, err := encodeReference(map[string]any{"results": out})
		if err != nil {
			t.Fatal(err)
		}
		if have := appendProduceResults(nil, out); !bytes.Equal(have, want) {
			t.Errorf("appendProduceResults differs from encoding/json:\nhave %q\nwant %q", have, want)
		}
	}
}

// checkPlainReceiptList holds plainReceiptList to decodeStrict: what it
// reads, decodeStrict reads the same. It reports whether body was read.
func checkPlainReceiptList(t *testing.T, body []byte) bool {
	t.Helper()
	list, ok := plainReceiptList(body)
	if !ok {
		return false
	}
	var want ackRequest
	if e := decodeStrict(body, &want); e != nil {
		t.Fatalf("plainReceiptList(%q) = %q, but decodeStrict refuses it: %v", body, list, e)
	}
	if !slices.Equal(list, want.Receipts) || len(list) == 0 {
		t.Fatalf("plainReceiptList(%q) = %q, decodeStrict reads %q", body, list, want.Receipts)
	}
	return true
}

func TestPlainReceiptList(t *testing.T) {
	t.Parallel()
	sent, err := json.Marshal(ackRequest{Receipts: []string{"v1.AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDE", "b", ""}})
	if err != nil {
		t.Fatal(err)
	}
	read := []string{string(sent), `{"receipts":["a"]}`, " {\n\t\"receipts\" : [ \"a\" ,\r\"b c\" ] } \n", `{"receipts":["~!@#$%^&*()_+{}[]:;'<>,./?"]}`}
	for _, body := range read {
		if !checkPlainReceiptList(t, []byte(body)) {
			t.Errorf("plainReceiptList(%q) left it to decodeStrict, want it read", body)
		}
	}
	left := []string{``, `{}`, `{"receipts":[]}`, `{"receipts":null}`, `{"receipts":"a"}`, `{"Receipts":["a"]}`, `{"receipts":["a"],"x":1}`,
		`{"receipts":["a"]}{}`, `{"receipts":["a",]}`, `{"receipts":["a""b"]}`, `{"receipts":["a\"b"]}`, `{"receipts":["a\u0062"]}`,
		`{"receipts":["é"]}`, "{\"receipts\":[\"a\tb\"]}", `{"receipts":["a"]`, `{"receipts":["a`, `{"receipts":[1]}`, "\ufeff{\"receipts\":[\"a\"]}",
		`{"receipts":["a"],"receipts":["b"]}`}
	for _, body := range left {
		if checkPlainReceiptList(t, []byte(body)) {
			t.Errorf("plainReceiptList(%q) read it, want it left to decodeStrict", body)
		}
	}
}

// FuzzPlainReceiptList holds the ack body's fast path to decodeStrict.
func FuzzPlainReceiptList(f *testing.F) {
	for _, s := range []string{`{"receipts":["a","b"]}`, ` { "receipts" : [ "a" ] } `, `{"receipts":["a\"b"]}`, `{"receipts":[]}`, `{"receipts":["a"],"x":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkPlainReceiptList(t, body) })
}
