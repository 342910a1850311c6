package auth

import (
	"context"
	"fmt"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/internal/consuldouble"
	"github.com/shardmq/shardmq/internal/testtime"
)

func tokensYAML(entries map[string]string) []byte {
	out := "tokens:\n"
	for name, secret := range entries {
		out += fmt.Sprintf("  - name: %s\n    sha256: %s\n    scopes: {admin: ['*']}\n", name, Hash(secret))
	}
	return []byte(out)
}

// TestConsulStore: the token file kept in a Consul KV key (the double of
// Consul's HTTP API) is loaded and followed; an invalid version and a
// deleted key keep the last good set.
func TestConsulStore(t *testing.T) {
	t.Parallel()
	srv := consuldouble.New(consuldouble.Options{})
	defer srv.Close()
	client, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	kv := client.KV()
	key := "shardmq/" + ConsulKey
	ctx := context.Background()
	if _, err := OpenConsul(ctx, kv, key, nil); err == nil {
		t.Fatal("opened a key that does not exist")
	}
	put := func(data []byte) {
		t.Helper()
		if _, err := kv.Put(&consul.KVPair{Key: key, Value: data}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put(tokensYAML(map[string]string{"one": "s1"}))
	st, err := OpenConsul(ctx, kv, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Lookup("s1"); err != nil {
		t.Fatal(err)
	}
	st.Start(ctx)
	defer st.Stop()
	eventually := func(what string, ok func() bool) {
		t.Helper()
		testtime.Within(t, 10*time.Second, what, ok)
	}
	put(tokensYAML(map[string]string{"two": "s2"}))
	eventually("new token usable", func() bool { _, err := st.Lookup("s2"); return err == nil })
	if _, err := st.Lookup("s1"); err == nil {
		t.Fatal("removed token still works")
	}
	put([]byte("tokens: [{name: broken}]\n"))
	put(tokensYAML(map[string]string{"two": "s2", "three": "s3"}))
	eventually("token after an invalid version", func() bool { _, err := st.Lookup("s3"); return err == nil })
	if _, err := kv.Delete(key, nil); err != nil {
		t.Fatal(err)
	}
	put([]byte("not: yaml: [\n"))
	if _, err := st.Lookup("s3"); err != nil {
		t.Fatalf("last good set lost: %v", err)
	}
}
