package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/testbed"
)

// A receipt cannot be altered into one the caller's token accepts: a
// consumer of "orders" only, given a receipt of topic "other" whose topic
// bytes were rewritten to "orders", is refused (400 invalid_receipt) on
// ack, nack and extend, at the API and as a forwarded request; the other
// topic's message stays leased and its real receipt acks it. Unaltered
// receipts ack as before.
func TestAlteredReceiptIsRefused(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupSecure(t, map[string]map[auth.Scope][]string{
		"producer": {auth.Produce: {"*"}},
		"other":    {auth.Consume: {"other"}},
		"orders":   {auth.Consume: {"orders"}},
	}, nil, nil)
	for _, topic := range []string{"other", "orders"} {
		a := e.send(t, e.secrets["producer"], "POST", "/v1/topics/"+topic+"/messages", `{"messages":[{"key":"k-`+topic+`","payload":1}]}`, nil)
		if a.status != 200 {
			t.Fatalf("produce to %s: %d %s", topic, a.status, a.raw)
		}
	}
	claim := func(token, topic string) string {
		t.Helper()
		a := e.send(t, e.secrets[token], "POST", "/v1/topics/"+topic+"/subscriptions/default/claim", `{"max":1,"wait_ms":2000}`, nil)
		msgs, _ := a.body["messages"].([]any)
		if a.status != 200 || len(msgs) != 1 {
			t.Fatalf("claim on %s: %d %s", topic, a.status, a.raw)
		}
		return msgs[0].(map[string]any)["receipt"].(string)
	}
	real := claim("other", "other")
	raw, err := base64.RawURLEncoding.DecodeString(real)
	if err != nil {
		t.Fatal(err)
	}
	// version, flags, vshard, id, token, epoch, then the topic's length
	// and bytes: rewrite "other" to "orders".
	i := bytes.Index(raw, []byte("\x05other"))
	if i < 0 {
		t.Fatalf("no topic in receipt %x", raw)
	}
	forged := append(append(bytes.Clone(raw[:i]), "\x06orders"...), raw[i+6:]...)
	fake := base64.RawURLEncoding.EncodeToString(forged)
	body := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	for _, c := range []struct{ path, body string }{
		{"/v1/ack", body(map[string]any{"receipts": []string{fake}})},
		{"/v1/extend", body(map[string]any{"receipts": []string{fake}, "visibility_timeout_ms": 60000})},
		{"/v1/nack", body(map[string]any{"items": []any{map[string]any{"receipt": fake, "error_code": "E"}}})},
	} {
		for _, fwd := range []bool{false, true} {
			var hdr map[string]string
			if fwd {
				hdr = map[string]string{"X-Shardmq-Forwarded": "1"}
			}
			a := e.send(t, e.secrets["orders"], "POST", c.path, c.body, hdr)
			if a.status != http.StatusBadRequest || a.code() != "invalid_receipt" {
				t.Fatalf("%s of a receipt altered to topic orders (forwarded %v): %d %s, want 400 invalid_receipt", c.path, fwd, a.status, a.raw)
			}
		}
	}
	// Nothing happened to other's message: still leased, and its real
	// receipt acks it.
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_queue WHERE topic = 'other'")); n != 1 {
		t.Fatalf("other's delivery: %d rows, want 1 (not acked)", n)
	}
	for _, c := range []struct{ token, receipt string }{{"other", real}, {"orders", claim("orders", "orders")}} {
		a := e.send(t, e.secrets[c.token], "POST", "/v1/ack", body(map[string]any{"receipts": []string{c.receipt}}), nil)
		res, _ := a.body["results"].([]any)
		if a.status != 200 || len(res) != 1 || res[0].(map[string]any)["status"] != "ok" {
			t.Fatalf("ack of a real receipt as %s: %d %s", c.token, a.status, a.raw)
		}
	}
	// The real receipt under the wrong token is refused by its topic.
	if a := e.send(t, e.secrets["orders"], "POST", "/v1/ack", body(map[string]any{"receipts": []string{real}}), nil); a.status != http.StatusForbidden {
		t.Fatalf("ack of other's receipt as orders: %d %s, want 403", a.status, a.raw)
	}
}
