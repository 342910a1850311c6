// Package routertest starts an in-process router over a test bed for the
// tests of packages outside server/ (the client, its outbox and inbox, the
// orders example, the Watermill adapter): each call gets its own database
// on every cluster, as server/'s own tests do.
package routertest

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/server"
	"github.com/shardmq/shardmq/shard"
)

// Router is a running router.
type Router struct {
	URL string
	// Token is an admin token on every topic ("" for an open router).
	Token string
	// Database is the router's database on every cluster.
	Database string
	// CA holds the certificate of a TLS router.
	CA *x509.CertPool

	cfg    server.Config
	mu     sync.Mutex
	srv    *httptest.Server
	router *server.Router
}

// Options tune Start.
type Options struct {
	// Token runs the router with a token file holding one admin token.
	Token bool
	// TLS serves HTTPS with a certificate made for the test; Router.CA
	// trusts it.
	TLS bool
	// Tune adjusts the router's config.
	Tune func(*server.Config)
}

// Start runs a router over bed on a database of its own until the test
// ends.
func Start(t testing.TB, bed *testbed.Bed, o Options) *Router {
	t.Helper()
	name := testbed.TestDatabase(t, bed, "t_cl_")
	var y strings.Builder
	y.WriteString("clusters:\n")
	for _, c := range bed.Clusters {
		fmt.Fprintf(&y, "  - name: %s\n    primary: %q\n", c.Name, c.Primary.DSN(name))
		if len(c.Replicas) > 0 {
			y.WriteString("    replicas:\n")
			for _, r := range c.Replicas {
				fmt.Fprintf(&y, "      - %q\n", r.DSN(name))
			}
		}
	}
	per := shard.Count / len(bed.Clusters)
	y.WriteString("shard_map:\n  version: 1\n  ranges:\n")
	for i, c := range bed.Clusters {
		to := (i+1)*per - 1
		if i == len(bed.Clusters)-1 {
			to = shard.Count - 1
		}
		fmt.Fprintf(&y, "    - {from: %d, to: %d, cluster: %s}\n", i*per, to, c.Name)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(path, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{TopologyFile: path}
	// One key for the router's life, restarts included: receipts made
	// before a Restart are acked after it, as with a key file.
	cfg.Broker.Receipts = broker.RandomReceipts()
	out := &Router{Database: name}
	if o.Token {
		secret, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens := filepath.Join(dir, "tokens.yaml")
		ft := auth.FileToken{Name: "test-admin", SHA256: auth.Hash(secret), Scopes: map[auth.Scope][]string{auth.Admin: {"*"}}}
		if err := auth.PutEntry(tokens, ft); err != nil {
			t.Fatal(err)
		}
		cfg.Security.TokensFile = tokens
		out.Token = secret
	}
	if o.Tune != nil {
		o.Tune(&cfg)
	}
	out.cfg = cfg
	r, err := server.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(r.Handler())
	if o.TLS {
		srv.StartTLS()
		out.CA = x509.NewCertPool()
		out.CA.AddCert(srv.Certificate())
	} else {
		srv.Start()
	}
	out.URL = srv.URL
	out.srv, out.router = srv, r
	t.Cleanup(out.stop)
	return out
}

func (rt *Router) stop() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.srv != nil {
		rt.srv.Close()
		rt.router.Close()
		rt.srv, rt.router = nil, nil
	}
}

// Restart stops the router as a crash looks to its clients — every
// connection is cut at once, answers of requests in flight are lost
// (their group commits may still complete) — then starts a new router
// over the same databases on the same address. Not for TLS routers.
func (rt *Router) Restart(t testing.TB) {
	t.Helper()
	if rt.CA != nil {
		t.Fatal("routertest: Restart of a TLS router")
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	addr := rt.srv.Listener.Addr().String()
	rt.srv.Listener.Close()
	rt.srv.CloseClientConnections()
	rt.srv.Close()
	rt.router.Close()
	r, err := server.New(context.Background(), rt.cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The port was ours a moment ago; another process may take it in
	// between, which ends the test rather than hang it.
	var ln net.Listener
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		r.Close()
		t.Fatalf("routertest: listening again on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(r.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	rt.srv, rt.router = srv, r
}
