// Command router runs a shardmq router: the HTTP API over the MySQL
// clusters named in a topology file.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
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
	flag.IntVar(&cfg.Cluster.Commit.MaxMessages, "commit-max-messages", 0, "most messages in one group-commit transaction (default 500)")
	flag.IntVar(&cfg.Cluster.Commit.MaxBytes, "commit-max-bytes", 0, "most payload bytes in one group-commit transaction (default 8 MiB)")
	flag.DurationVar(&cfg.Cluster.Commit.Linger, "commit-linger", 0, "how long a busy cluster's batch that is not full waits for more requests (default 2ms; negative disables)")
	flag.IntVar(&cfg.Cluster.Commit.LingerAfter, "commit-linger-after", 0, "requests that must be queued when a batch or the one before it begins for it to linger (default 8)")
	flag.IntVar(&cfg.Cluster.Commit.Committers, "commit-workers", 0, "group-commit transactions in flight per cluster (default 4; more than one only while a full batch waits)")
	flag.DurationVar(&cfg.Broker.ReplicatedTimeout, "replicated-timeout", 0, "wait for a replica under durability replicated (default 5s)")
	flag.DurationVar(&cfg.Broker.FrozenWait, "frozen-wait", 0, "how long a request for a frozen vshard is held (default 2s)")
	flag.IntVar(&cfg.Broker.FrozenMaxHeld, "frozen-max-held", 0, "requests held on frozen vshards at once; more get 503 at once (default 10000)")
	flag.IntVar(&cfg.Reshard.RowsPerSecond, "reshard-rows-per-second", 0, "resharding copy and cleanup throttle (default 20000; -1 unthrottled)")
	flag.IntVar(&cfg.Reshard.BatchRows, "reshard-batch-rows", 0, "rows per resharding copy or delete statement (default 500)")
	flag.DurationVar(&cfg.Reshard.FreezeBudget, "reshard-freeze-budget", 0, "longest final sync under freeze before it is given up and retried (default 1s)")
	flag.DurationVar(&cfg.Reshard.MaxReplicaLag, "reshard-max-replica-lag", 0, "resharding waits while the written cluster's replicas lag more (default 2s)")
	flag.IntVar(&cfg.Broker.RecentKeys, "recent-keys", 0, "size of the recent-keys cache (default 100000; -1 disables)")
	flag.DurationVar(&cfg.HA.ReplicaReadTimeout, "replica-read-timeout", 0, "bound on each trace or lookup read on a replica before it falls back to the primary (default 1s)")
	flag.IntVar(&cfg.Store.MaxOpen, "pool-max-open", 0, "connections per cluster primary (default 64)")
	flag.StringVar(&cfg.DeadLetters.WebhookURL, "dead-letter-webhook", "", "URL that receives a JSON POST for every dead-letter growth alarm")
	flag.DurationVar(&cfg.HTTP.ReadTimeout, "http-read-timeout", 0, "longest time to read a whole request, body included (default 30s)")
	flag.DurationVar(&cfg.HTTP.WriteTimeout, "http-write-timeout", 0, "longest time from a request's headers to the end of its answer; at least the longest claim wait (20s) + 5s (default 60s)")
	flag.DurationVar(&cfg.HTTP.IdleTimeout, "http-idle-timeout", 0, "how long an idle keep-alive connection is kept (default 60s)")
	flag.IntVar(&cfg.HTTP.MaxConns, "max-conns", 0, "open client connections; over it a connection is answered 503 too_many_connections (default 1024; -1 no cap)")
	flag.DurationVar(&cfg.HTTP.ShutdownTimeout, "shutdown-timeout", 0, "how long a shutdown waits for in-flight requests before closing their connections (default 30s)")
	flag.IntVar(&cfg.Limits.MaxClaimBytes, "claim-max-bytes", 0, "message bytes in one claim answer, and the largest max_bytes a claim may ask (default 8 MiB)")
	flag.IntVar(&cfg.SubscriptionLimits.MaxTopics, "max-topics", 0, "topics with subscriptions (default 10000; -1 no cap)")
	flag.IntVar(&cfg.SubscriptionLimits.MaxPerTopic, "max-subscriptions-per-topic", 0, "subscriptions of one topic (default 32; -1 no cap)")
	flag.IntVar(&cfg.SubscriptionLimits.MaxTopicsPerCreator, "max-topics-per-token", 0, "topics one token may create, by producing or by a subscription (default 1000; -1 no quota; tokens with admin on every topic have none)")
	gcPercent := flag.Int("gc-percent", 400, "Go's GC target (debug.SetGCPercent); ignored when the GOGC environment variable is set")
	debugAddr := flag.String("debug-addr", "", "serve Go's pprof profiles on this address (e.g. 127.0.0.1:6060); off when empty")
	flag.IntVar(&cfg.Observe.MaxLabelValues, "metrics-label-cap", 0, "topics, and topic/subscription pairs, with metric series of their own; the rest sum into _other (default 200)")
	flag.DurationVar(&cfg.Observe.QueueEvery, "queue-stats-every", 0, "how often queue depth and oldest-message age are recounted for /metrics (default 15s)")
	flag.Func("disk-path", "export free and total bytes of the file system holding this directory (repeatable; e.g. the sandbox's)", func(v string) error {
		cfg.Observe.DiskPaths = append(cfg.Observe.DiskPaths, v)
		return nil
	})
	flag.IntVar(&cfg.Retention.AheadMonths, "partitions-ahead", 0, "months after the current one whose partitions exist (default 3)")
	flag.IntVar(&cfg.Retention.HotMonths, "hot-months", 0, "whole months before the current one kept on the hot clusters; older ones move to the archive cluster (default 3)")
	flag.IntVar(&cfg.Retention.WarmMonths, "warm-months", 0, "whole months before the current one kept as rows; older ones are exported to files (default 12)")
	flag.StringVar(&cfg.Retention.ColdDir, "archive-dir", "", "directory of the cold archive files (default var/archive)")
	flag.DurationVar(&cfg.Retention.Every, "retention-every", 0, "how often the retention jobs run on the leading router (default 1h)")
	flag.DurationVar(&cfg.Retention.Pause, "retention-pause", 0, "pause between two batches of the retention jobs, the throttle (default 10ms)")
	flag.IntVar(&cfg.Retention.BatchRows, "retention-batch-rows", 0, "rows per retention read, write or delete (default 1000)")
	flag.StringVar(&cfg.Retention.OffPeak, "off-peak", "", "daily UTC window HH:MM-HH:MM in which fragmented partitions are rebuilt (default 02:00-05:00)")
	flag.Float64Var(&cfg.Retention.FreeRatio, "rebuild-free-ratio", 0, "share of a partition's space that, free, makes the upkeep rebuild it (default 0.4)")
	flag.BoolVar(&cfg.Retention.Disabled, "retention-off", false, "run no retention job (partition upkeep included) on this router")
	flag.StringVar(&cfg.Broker.Owners.Addr, "advertise", "", "address (host:port) other routers reach this one at, to forward consume operations on the units it owns (default the -listen address when it names a host; docs/consume.md)")
	flag.IntVar(&cfg.Broker.Owners.MaxInFlight, "max-leases", 0, "leases this router holds in memory over all its units; past it claims hand out fewer first attempts (default 1000000, about 230 MiB)")
	flag.IntVar(&cfg.Broker.Owners.Flush.InFlight, "owner-flushes", 0, "owners' flush transactions (acks, nacks, expiries) in flight per cluster (default 1; more makes each smaller and costs the servers more per message)")
	bodyMB := flag.Int("body-cache-mb", 64, "MiB of messages this router keeps after producing them, so its owners hand them out without reading them back; 0 disables (docs/consume.md)")
	flag.DurationVar(&cfg.Broker.Owners.LeaseTTL, "owner-lease-ttl", 0, "how long this router's ownership of its units lasts without a renewal; another router takes them after (default 10s)")
	flag.StringVar(&cfg.PeerCA, "peer-ca", "", "CA file (PEM) to verify other routers' certificates when forwarding over TLS (default the system's roots)")
	co := addConsulFlags(flag.CommandLine)
	sf := addSecurityFlags(flag.CommandLine, &cfg.Security)
	flag.Parse()
	cfg.Broker.BodyCacheBytes = *bodyMB << 20
	if *bodyMB <= 0 {
		cfg.Broker.BodyCacheBytes = -1
	}
	if err := sf.apply(&cfg.Security); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(2)
	}

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
	if err := run(ctx, cfg, co, sf); err != nil {
		cfg.Log.Error("router stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg server.Config, co *consulOptions, sf *securityFlags) error {
	// Bind first: on Consul, holding the listen address proves that a
	// registration of this router's id from the same address belongs to a
	// dead predecessor, which the router then takes over.
	raw, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer raw.Close()
	c, err := co.setup(ctx, &cfg, raw.Addr().String())
	if err != nil {
		return err
	}
	if err := sf.openConsulTokens(ctx, co, &cfg); err != nil {
		c.stop()
		return err
	}
	defer c.stop()
	r, err := server.New(ctx, cfg)
	if err != nil {
		return err
	}
	c.serving(ctx, r)
	// The listen policy (no open router off loopback) and TLS apply to
	// the address bound above.
	ln, err := r.SecureListener(raw)
	if err != nil {
		r.Close()
		return err
	}
	topo := cfg.TopologyFile
	if c != nil {
		topo = "consul " + co.addr
	}
	cfg.Log.Info("router serving", "listen", ln.Addr().String(), "topology", topo,
		"tokens", cfg.Security.TokensFile != "", "tls", cfg.Security.TLSCert != "")
	return r.Run(ctx, ln)
}
