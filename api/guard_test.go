package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardmq/shardmq/auth"
)

func tokenSet(t testing.TB, n int) *auth.Set {
	t.Helper()
	f := auth.File{Tokens: []auth.FileToken{
		{Name: "consumer", SHA256: auth.Hash("c"), Scopes: map[auth.Scope][]string{auth.Consume: {"*"}}},
		{Name: "admin", SHA256: auth.Hash("a"), Scopes: map[auth.Scope][]string{auth.Admin: {"*"}}},
	}}
	for i := 0; i < n; i++ {
		f.Tokens = append(f.Tokens, auth.FileToken{Name: fmt.Sprint("t", i), SHA256: auth.Hash(fmt.Sprint("secret-", i)),
			Scopes: map[auth.Scope][]string{auth.Produce: {fmt.Sprint("topic", i)}}})
	}
	set, err := f.Build("test")
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestUnlistedRouteFailsClosed: a route the API serves that the policy
// table does not name needs admin on every topic.
func TestUnlistedRouteFailsClosed(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	s.handle("POST /v1/brand-new", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	g := s.Guard(GuardConfig{Tokens: tokenSet(t, 0)})
	for tok, want := range map[string]int{"": 401, "c": 403, "a": http.StatusTeapot} {
		req := httptest.NewRequest("POST", "/v1/brand-new", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("token %q: %d %s, want %d", tok, rec.Code, rec.Body.String(), want)
		}
	}
}

// BenchmarkGuard is the guard's cost per request (host, origin, content
// type, token lookup among 102 tokens, rate, scope) in front of a handler
// that does nothing; the route is one the table lacks, which costs one
// more route lookup than a listed one.
func BenchmarkGuard(b *testing.B) {
	s := New(nil, Limits{}, nil, nil)
	s.handle("POST /v1/bench", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	g := s.Guard(GuardConfig{Tokens: tokenSet(b, 100)})
	req := httptest.NewRequest("POST", "/v1/bench", http.NoBody)
	req.Header.Set("Authorization", "Bearer a")
	req.Header.Set("Content-Type", "application/json")
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatal(rec.Code, rec.Body.String())
		}
	}
}
