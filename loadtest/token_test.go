package loadtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRouterSendsToken: with SetToken every request carries the bearer
// token; without it none does.
func TestRouterSendsToken(t *testing.T) {
	t.Parallel()
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"status":"ready"}`))
	}))
	defer srv.Close()
	for _, tok := range []string{"smq_test", ""} {
		r := NewRouter(srv.URL, 1, "")
		r.SetToken(tok)
		if err := r.Ready(context.Background()); err != nil {
			t.Fatal(err)
		}
		r.Close()
		want := ""
		if tok != "" {
			want = "Bearer " + tok
		}
		if h := <-got; h != want {
			t.Fatalf("Authorization %q, want %q", h, want)
		}
	}
}
