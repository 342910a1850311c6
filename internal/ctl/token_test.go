package ctl

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/auth"
)

// TestTokenNew: the secret goes to a 0600 file, its hash and scopes into
// the token file, and the router's token store accepts the secret with
// exactly those scopes; running it again under the same name rotates it.
func TestTokenNew(t *testing.T) {
	dir := t.TempDir()
	tokens, out := filepath.Join(dir, "tokens.yaml"), filepath.Join(dir, "sub", "router.token")
	var stdout, stderr bytes.Buffer
	args := []string{"new", "-name", "billing", "-produce", "orders.*, payments", "-consume", "payments", "-rate", "5", "-tokens", tokens, "-out", out}
	if code := RunToken(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v mode %v", err, fi.Mode())
	}
	if stdout.Len() != 0 {
		t.Fatalf("secret printed although -out was given: %q", stdout.String())
	}
	secret, err := ResolveToken("", out)
	if err != nil || !strings.HasPrefix(secret, "smq_") {
		t.Fatalf("ResolveToken: %q %v", secret, err)
	}
	data, _ := os.ReadFile(tokens)
	if bytes.Contains(data, []byte(secret)) {
		t.Fatal("the token file holds the secret")
	}
	st, err := auth.Open(tokens, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := st.Lookup(secret)
	if err != nil {
		t.Fatal(err)
	}
	if !tok.Allows(auth.Produce, "orders.eu") || !tok.Allows(auth.Produce, "payments") || !tok.Allows(auth.Consume, "payments") ||
		tok.Allows(auth.Consume, "orders.eu") || tok.Allows(auth.Admin, "payments") {
		t.Fatal("scopes not as given")
	}
	if code := RunToken(args, &stdout, &stderr); code != 0 {
		t.Fatalf("rotation: exit %d: %s", code, stderr.String())
	}
	st.Reload()
	if _, err := st.Lookup(secret); err == nil {
		t.Fatal("the rotated secret still works")
	}
	for _, bad := range [][]string{{"new"}, {"new", "-name", "x"}, {"new", "-name", "x", "-admin", "a/b"}, {"old"}} {
		if code := RunToken(bad, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
	}
}

func TestResolveTokenOrder(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "t")
	os.WriteFile(file, []byte("from-file\nignored\n"), 0o600)
	t.Setenv("SHARDMQ_TOKEN", "")
	if tok, _ := ResolveToken("", file); tok != "from-file" {
		t.Fatalf("file: %q", tok)
	}
	t.Setenv("SHARDMQ_TOKEN", "from-env")
	if tok, _ := ResolveToken("", file); tok != "from-env" {
		t.Fatalf("env: %q", tok)
	}
	if tok, _ := ResolveToken("from-flag", file); tok != "from-flag" {
		t.Fatalf("flag: %q", tok)
	}
	t.Setenv("SHARDMQ_TOKEN", "")
	if _, err := ResolveToken("", filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a named token file that is missing is not an error")
	}
	t.Chdir(dir)
	if tok, err := ResolveToken("", ""); tok != "" || err != nil {
		t.Fatalf("no default file: %q %v", tok, err)
	}
}

func TestWithTokenSendsBearer(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	var out, errw bytes.Buffer
	if code := Run([]string{"stats"}, srv.URL, &out, &errw, WithToken(nil, "smq_x")); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	if h := <-got; h != "Bearer smq_x" {
		t.Fatalf("Authorization %q", h)
	}
}
