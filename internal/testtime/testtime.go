// Package testtime gives tests their time budgets from the test's own
// deadline (go test -timeout, t.Deadline()) instead of a fixed few
// seconds. A fixed budget that is ample on an idle laptop fails on a CI
// machine of 2 cores that also runs a test restarting MariaDB beside it;
// the test binary's deadline is the one limit the person running the
// tests chose. Waiting for something that must happen is bounded by it;
// a test that asserts how fast something happens measures the time and
// compares it with a generous bound of its own.
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
	budget := Budget(t)
	deadline := time.Now().Add(budget)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("%s: not within %v, the test's budget (last seen: %s)", what, budget.Round(time.Second), state)
			}
			t.Fatalf("%s: not within %v, the test's budget", what, budget.Round(time.Second))
		}
		time.Sleep(every)
	}
}
