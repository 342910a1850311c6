package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/api/apitest"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
)

// Every request of the refusal table, sent to a real router over real
// MariaDB, answers its 4xx in the JSON error shape, and afterwards no
// cluster holds a row in any table a request could write. One valid produce
// at the end shows that the counts do see a write.
func TestBadRequestsWriteNothing(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	r := broker.Receipt{VShard: 7, Topic: "orders"}
	r.MessageID, r.Token, r.Subscription = 42, 9, "default"
	rows := apitest.BadRequests(r.Encode())
	for _, tc := range rows {
		req, err := http.NewRequest(tc.Method, e.url+tc.Target, strings.NewReader(tc.Body))
		if err != nil {
			t.Fatalf("%s: %v", tc.Name, err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.Name, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Error struct{ Code, Message string }
		}
		if err := json.Unmarshal(data, &out); err != nil {
			t.Errorf("%s: answer %d %q is not JSON", tc.Name, resp.StatusCode, data)
			continue
		}
		if resp.StatusCode != tc.Status || out.Error.Code != tc.Code || !strings.Contains(out.Error.Message, tc.Says) {
			t.Errorf("%s: %d %s %q, want %d %s containing %q", tc.Name, resp.StatusCode, out.Error.Code, out.Error.Message, tc.Status, tc.Code, tc.Says)
		}
	}
	tables := []string{"message_key", "message_store", "message_queue", "message_trace", "subscription", "dead_letter_archive"}
	for _, table := range tables {
		if n := total(e.count(t, "SELECT COUNT(*) FROM "+table)); n != 0 {
			t.Errorf("after %d refused requests %s holds %d rows, want 0", len(rows), table, n)
		}
	}
	st, _, body := e.post(t, "/v1/topics/orders/messages", `{"messages":[{"key":"control","payload":{"a":1},"headers":`+apitest.HeadersOf(65535)+`}]}`)
	if st != http.StatusOK || results(t, body)[0]["status"] != "created" {
		t.Fatalf("control produce: %d %v", st, body)
	}
	if n := total(e.count(t, "SELECT COUNT(*) FROM message_store")); n != 1 {
		t.Fatalf("after the control produce message_store holds %d rows, want 1", n)
	}
}
