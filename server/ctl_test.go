package server

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
)

// The operator CLI against a real router: every command reaches its
// endpoint and prints the answer; errors exit non-zero.
func TestOperatorCLI(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setup(t)
	_, _, out := e.post(t, "/v1/topics/cli/messages", map[string]any{"messages": []any{
		map[string]any{"key": "c-1", "payload": 1, "transaction_id": "tx-cli"}}})
	if r := results(t, out)[0]; r["status"] != "created" {
		t.Fatalf("produce: %v", r)
	}
	run := func(args ...string) (int, map[string]any, string) {
		var stdout, stderr bytes.Buffer
		code := ctl.Run(append([]string{"-json"}, args...), e.url, &stdout, &stderr, testClient)
		var body map[string]any
		json.Unmarshal(stdout.Bytes(), &body)
		return code, body, stderr.String()
	}
	if code, body, _ := run("shardmap"); code != 0 || body["version"].(float64) != 1 {
		t.Fatalf("shardmap: %d %v", code, body)
	}
	if code, body, _ := run("trace", "c-1", "-topic", "cli"); code != 0 || body["message"] == nil {
		t.Fatalf("trace: %d %v", code, body)
	}
	if code, body, _ := run("tx", "tx-cli"); code != 0 || len(body["messages"].([]any)) != 1 {
		t.Fatalf("tx: %d %v", code, body)
	}
	if code, body, _ := run("sub", "put", "cli", "audit", "-config", `{"max_attempts":2}`); code != 0 || body["max_attempts"].(float64) != 2 {
		t.Fatalf("sub put: %d %v", code, body)
	}
	if code, body, _ := run("dlq", "list", "cli", "default", "-error-code", "E"); code != 0 || body["dead_letters"] == nil {
		t.Fatalf("dlq list: %d %v", code, body)
	}
	if code, body, _ := run("reconcile", "-tx", "tx-cli,tx-none"); code != 0 || !strings.Contains(mustJSON(body), "tx-none") {
		t.Fatalf("reconcile -tx: %d %v", code, body)
	}
	if code, _, stderr := run("sub", "get", "cli", "nope"); code != 1 || !strings.Contains(stderr, "unknown_subscription") {
		t.Fatalf("sub get of a missing subscription: %d %s", code, stderr)
	}
	if code, _, _ := run("dlq", "redrive", "cli", "default"); code != 2 {
		t.Fatalf("dlq redrive without a selector exited %d, want 2", code)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
