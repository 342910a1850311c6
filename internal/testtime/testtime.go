// Package testtime gives tests their time budgets from the test's own
// deadline (go test -timeout, t.Deadline()) instead of a fixed few
// seconds. A fixed budget that is ample on an idle laptop fails on a CI
// machine of 2 cores that also runs a test restarting MariaDB beside it;
// the test binary's deadline is the one limit the person running the
// tests chose. Waiting for something that must happen is bounded by it;
// a test that asserts how fast something happens measures the time and
// compares it with a generous bound of its own.
//
// Until (and Within, for a wait with a bound of its own) is the one way a
// test waits for a condition: no test writes its own polling loop.
package testtime

import (
	"context"
	"testing"
	"time"
)

// noDeadline is the budget of a test run without a deadline (-timeout 0).
const noDeadline = 10 * time.Minute

// Budget is how long t may still wait: the time left until its deadline,
// less a tenth of it (at least a second, at most 30 s) kept to report
// the failure and clean up; without a deadline, 10 minutes.
func Budget(t *testing.T) time.Duration {
	d, ok := t.Deadline()
	if !ok {
		return noDeadline
	}
	left := time.Until(d)
	margin := min(max(left/10, time.Second), 30*time.Second)
	return max(left-margin, 0)
}

// Context is a context of t (t.Context()) that also ends when t's Budget
// runs out.
func Context(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), Budget(t))
	t.Cleanup(cancel)
	return ctx
}

// every is how often Until asks: often enough that a test waits little
// past the moment the condition holds, rarely enough to leave the
// machine to what the test waits for.
const every = 10 * time.Millisecond

// Until waits until cond holds, asking every 10 ms, and fails t (naming
// what; the failure points at the caller's line) when Budget runs out
// first. cond runs on the caller's goroutine.
func Until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	UntilState(t, what, func() (bool, string) { return cond(), "" })
}

// UntilState is Until with a condition that also describes what it saw,
// for the failure message.
func UntilState(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	poll(t, Budget(t), "the test's budget", what, cond)
}

// Within is Until bounded by d as well: for a wait whose bound is part of
// what the test asserts ("a token put into Consul is accepted within
// 10 s"), or one that must give up well before the test's deadline. It
// fails t when cond has not held after d, or after Budget when that is
// shorter.
func Within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	WithinState(t, d, what, func() (bool, string) { return cond(), "" })
}

// WithinState is Within with a condition that also describes what it
// saw, for the failure message.
func WithinState(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if b := Budget(t); b < d {
		poll(t, b, "the test's budget", what, cond)
		return
	}
	poll(t, d, "", what, cond)
}

// poll asks cond every 10 ms until it holds, and fails t when limit has
// passed first; bound names the limit in the failure message.
func poll(t *testing.T, limit time.Duration, bound, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	if bound != "" {
		bound = ", " + bound
	}
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("%s: not within %v%s (last seen: %s)", what, limit.Round(time.Millisecond), bound, state)
			}
			t.Fatalf("%s: not within %v%s", what, limit.Round(time.Millisecond), bound)
		}
		time.Sleep(every)
	}
}
