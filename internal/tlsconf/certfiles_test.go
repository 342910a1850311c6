package tlsconf

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/tlsconf/certtest"
)

// TestCertFilesReload: a replaced pair is served once the check interval
// has passed; a half-replaced one (certificate and key not matching) keeps
// the last good pair until the other file arrives.
func TestCertFilesReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "ca")
	certPath, keyPath := ca.Issue(t, dir, "one", false)
	cf, err := LoadCertFiles(certPath, keyPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	cf.now = func() time.Time { return now }
	cn := func() string {
		t.Helper()
		c, err := cf.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	if cn() != "one" {
		t.Fatal(cn())
	}
	newDir := t.TempDir()
	twoCert, twoKey := ca.Issue(t, newDir, "two", false)
	rename(t, twoCert, certPath)
	now = now.Add(2 * time.Second)
	if got := cn(); got != "one" {
		t.Fatalf("certificate without its key: serving %s, want the last good pair", got)
	}
	rename(t, twoKey, keyPath)
	if got := cn(); got != "one" {
		t.Fatalf("checked again within the interval: %s", got)
	}
	now = now.Add(2 * time.Second)
	if got := cn(); got != "two" {
		t.Fatalf("after the pair was replaced: serving %s", got)
	}
	if _, err := LoadCertFiles(certPath, filepath.Join(dir, "missing.key"), nil); err == nil {
		t.Fatal("a missing key loaded")
	}
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}
