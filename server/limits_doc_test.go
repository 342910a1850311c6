package server

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/subscription"
)

// The README's limits and flags name the defaults the code has: each row
// below is looked for, built from the code's own defaults.
func TestREADMEResourceLimitsMatchTheCode(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	h, err := (HTTPConfig{}).withDefaults(api.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	l := api.Limits{}.WithDefaults()
	s := subscription.Limits{}.WithDefaults()
	secs := func(d time.Duration) string { return fmt.Sprintf("%ds", int(d.Seconds())) }
	thousands := func(n int) string {
		if n < 1000 {
			return fmt.Sprint(n)
		}
		return fmt.Sprintf("%d,%03d", n/1000, n%1000)
	}
	want := []string{
		fmt.Sprintf("| `-max-conns` | %d |", h.MaxConns),
		fmt.Sprintf("| `-max-in-flight` | %d (three quarters of `-max-conns`) |", mustInFlight(t, h.MaxConns)),
		fmt.Sprintf("| open client connections | %s ", thousands(h.MaxConns)),
		fmt.Sprintf("| `-http-read-timeout`, `-http-write-timeout`, `-http-idle-timeout` | %s, %s, %s |", secs(h.ReadTimeout), secs(h.WriteTimeout), secs(h.IdleTimeout)),
		fmt.Sprintf("| `-shutdown-timeout` | %s |", secs(h.ShutdownTimeout)),
		fmt.Sprintf("| `-claim-max-bytes` | %d MiB |", l.MaxClaimBytes>>20),
		fmt.Sprintf("1–%d MiB, default %d MiB (`-claim-max-bytes`)", l.MaxClaimBytes>>20, l.MaxClaimBytes>>20),
		fmt.Sprintf("| `-max-topics`, `-max-subscriptions-per-topic` | %d, %d |", s.MaxTopics, s.MaxPerTopic),
		fmt.Sprintf("| subscriptions per topic | %d ", s.MaxPerTopic),
		fmt.Sprintf("| topics (with a stored subscription) | %s ", thousands(s.MaxTopics)),
		fmt.Sprintf("| `-max-topics-per-token` | %d |", s.MaxTopicsPerCreator),
		fmt.Sprintf("| topics one token creates | %s ", thousands(s.MaxTopicsPerCreator)),
		fmt.Sprintf("| reading a request (headers / whole request) | %d s / %d s", int(h.ReadHeaderTimeout.Seconds()), int(h.ReadTimeout.Seconds())),
		fmt.Sprintf("| answering a request | %d s ", int(h.WriteTimeout.Seconds())),
		fmt.Sprintf("| idle keep-alive connection | closed after %d s ", int(h.IdleTimeout.Seconds())),
	}
	for _, w := range want {
		if !strings.Contains(readme, w) {
			t.Errorf("README.md lacks %q", w)
		}
	}
}

func mustInFlight(t *testing.T, conns int) int {
	t.Helper()
	n, err := inFlightCap(0, conns)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
