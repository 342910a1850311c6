package testtime

import (
	"testing"
	"time"
)

// Budget leaves a margin before the deadline and is never negative.
func TestBudgetIsBelowTheDeadline(t *testing.T) {
	t.Parallel()
	b := Budget(t)
	if d, ok := t.Deadline(); ok {
		if left := time.Until(d); b >= left || b < 0 {
			t.Fatalf("budget %v with %v left", b, left)
		}
	} else if b != noDeadline {
		t.Fatalf("budget %v without a deadline, want %v", b, noDeadline)
	}
	if ctx := Context(t); ctx.Err() != nil {
		t.Fatalf("context ended at once: %v", ctx.Err())
	}
}

// Until returns as soon as the condition holds, asking until then.
func TestUntilAsksUntilTheConditionHolds(t *testing.T) {
	t.Parallel()
	asked := 0
	Until(t, "the third question", func() bool { asked++; return asked == 3 })
	if asked != 3 {
		t.Fatalf("asked %d times, want 3", asked)
	}
}

// Within returns as soon as the condition holds, well inside its bound.
func TestWithinAsksUntilTheConditionHolds(t *testing.T) {
	t.Parallel()
	asked := 0
	start := time.Now()
	Within(t, time.Minute, "the third question", func() bool { asked++; return asked == 3 })
	if asked != 3 {
		t.Fatalf("asked %d times, want 3", asked)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v", d)
	}
}
