package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"github.com/shardmq/shardmq/internal/testbed"
	"io"
	"net/http"
	"strings"
	"testing"
)

// getRaw makes one GET and returns its status, body bytes and decoded body.
func (e *env) getRaw(t *testing.T, path string) (int, []byte, map[string]any) {
	t.Helper()
	resp, err := testClient.Get(e.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("GET %s: status %d, body %.200q is not JSON", path, resp.StatusCode, data)
	}
	return resp.StatusCode, data, out
}

// A dead-letter listing is capped in bytes as a claim is: binary dead
// letters of 200 KiB (base64 in the answer) page by max_bytes with a
// cursor, every answer within its cap, every dead letter listed once.
func TestDeadLetterListIsCappedInBytes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	const capBytes = 1 << 20
	e := setupOn(t, bed, func(c *Config) { c.Limits.MaxClaimBytes = capBytes })
	e.do(t, "PUT", "/v1/topics/dlbytes/subscriptions/s", map[string]any{"max_attempts": 1})
	const n, size = 12, 200 << 10
	var batch []any
	for i := 0; i < n; i++ {
		p := bytes.Repeat([]byte{byte(i), 0xff}, size/2)
		batch = append(batch, map[string]any{"key": fmt.Sprint("big-", i), "payload_base64": base64.StdEncoding.EncodeToString(p)})
	}
	if st, _, body := e.post(t, "/v1/topics/dlbytes/messages", map[string]any{"messages": batch}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	for dead := 0; dead < n; {
		got := e.claim(t, "dlbytes", "s", map[string]any{"max": n, "wait_ms": 2000})
		if len(got) == 0 {
			t.Fatalf("%d of %d dead, then nothing to claim", dead, n)
		}
		var items []any
		for _, m := range got {
			items = append(items, map[string]any{"receipt": m["receipt"], "error_code": "E_BIG"})
		}
		e.post(t, "/v1/nack", map[string]any{"items": items})
		dead += len(got)
	}
	base := "/v1/topics/dlbytes/subscriptions/s/dead-letters?limit=1000"
	for _, c := range []struct {
		query string
		cap   int
	}{{"", capBytes}, {"&max_bytes=500000", 500000}, {"&max_bytes=1", 1}} {
		seen := map[string]bool{}
		cursor, pages := "", 0
		for {
			st, raw, body := e.getRaw(t, base+c.query+"&cursor="+cursor)
			if st != 200 {
				t.Fatalf("%s: %d %v", c.query, st, body)
			}
			page := body["dead_letters"].([]any)
			if len(page) == 0 {
				t.Fatalf("%s: an empty page with cursor %q", c.query, cursor)
			}
			if len(raw) > c.cap && len(page) > 1 {
				t.Fatalf("%s: an answer of %d bytes and %d dead letters, over the cap of %d", c.query, len(raw), len(page), c.cap)
			}
			for _, d := range page {
				id := d.(map[string]any)["id"].(string)
				if seen[id] {
					t.Fatalf("%s: dead letter %s listed twice", c.query, id)
				}
				seen[id] = true
				if d.(map[string]any)["payload_base64"] == nil {
					t.Fatalf("%s: dead letter %s without its payload", c.query, id)
				}
			}
			pages++
			cursor = body["next_cursor"].(string)
			if cursor == "" {
				break
			}
		}
		if len(seen) != n {
			t.Fatalf("%s: %d dead letters listed over %d pages, want %d", c.query, len(seen), pages, n)
		}
		if pages < 2 {
			t.Fatalf("%s: %d dead letters of %d bytes in one page", c.query, n, size)
		}
	}
	// The dead-letter channel's claim counts encoded bytes too.
	raw := e.postRaw(t, "/v1/topics/dlbytes/subscriptions/s/dead-letters/claim", `{"max":12,"max_bytes":700000}`)
	if n := strings.Count(raw, `"receipt"`); n < 2 || len(raw) > 700000 {
		t.Fatalf("dead-letter claim under max_bytes 700000: %d messages in %d bytes", n, len(raw))
	}
	if st, _, body := e.getRaw(t, base+"&max_bytes=0"); st != 400 {
		t.Fatalf("max_bytes=0: %d %v, want 400", st, body)
	}
	if st, _, body := e.getRaw(t, base+fmt.Sprintf("&max_bytes=%d", capBytes+1)); st != 400 {
		t.Fatalf("max_bytes over the router's cap: %d %v, want 400", st, body)
	}
}

