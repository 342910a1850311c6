package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAccessKeys: keys made by NewAccessKey are stored readable by the
// owner only, found by id, refused when others may read the file, and
// rotated by a replacing put.
func TestAccessKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "aws-keys.yaml")
	id, secret, err := NewAccessKey()
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 20 || !strings.HasPrefix(id, "SMQ") || len(secret) != 40 {
		t.Fatalf("key %q secret of %d characters", id, len(secret))
	}
	if err := PutAccessKey(path, AccessKey{ID: id, Secret: secret, Token: "billing"}, false); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}
	keys, err := OpenAccessKeys(path, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := keys.Lookup(id); !ok || k.Secret != secret || k.Token != "billing" {
		t.Fatalf("lookup %+v %v", k, ok)
	}
	id2, secret2, _ := NewAccessKey()
	if err := PutAccessKey(path, AccessKey{ID: id2, Secret: secret2, Token: "billing"}, true); err != nil {
		t.Fatal(err)
	}
	if !keys.Reload() {
		t.Fatal("the rotated file was not reloaded")
	}
	if _, ok := keys.Lookup(id); ok {
		t.Fatal("the replaced key still works")
	}
	if _, ok := keys.Lookup(id2); !ok {
		t.Fatal("the new key is not found")
	}
	os.Chmod(path, 0o644)
	if _, err := OpenAccessKeys(path, 0, nil); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable file: %v", err)
	}
	if _, err := ParseAccessKeys("f", []byte("keys:\n  - {access_key_id: SHORT, secret_access_key: x, token: t}\n")); err == nil {
		t.Fatal("a short key id was accepted")
	}
}
