package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/server"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// consulOptions are the flags of a router that takes its topology from
// Consul instead of a file (-consul-addr set).
// Consul keeps the resharding jobs' document.
var _ rebalance.StateDoc = (*consul.ReshardState)(nil)

type consulOptions struct {
	addr, prefix, service, routerID  string
	user, password, database, params string
	ttl                              time.Duration
}

func addConsulFlags(fs *flag.FlagSet) *consulOptions {
	o := &consulOptions{}
	fs.StringVar(&o.addr, "consul-addr", "", "Consul HTTP address; when set the topology comes from Consul, not -topology")
	fs.StringVar(&o.prefix, "consul-prefix", "shardmq/", "Consul KV prefix of the shard map, subscriptions, routers and leader lock")
	fs.StringVar(&o.service, "consul-service", "mysql", "Consul service name of the MySQL instances (meta cluster and role)")
	fs.StringVar(&o.routerID, "router-id", "", "this router's id among the live routers (default hostname-listen address)")
	fs.DurationVar(&o.ttl, "consul-session-ttl", 10*time.Second, "TTL of the router's Consul sessions (registration, leader lock); at least 10s, Consul's minimum")
	fs.StringVar(&o.user, "mysql-user", "root", "MySQL user for the instances discovered in Consul")
	fs.StringVar(&o.password, "mysql-password", os.Getenv("SHARDMQ_MYSQL_PASSWORD"), "MySQL password (default $SHARDMQ_MYSQL_PASSWORD)")
	fs.StringVar(&o.database, "mysql-database", "shardmq", "MySQL database on every instance")
	fs.StringVar(&o.params, "mysql-params", "", "extra DSN parameters in query form, e.g. tls=custom&timeout=2s")
	return o
}

// onConsul is a router's presence in Consul: its registration (publishing
// the applied shard-map version) and its campaign for the background-job
// lock.
type onConsul struct {
	reg    topology.Registration
	leader topology.Leader
	router atomic.Pointer[server.Router]
}

// setup points cfg at Consul and registers the router before it loads the
// topology, so that no barrier passes while it starts. It returns nil when
// -consul-addr is not set.
func (o *consulOptions) setup(ctx context.Context, cfg *server.Config, listen string) (*onConsul, error) {
	if o.addr == "" {
		return nil, nil
	}
	params := map[string]string{}
	q, err := url.ParseQuery(o.params)
	if err != nil {
		return nil, fmt.Errorf("-mysql-params: %w", err)
	}
	for k := range q {
		params[k] = q.Get(k)
	}
	if o.ttl < 10*time.Second {
		return nil, fmt.Errorf("-consul-session-ttl %s: Consul's minimum is 10s", o.ttl)
	}
	host, _ := os.Hostname()
	src, err := consul.New(consul.Config{
		Address: o.addr, Prefix: o.prefix, Service: o.service, SessionTTL: o.ttl, Log: cfg.Log,
		Instance: host + " " + listen,
		DSN:      consul.DSN{User: o.user, Password: o.password, Database: o.database, Params: params},
	})
	if err != nil {
		return nil, err
	}
	id := o.routerID
	if id == "" {
		id = host + "-" + cfg.Listen
	}
	// The registration must outlive the signal that stops the router: the
	// resharding barrier counts this router only while it is registered,
	// and it still commits queued and in-flight writes after SIGTERM. The
	// deferred stop, after the router closed, removes it.
	reg, err := src.Register(context.WithoutCancel(ctx), id)
	if err != nil {
		return nil, err
	}
	c := &onConsul{reg: reg, leader: src.Leader(id)}
	if sf, ok := reg.(topology.SelfFencer); ok {
		cfg.SelfFence = sf
	}
	cfg.Source = topology.Publishing(src, reg, func() *routing.Map {
		if r := c.router.Load(); r != nil {
			return r.AppliedShardMap()
		}
		return nil
	})
	cfg.Subscriptions = src.Subscriptions()
	cfg.MirrorSubscriptions = true
	cfg.Leader = c.leader
	cfg.Backend = src
	cfg.ReshardState = src.ReshardState()
	cfg.Log.Info("router on consul", "consul", o.addr, "prefix", src.Prefix(), "service", o.service, "router_id", id)
	return c, nil
}

// serving publishes the router's first shard-map version and starts the
// leader campaign.
func (c *onConsul) serving(ctx context.Context, r *server.Router) {
	if c == nil {
		return
	}
	c.router.Store(r)
	topology.PublishMap(c.reg, r.AppliedShardMap())
	c.leader.Start(ctx)
}

// stop resigns the lock and deregisters the router.
func (c *onConsul) stop() {
	if c == nil {
		return
	}
	c.leader.Stop()
	c.reg.Stop()
}
