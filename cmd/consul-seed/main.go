// Command consul-seed moves a static topology file into Consul, for
// operators leaving the embedded default: it stores the file's shard map in
// KV (with check-and-set, at a version above every live router's) and
// prints, writes as agent configuration files, or registers through the
// agent, a service definition for every MySQL instance the file names.
// With -recover it rebuilds a lost shard map from what the clusters and
// the live routers know (see docs/consul.md, Recovery).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/shardmq/shardmq/internal/recovery"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

func main() {
	var o options
	flag.StringVar(&o.file, "topology", "topology.yaml", "static topology file to seed from")
	flag.StringVar(&o.addr, "consul-addr", "", "Consul HTTP address (default $CONSUL_HTTP_ADDR or 127.0.0.1:8500)")
	flag.StringVar(&o.prefix, "consul-prefix", "shardmq/", "Consul KV prefix")
	flag.StringVar(&o.service, "consul-service", "mysql", "Consul service name of the MySQL instances")
	flag.BoolVar(&o.replace, "replace", false, "replace a shard map already in Consul (written as its successor)")
	flag.BoolVar(&o.register, "register", false, "register the instances' services through the agent at -consul-addr (otherwise print their definitions)")
	flag.StringVar(&o.outDir, "out", "", "write each instance's service definition to DIR/<service id>.json (an agent configuration file) instead of printing them")
	flag.BoolVar(&o.skipMap, "services-only", false, "do not touch the shard map")
	flag.BoolVar(&o.recover, "recover", false, "rebuild the shard map from the clusters' vshard_owner records and the live routers, after the topology store lost it (no service definitions)")
	flag.BoolVar(&o.force, "force", false, "with -recover: go on when a cluster cannot be read or a live router disagrees with the records")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "consul-seed:", err)
		os.Exit(1)
	}
}

type options struct {
	file, addr, prefix, service, outDir string
	replace, register, skipMap          bool
	recover, force                      bool
}

// run does the work; out receives the service definitions when they are
// printed (one configuration document), info what was done.
func run(ctx context.Context, o options, out, info io.Writer) error {
	top, err := topology.LoadFile(o.file)
	if err != nil {
		return err
	}
	src, err := consul.New(consul.Config{Address: o.addr, Prefix: o.prefix, Service: o.service})
	if err != nil {
		return err
	}
	if o.recover {
		_, err := recovery.Recover(ctx, top, src, o.force, info)
		return err
	}
	defs, err := consul.ServiceDefinitions(top, o.service)
	if err != nil {
		return fmt.Errorf("%s: %w", o.file, err)
	}
	switch {
	case o.register:
		for _, d := range defs {
			if err := src.API().Agent().ServiceRegister(d); err != nil {
				return fmt.Errorf("register %s: %w", d.ID, err)
			}
			fmt.Fprintf(info, "registered service %s (%s %s) at %s:%d\n", d.ID, d.Meta[consul.MetaCluster], d.Meta[consul.MetaRole], d.Address, d.Port)
		}
	case o.outDir != "":
		for _, c := range consul.ServiceConfigs(defs) {
			data, err := json.MarshalIndent(map[string]any{"service": c}, "", "  ")
			if err != nil {
				return err
			}
			path := filepath.Join(o.outDir, c.ID+".json")
			if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
				return fmt.Errorf("write service definition: %w", err)
			}
			fmt.Fprintf(info, "wrote %s (%s %s)\n", path, c.Meta[consul.MetaCluster], c.Meta[consul.MetaRole])
		}
	default:
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"services": consul.ServiceConfigs(defs)}); err != nil {
			return err
		}
	}
	if o.skipMap {
		return nil
	}
	m, err := recovery.AboveRecords(ctx, top, info)
	if err != nil {
		return err
	}
	v, err := consul.SeedMap(ctx, src, m, o.replace)
	if err != nil {
		return fmt.Errorf("seed shard map: %w (use -replace to overwrite)", err)
	}
	fmt.Fprintf(info, "shard map version %d stored at %sshardmap\n", v, src.Prefix())
	return nil
}
