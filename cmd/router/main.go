// Command router runs a shardmq router: the HTTP API over the MySQL
// clusters named in a topology file.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/shardmq/shardmq/server"
)

func main() {
	var cfg server.Config
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	flag.StringVar(&cfg.TopologyFile, "topology", "topology.yaml", "static topology file (reloaded when it changes)")
	level := flag.String("log-level", "info", "debug, info, warn or error")
	flag.IntVar(&cfg.Broker.Commit.MaxMessages, "commit-max-messages", 0, "most messages in one group-commit transaction (default 500)")
	flag.IntVar(&cfg.Broker.Commit.MaxBytes, "commit-max-bytes", 0, "most payload bytes in one group-commit transaction (default 8 MiB)")
	flag.DurationVar(&cfg.Broker.Commit.Linger, "commit-linger", 0, "how long a busy cluster's batch that is not full waits for more requests (default 2ms; negative disables)")
	flag.IntVar(&cfg.Broker.Commit.LingerAfter, "commit-linger-after", 0, "requests that must be queued when a batch or the one before it begins for it to linger (default 8)")
	flag.IntVar(&cfg.Broker.Commit.Committers, "commit-workers", 0, "group-commit transactions in flight per cluster (default 4; more than one only while a full batch waits)")
	flag.DurationVar(&cfg.Broker.ReplicatedTimeout, "replicated-timeout", 0, "wait for a replica under durability replicated (default 5s)")
	flag.DurationVar(&cfg.Broker.FrozenWait, "frozen-wait", 0, "how long a request for a frozen vshard is held (default 2s)")
	flag.IntVar(&cfg.Broker.FrozenMaxHeld, "frozen-max-held", 0, "requests held on frozen vshards at once; more get 503 at once (default 10000)")
	flag.IntVar(&cfg.Reshard.RowsPerSecond, "reshard-rows-per-second", 0, "resharding copy and cleanup throttle (default 20000; -1 unthrottled)")
	flag.IntVar(&cfg.Reshard.BatchRows, "reshard-batch-rows", 0, "rows per resharding copy or delete statement (default 500)")
	flag.DurationVar(&cfg.Reshard.FreezeBudget, "reshard-freeze-budget", 0, "longest final sync under freeze before it is given up and retried (default 1s)")
	flag.DurationVar(&cfg.Reshard.MaxReplicaLag, "reshard-max-replica-lag", 0, "resharding waits while the written cluster's replicas lag more (default 2s)")
	flag.IntVar(&cfg.Broker.RecentKeys, "recent-keys", 0, "size of the recent-keys cache (default 100000; -1 disables)")
	flag.IntVar(&cfg.Store.MaxOpen, "pool-max-open", 0, "connections per cluster primary (default 64)")
	flag.StringVar(&cfg.DeadLetters.WebhookURL, "dead-letter-webhook", "", "URL that receives a JSON POST for every dead-letter growth alarm")
	gcPercent := flag.Int("gc-percent", 400, "Go's GC target (debug.SetGCPercent); ignored when the GOGC environment variable is set")
	debugAddr := flag.String("debug-addr", "", "serve Go's pprof profiles on this address (e.g. 127.0.0.1:6060); off when empty")
	co := addConsulFlags(flag.CommandLine)
	flag.Parse()

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "router: -log-level:", err)
		os.Exit(2)
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	// Every request allocates (JSON, SQL arguments) while the live heap
	// stays small (the recent-keys cache, ~20 MB at its default size), so
	// at Go's default of 100 the collector ran often: ~13 % of the
	// router's CPU under 64 single-message clients. 400 cut the router's
	// CPU per request by 7–11 % here for a heap a few times larger.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}

	if *debugAddr != "" {
		go func() {
			// net/http/pprof registers on the default mux, used nowhere else.
			if err := http.ListenAndServe(*debugAddr, nil); err != nil {
				cfg.Log.Error("debug server stopped", "err", err)
			}
		}()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, co); err != nil {
		cfg.Log.Error("router stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg server.Config, co *consulOptions) error {
	c, err := co.setup(ctx, &cfg)
	if err != nil {
		return err
	}
	defer c.stop()
	r, err := server.New(ctx, cfg)
	if err != nil {
		return err
	}
	c.serving(ctx, r)
	ln, err := r.Listen()
	if err != nil {
		r.Close()
		return err
	}
	cfg.Log.Info("router serving", "listen", ln.Addr().String(), "topology", cfg.TopologyFile)
	return r.Run(ctx, ln)
}