// A transaction of 250 messages is reachable whole: a page says
// complete false with a cursor until the last, which says complete true;
// pages are capped in count and in bytes.
func TestTransactionLookupPages(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	const n = 250
	var batch []any
	for i := 0; i < n; i++ {
		batch = append(batch, map[string]any{"key": fmt.Sprint("tx-msg-", i), "payload": map[string]any{"i": i, "pad": strings.Repeat("x", 1000)},
			"transaction_id": "tx-big"})
	}
	if st, _, body := e.post(t, "/v1/topics/txpages/messages", map[string]any{"messages": batch}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	for _, c := range []struct {
		query    string
		maxPage  int
		maxBytes int
	}{{"", 100, 0}, {"limit=1000", 1000, 0}, {"max_bytes=20000", 1000, 20000}} {
		seen := map[string]bool{}
		cursor, pages := "", 0
		var last float64 = -1
		for {
			path := "/v1/transactions/tx-big?" + c.query
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			st, raw, body := e.getRaw(t, path)
			if st != http.StatusOK {
				t.Fatalf("%s: %d %v", c.query, st, body)
			}
			msgs := body["messages"].([]any)
			if len(msgs) == 0 || len(msgs) > c.maxPage {
				t.Fatalf("%s: a page of %d messages", c.query, len(msgs))
			}
			if c.maxBytes > 0 && len(raw) > c.maxBytes && len(msgs) > 1 {
				t.Fatalf("%s: an answer of %d bytes", c.query, len(raw))
			}
			for _, m := range msgs {
				m := m.(map[string]any)
				id := m["id"].(string)
				if seen[id] {
					t.Fatalf("%s: message %s answered twice", c.query, id)
				}
				seen[id] = true
				i := m["payload"].(map[string]any)["i"].(float64)
				if i <= last {
					t.Fatalf("%s: message %v after %v: not in produce order", c.query, i, last)
				}
				last = i
			}
			pages++
			cursor = body["next_cursor"].(string)
			if complete := body["complete"].(bool); complete != (cursor == "") {
				t.Fatalf("%s: complete %v with next_cursor %q", c.query, complete, cursor)
			}
			if cursor == "" {
				break
			}
		}
		if len(seen) != n {
			t.Fatalf("%s: %d messages over %d pages, want %d", c.query, len(seen), pages, n)
		}
		if c.query == "" && pages != 3 {
			t.Fatalf("default pages: %d, want 3 of at most 100", pages)
		}
	}
	if st, _, body := e.getRaw(t, "/v1/transactions/tx-big?cursor=abc"); st != 400 {
		t.Fatalf("a bad cursor: %d %v, want 400", st, body)
	}
}

// postRaw POSTs body and returns the answer's bytes (status 200 expected).
func (e *env) postRaw(t *testing.T, path, body string) string {
	t.Helper()
	resp, err := testClient.Post(e.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %.300s", path, resp.StatusCode, data)
	}
	return string(data)
}

// A claim's max_bytes counts the answer's bytes as encoded: binary
// payloads a third larger in base64. (Counting stored bytes let a claim
// answer 9.8 MB under a cap of 8 MiB.)
func TestClaimMaxBytesCountsEncodedBytes(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	const n, size, cap = 8, 150 << 10, 500000
	var batch []any
	for i := 0; i < n; i++ {
		batch = append(batch, map[string]any{"key": fmt.Sprint("bin-", i), "payload_base64": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfe, byte(i)}, size/2))})
	}
	if st, _, body := e.post(t, "/v1/topics/binclaim/messages", map[string]any{"messages": batch}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	got := 0
	for got < n {
		raw := e.postRaw(t, "/v1/topics/binclaim/subscriptions/default/claim", fmt.Sprintf(`{"max":%d,"max_bytes":%d,"wait_ms":1000}`, n, cap))
		k := strings.Count(raw, `"receipt"`)
		if k == 0 {
			t.Fatalf("%d of %d claimed, then none", got, n)
		}
		if k > 1 && len(raw) > cap {
			t.Fatalf("a claim of %d binary messages answered %d bytes under max_bytes %d", k, len(raw), cap)
		}
		got += k
	}
}
