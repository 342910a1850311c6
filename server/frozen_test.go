package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

// A frozen vshard (resharding cut-over) holds requests for FrozenWait and
// then answers unavailable; a request held while the vshard unfreezes is
// served. Nothing is lost either way.
func TestFrozenVShardHoldsThenAnswersUnavailable(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	e := setupOn(t, bed, func(c *Config) {
		// Long enough for the unfreeze below to be applied (file reload,
		// the map recorded on both primaries) on a loaded machine.
		c.Broker.FrozenWait = 2 * time.Second
		c.ReloadEvery = 20 * time.Millisecond
	})
	rctx, cancel := context.WithCancel(t.Context())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- e.r.Run(rctx, ln) }() // follows the topology file
	t.Cleanup(func() { cancel(); <-ran })
	path := e.r.cfg.TopologyFile
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	setMap := func(version string, frozen bool) {
		t.Helper()
		y := strings.Replace(string(orig), "version: 1", "version: "+version, 1)
		if frozen {
			y = strings.Replace(y, "cluster: c1}", "cluster: c1, frozen: true}", 1)
		}
		if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{"2": 2, "3": 3}[version]
		waitFor(t, 10*time.Second, func() bool { return e.r.table.Load().Version() == want })
	}
	// Pick a key that lives on c1.
	key := ""
	for i := 0; key == "" && i < 1000; i++ {
		if k := fmt.Sprint("frozen-", i); e.owner(shard.Of(k)) == "c1" {
			key = k
		}
	}
	if key == "" {
		t.Fatal("no test key on c1")
	}
	setMap("2", true)
	began := time.Now()
	st, hdr, body := e.post(t, "/v1/topics/fz/messages", map[string]any{"messages": []any{msg(key, 1)}})
	r := results(t, body)[0]
	if st != 200 || r["status"] != "unavailable" || hdr.Get("Retry-After") == "" {
		t.Fatalf("produce to a frozen vshard: %d %v", st, r)
	}
	if waited := time.Since(began); waited < 2*time.Second || waited > 10*time.Second {
		t.Fatalf("held %v, want about the 2s FrozenWait", waited)
	}
	// Unfreeze while a request is held: it is served.
	done := make(chan map[string]any, 1)
	go func() {
		_, _, body := e.post(t, "/v1/topics/fz/messages", map[string]any{"messages": []any{msg(key, 1)}})
		done <- results(t, body)[0]
	}()
	waitFor(t, 10*time.Second, func() bool { return e.r.broker.FrozenStats().Held == 1 }) // it is held now
	setMap("3", false)
	if r := <-done; r["status"] != "created" {
		t.Fatalf("request held across the unfreeze: %v", r)
	}
}
