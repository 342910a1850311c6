package jsonscan

import "testing"

// Each step answers the index past what it read, or false, for valid and
// invalid JSON alike (encoding/json's grammar).
func TestSteps(t *testing.T) {
	type step func(p []byte, i int) (int, bool)
	literal := func(lit string) step { return func(p []byte, i int) (int, bool) { return SkipLiteral(p, i, lit) } }
	plain := func(p []byte, i int) (int, bool) { _, next, ok := PlainString(p, i); return next, ok }
	for _, tc := range []struct {
		name string
		step step
		in   string
		next int
		ok   bool
	}{
		{"string", SkipString, `"a\"b\u00e9"x`, 12, true},
		{"string, bytes past 0x7f", SkipString, "\"\xff\"", 3, true},
		{"string, bad escape", SkipString, `"\x"`, 2, false},
		{"string, short \\u", SkipString, `"\u00"`, 2, false},
		{"string, control byte", SkipString, "\"a\nb\"", 2, false},
		{"string, unterminated", SkipString, `"ab`, 3, false},
		{"number", SkipNumber, `-12.5e+3,`, 8, true},
		{"number zero", SkipNumber, `0]`, 1, true},
		{"number, leading zero stops", SkipNumber, `01`, 1, true},
		{"number, bare minus", SkipNumber, `-`, 1, false},
		{"number, empty fraction", SkipNumber, `1.e5`, 2, false},
		{"number, empty exponent", SkipNumber, `1e+`, 3, false},
		{"literal", literal("null"), `null,`, 4, true},
		{"literal, short", literal("true"), `tru`, 0, false},
		{"plain string", plain, `"abc" `, 5, true},
		{"plain string, escape", plain, `"a\n"`, 2, false},
		{"plain string, invalid UTF-8", plain, "\"\xff\"", 3, false},
		{"plain string, not a string", plain, `12`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, ok := tc.step([]byte(tc.in), 0)
			if ok != tc.ok || (ok && next != tc.next) {
				t.Fatalf("%q: next %d ok %v, want %d %v", tc.in, next, ok, tc.next, tc.ok)
			}
		})
	}
	if i := SkipSpace([]byte(" \t\r\n x"), 0); i != 5 {
		t.Fatalf("SkipSpace stopped at %d, want 5", i)
	}
	if raw, _, ok := PlainString([]byte(`"héllo"`), 0); !ok || string(raw) != "héllo" {
		t.Fatalf("PlainString = %q %v", raw, ok)
	}
	if r, ok := Hex4([]byte("00e9"), 0); !ok || r != 0xe9 {
		t.Fatalf("Hex4 = %x %v", r, ok)
	}
}
