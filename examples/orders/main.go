// Command orders runs seed 001's story end to end over the sandbox: an
// order service places orders, each with a points award written to its
// outbox in the same transaction; two relays publish the outbox through
// shardmq; two points consumers apply each award once through their
// inbox. It ends with the line
//
//	orders: N, points changes: N, duplicates: 0
//
// and exits 1 when the two databases disagree.
//
// The two services have their own databases, example_orders and
// example_points, created on the sandbox's first primary (separate
// databases on that server, as two services sharing a MySQL host would
// have); they keep their rows across runs, as the router's data does, so
// the counts cover every run on this sandbox. The router is started from
// -router-bin on a free loopback port with a token made for the run, as
// the load tester does (or -router names a running one).
//
//	go run ./examples/orders -sandbox var/sandbox -router-bin bin/router
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/inbox"
	"github.com/shardmq/shardmq/client/outbox"
	"github.com/shardmq/shardmq/examples/orders/ordersvc"
	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/loadtest"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout))
}

func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("orders", flag.ContinueOnError)
	sandbox := fs.String("sandbox", "var/sandbox", "the sandbox's directory (started when none answers there)")
	routerBin := fs.String("router-bin", "", "run this router binary over the sandbox on a free port")
	routerURL := fs.String("router", "", "use a running router instead (token: $SHARDMQ_TOKEN or var/router.token)")
	n := fs.Int("orders", 500, "orders to place")
	out := fs.String("out", "var/example-orders", "directory for the router's log and token file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "orders: "+format+"\n", a...)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

	bed, started, err := loadtest.EnsureSandbox(ctx, *sandbox, 2, 1, stdout)
	if err != nil {
		return fail("sandbox: %v", err)
	}
	if started {
		fmt.Fprintf(stdout, "started a sandbox in %s (it keeps running; `make stop` stops it)\n", *sandbox)
	}
	url, token := *routerURL, ""
	if url == "" {
		if *routerBin == "" {
			return fail("give -router-bin or -router")
		}
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return fail("%v", err)
		}
		tokens := filepath.Join(*out, "router-tokens.yaml")
		os.Remove(tokens)
		if token, err = auth.NewToken(); err != nil {
			return fail("%v", err)
		}
		if err := auth.PutEntry(tokens, auth.FileToken{Name: "example-orders", SHA256: auth.Hash(token),
			Scopes: map[auth.Scope][]string{auth.Admin: {"orders.*"}}}); err != nil {
			return fail("%v", err)
		}
		rp := &loadtest.RouterProcess{Bin: *routerBin, Topology: filepath.Join(*sandbox, testbed.TopologyFile),
			LogPath: filepath.Join(*out, "router.log"), Args: []string{"-tokens", tokens}}
		if err := rp.Start(ctx); err != nil {
			return fail("%v", err)
		}
		defer rp.Stop()
		url = rp.URL()
		fmt.Fprintf(stdout, "router %s (log %s)\n", url, filepath.Join(*out, "router.log"))
	} else if token, err = ctl.ResolveToken("", ""); err != nil {
		return fail("%v", err)
	}

	// The services' own databases, on the sandbox's first primary.
	primary := bed.Clusters[0].Primary
	dbs := map[string]*sql.DB{}
	for _, name := range []string{"example_orders", "example_points"} {
		admin, err := sql.Open("mysql", primary.DSN(""))
		if err != nil {
			return fail("%v", err)
		}
		_, err = admin.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name)
		admin.Close()
		if err != nil {
			return fail("creating %s on %s: %v", name, primary.Addr(), err)
		}
		db, err := sql.Open("mysql", primary.DSN(name)+"?interpolateParams=true")
		if err != nil {
			return fail("%v", err)
		}
		defer db.Close()
		dbs[name] = db
	}
	ordersDB, pointsDB := dbs["example_orders"], dbs["example_points"]
	fmt.Fprintf(stdout, "service databases: example_orders and example_points on %s (sandbox %s)\n", primary.Addr(), bed.Clusters[0].Name)
	if err := ordersvc.MigrateOrders(ctx, ordersDB); err != nil {
		return fail("%v", err)
	}
	if err := ordersvc.MigratePoints(ctx, pointsDB); err != nil {
		return fail("%v", err)
	}

	c, err := client.New(client.Config{URL: url, Token: token, Logger: log})
	if err != nil {
		return fail("%v", err)
	}
	defer c.Close()
	if err := c.PutSubscription(ctx, ordersvc.Topic, ordersvc.Subscription, client.Subscription{MaxAttempts: 10}); err != nil {
		return fail("%v", err)
	}

	// Two relays and two points consumers, as two instances of each
	// service would run.
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	for i := range 2 {
		p, err := c.NewProducer(client.ProducerConfig{MaxAttempts: 3})
		if err != nil {
			return fail("%v", err)
		}
		rl := outbox.NewRelay(ordersDB, p, outbox.RelayConfig{Name: fmt.Sprintf("orders-relay-%d", i), Idle: 20 * time.Millisecond, Logger: log})
		rl.Start(ctx)
		stops = append(stops, func() { rl.Stop(); p.Close(context.Background()) })

		in := inbox.New(pointsDB, inbox.Config{Name: fmt.Sprintf("points-%d", i), Logger: log})
		cn, err := c.NewConsumer(client.ConsumerConfig{Topic: ordersvc.Topic, Subscription: ordersvc.Subscription,
			Name: fmt.Sprintf("points-%d", i), Concurrency: 8, Wait: time.Second}, in.Handler(ordersvc.ApplyAward))
		if err != nil {
			return fail("%v", err)
		}
		if err := cn.Start(ctx); err != nil {
			return fail("%v", err)
		}
		stops = append(stops, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cn.Stop(sctx)
		})
	}

	begin := time.Now()
	var wg sync.WaitGroup
	var next atomic.Int64
	var placeErr atomic.Pointer[error]
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > int64(*n) {
					return
				}
				if _, err := ordersvc.PlaceOrder(ctx, ordersDB, 1000+i%50, 500+i*10); err != nil {
					placeErr.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := placeErr.Load(); e != nil {
		return fail("%v", *e)
	}
	fmt.Fprintf(stdout, "placed %d orders in %.1f s; waiting for their points\n", *n, time.Since(begin).Seconds())
	deadline := time.Now().Add(2 * time.Minute)
	var tally ordersvc.Tally
	var counts outbox.Counts
	for {
		if tally, err = ordersvc.Count(ctx, ordersDB, pointsDB); err != nil {
			return fail("%v", err)
		}
		if counts, err = outbox.Count(ctx, ordersDB); err != nil {
			return fail("%v", err)
		}
		if (tally.Missing <= 0 && counts.Pending == 0) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	fmt.Fprintf(stdout, "outbox: %d published, %d pending, %d dead; done %.1f s after the first order\n",
		counts.Published, counts.Pending, counts.Dead, time.Since(begin).Seconds())
	fmt.Fprintln(stdout, tally)
	if tally.Missing != 0 || tally.Duplicates != 0 || tally.Changes != tally.Orders {
		fmt.Fprintf(os.Stderr, "orders: %d orders have no points change\n", tally.Missing)
		return 1
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return 1
	}
	return 0
}
