// Command router runs a shardmq router: the HTTP API over the MySQL
// clusters named in a topology file.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardmq/shardmq/server"
)

func main() {
	var cfg server.Config
	flag.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	flag.StringVar(&cfg.TopologyFile, "topology", "topology.yaml", "static topology file (reloaded when it changes)")
	level := flag.String("log-level", "info", "debug, info, warn or error")
	co := addConsulFlags(flag.CommandLine)
	flag.Parse()

	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "router: -log-level:", err)
		os.Exit(2)
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))

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
