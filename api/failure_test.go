package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/circuit"
	"github.com/shardmq/shardmq/domain"
)

// A request that fails as a whole answers 503 unavailable (retry later)
// only for an outage; anything else is a bug, answered 500 internal with
// the request id and never the detail.
func TestFailureIsUnavailableOnlyForOutages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"cluster down", fmt.Errorf("claim: %w: dial tcp 10.0.0.7:3306: refused", domain.ErrUnavailable), http.StatusServiceUnavailable, CodeUnavailable},
		{"breaker open", fmt.Errorf("claim: %w", circuit.ErrOpen), http.StatusServiceUnavailable, CodeUnavailable},
		{"too slow", fmt.Errorf("claim: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, CodeUnavailable},
		{"a bug", errors.New("scan message_store: sql: Scan error on column index 3"), http.StatusInternalServerError, CodeInternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, b := newTestServer(t)
			b.claimErr = tc.err
			rec := do(s, "POST", "/v1/topics/orders/subscriptions/default/claim", []byte(`{"max":1}`))
			var out struct {
				Error apiError `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
			}
			if rec.Code != tc.status || out.Error.Code != tc.code {
				t.Fatalf("answered %d %q, want %d %q", rec.Code, out.Error.Code, tc.status, tc.code)
			}
			if strings.Contains(out.Error.Message, "10.0.0.7") || strings.Contains(out.Error.Message, "message_store") {
				t.Fatalf("the detail leaked: %q", out.Error.Message)
			}
			if (rec.Header().Get("Retry-After") != "") != (tc.status == http.StatusServiceUnavailable) {
				t.Fatalf("Retry-After %q on a %d", rec.Header().Get("Retry-After"), rec.Code)
			}
		})
	}
}
