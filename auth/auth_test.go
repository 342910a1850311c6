package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, topic string
		want           bool
	}{
		{"*", "orders", true},
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders.", true},
		{"orders.*", "orders", false},
		{"orders.*", "ordersx", false},
		{"*.eu", "orders.eu", true},
		{"*.eu", "orders.us", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxcyyb", false},
		{"a*a", "a", false},
	} {
		if got := Match(c.pattern, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.pattern, c.topic, got, c.want)
		}
	}
}

func entry(name, token string, scopes map[Scope][]string) FileToken {
	return FileToken{Name: name, SHA256: Hash(token), Scopes: scopes}
}

func TestTokenScopes(t *testing.T) {
	t.Parallel()
	f := File{Tokens: []FileToken{
		entry("producer", "tok-p", map[Scope][]string{Produce: {"orders.*"}}),
		entry("ops", "tok-a", map[Scope][]string{Admin: {"*"}}),
		entry("team", "tok-t", map[Scope][]string{Admin: {"orders.*"}, Consume: {"payments"}}),
	}}
	set, err := f.Build("test")
	if err != nil {
		t.Fatal(err)
	}
	look := func(secret string) *Token {
		tok, err := set.Lookup(secret)
		if err != nil {
			t.Fatalf("Lookup(%q): %v", secret, err)
		}
		return tok
	}
	p, a, tm := look("tok-p"), look("tok-a"), look("tok-t")
	if p.Name != "producer" || a.Name != "ops" || tm.Name != "team" {
		t.Fatalf("names %s %s %s", p.Name, a.Name, tm.Name)
	}
	for _, c := range []struct {
		tok   *Token
		scope Scope
		topic string
		want  bool
	}{
		{p, Produce, "orders.eu", true},
		{p, Produce, "payments", false},
		{p, Consume, "orders.eu", false},
		{p, Produce, "", false}, // every topic needs "*"
		{a, Admin, "", true},
		{a, Produce, "anything", true}, // admin includes produce and consume
		{a, Consume, "", true},
		{tm, Admin, "orders.eu", true},
		{tm, Consume, "orders.eu", true},
		{tm, Admin, "", false},
		{tm, Consume, "payments", true},
		{tm, Admin, "payments", false},
	} {
		if got := c.tok.Allows(c.scope, c.topic); got != c.want {
			t.Errorf("%s.Allows(%s, %q) = %v, want %v", c.tok.Name, c.scope, c.topic, got, c.want)
		}
	}
	for _, bad := range []string{"", "tok", "tok-p ", "TOK-P"} {
		if _, err := set.Lookup(bad); err == nil {
			t.Errorf("Lookup(%q) found a token", bad)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	h := Hash("x")
	for _, c := range []struct{ yaml, want string }{
		{"tokens:\n  - name: a\n    sha256: " + h + "\n", "at least one"},
		{"tokens:\n  - name: a\n    sha256: abc\n    scopes: {admin: ['*']}\n", "64 hex"},
		{"tokens:\n  - name: 'a b'\n    sha256: " + h + "\n    scopes: {admin: ['*']}\n", "name"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {root: ['*']}\n", "unknown scope"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {admin: ['a/b']}\n", "pattern"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {admin: []}\n", "no topic pattern"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {admin: ['*']}\n  - name: a\n    sha256: " + Hash("y") + "\n    scopes: {admin: ['*']}\n", "twice"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {admin: ['*']}\n  - name: b\n    sha256: " + h + "\n    scopes: {admin: ['*']}\n", "another token"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scopes: {admin: ['*']}\n    rate: {per_second: 0}\n", "rate"},
		{"tokens:\n  - name: a\n    sha256: " + h + "\n    scope: {admin: ['*']}\n", "not found"},
	} {
		_, err := Parse("tokens.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "tokens.yaml") {
			t.Errorf("Parse(%q) = %v, want an error naming the file and %q", c.yaml, err, c.want)
		}
	}
	// JSON is YAML too.
	set, err := Parse("tokens.json", []byte(`{"tokens":[{"name":"a","sha256":"`+h+`","scopes":{"consume":["t"]}}]}`))
	if err != nil || set.Len() != 1 {
		t.Fatalf("JSON token file: %v", err)
	}
}

func TestRate(t *testing.T) {
	t.Parallel()
	f := File{Tokens: []FileToken{{Name: "slow", SHA256: Hash("s"), Scopes: map[Scope][]string{Produce: {"*"}},
		Rate: &Rate{PerSecond: 0.5, Burst: 2}}}}
	set, err := f.Build("test")
	if err != nil {
		t.Fatal(err)
	}
	set.withLimiters(nil)
	tok, _ := set.Lookup("s")
	now := time.Unix(1000, 0)
	for i := 0; i < 2; i++ {
		if ok, _ := tok.Allow(now); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := tok.Allow(now)
	if ok || wait <= 0 || wait > 2*time.Second {
		t.Fatalf("third request: allowed %v, wait %v; want refused with a wait of at most 2s", ok, wait)
	}
	if RetryAfterSeconds(wait) != 2 {
		t.Fatalf("Retry-After %d, want 2", RetryAfterSeconds(wait))
	}
	// A refused request does not use up the budget: after the wait one
	// request passes.
	if ok, _ := tok.Allow(now.Add(wait)); !ok {
		t.Fatal("request after the wait refused")
	}
}

func TestStoreReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := PutEntry(path, FileToken{Name: "a", SHA256: Hash("one"), Scopes: map[Scope][]string{Admin: {"*"}},
		Rate: &Rate{PerSecond: 0.001, Burst: 1}}); err != nil {
		t.Fatal(err)
	}
	st, err := Open(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := st.Lookup("one")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := tok.Allow(time.Now()); !ok {
		t.Fatal("first request refused")
	}
	// Rotation: a second token for another client, then the old one's
	// secret replaced.
	if err := PutEntry(path, FileToken{Name: "b", SHA256: Hash("two"), Scopes: map[Scope][]string{Consume: {"t"}}}); err != nil {
		t.Fatal(err)
	}
	if !st.Reload() {
		t.Fatal("changed file not reloaded")
	}
	if _, err := st.Lookup("two"); err != nil {
		t.Fatalf("new token: %v", err)
	}
	again, err := st.Lookup("one")
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := again.Allow(time.Now()); ok {
		t.Fatal("a reload handed out a fresh burst: the limiter of an unchanged token must carry over")
	}
	if err := PutEntry(path, FileToken{Name: "a", SHA256: Hash("three"), Scopes: map[Scope][]string{Admin: {"*"}}}); err != nil {
		t.Fatal(err)
	}
	st.Reload()
	if _, err := st.Lookup("one"); err == nil {
		t.Fatal("the replaced secret still works")
	}
	if _, err := st.Lookup("three"); err != nil {
		t.Fatal(err)
	}
	// An invalid version is ignored; the last good set stays.
	if err := os.WriteFile(path, []byte("tokens: [{name: x}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st.Reload() {
		t.Fatal("invalid file applied")
	}
	if _, err := st.Lookup("three"); err != nil {
		t.Fatalf("last good set lost: %v", err)
	}
	if st.Reload() {
		t.Fatal("unchanged file reloaded")
	}
}

func TestNewToken(t *testing.T) {
	t.Parallel()
	a, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewToken()
	if a == b || !strings.HasPrefix(a, "smq_") || len(a) != 4+43 {
		t.Fatalf("tokens %q %q", a, b)
	}
	if len(Hash(a)) != 64 {
		t.Fatal(Hash(a))
	}
}
