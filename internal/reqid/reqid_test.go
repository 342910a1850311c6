package reqid

import (
	"context"
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		id string
		ok bool
	}{
		{"abc-123", true},
		{"7f3a.b_c:d", true},
		{strings.Repeat("a", MaxLen), true},
		{strings.Repeat("a", MaxLen+1), false},
		{"", false},
		{"has space", false},
		{"new\nline", false},
		{"ünïcode", false},
		{"quote\"", false},
	} {
		if got := Valid(c.id); got != c.ok {
			t.Errorf("Valid(%q) = %v, want %v", c.id, got, c.ok)
		}
	}
}

func TestNewAndContext(t *testing.T) {
	t.Parallel()
	a, b := New(), New()
	if len(a) != 16 || !Valid(a) || a == b {
		t.Fatalf("New() gave %q and %q", a, b)
	}
	ctx := With(context.Background(), a)
	if From(ctx) != a || From(context.Background()) != "" {
		t.Fatalf("From does not return what With stored")
	}
}
