package subscription

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRefreshFailuresAreLoggedOncePerMinute(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var q quietLog
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fail := errors.New("consul down")
	for i := 0; i < 125; i++ { // a refresh a second for 125 s
		q.report(log, start.Add(time.Duration(i)*time.Second), fail, "subscriptions not refreshed")
	}
	if n := strings.Count(buf.String(), "subscriptions not refreshed"); n != 3 {
		t.Fatalf("%d warnings for 125 failed refreshes over 125s, want 3 (at 0s, 60s, 120s):\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "failures_since_last_log=59") {
		t.Fatalf("the minute's count is missing:\n%s", buf.String())
	}
	q.report(log, start.Add(126*time.Second), nil, "subscriptions not refreshed")
	q.report(log, start.Add(127*time.Second), nil, "subscriptions not refreshed")
	if n := strings.Count(buf.String(), "subscriptions not refreshed: over"); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, buf.String())
	}
}
