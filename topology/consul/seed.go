package consul

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/topology"
)

// SeedMap stores m, the shard map of a static topology, as the first map
// in Consul. When a map is already stored it is refused with
// *topology.ConflictError unless replace is set; so is a store without a
// map while live routers report one applied (the store lost its data:
// recover with internal/recovery, or force with replace). The version
// written is m's, raised to topology.NextVersion when that is higher, so
// that it is above the stored map and above every map a live router
// applied. It returns the version written.
func SeedMap(ctx context.Context, s *Source, m *routing.Map, replace bool) (int64, error) {
	for attempt := 0; ; attempt++ {
		v, err := seedOnce(ctx, s, m, replace)
		if err == nil || attempt == 4 || !replace || !errors.Is(err, topology.ErrConflict) && !errors.Is(err, topology.ErrBehind) {
			return v, err
		}
	}
}

func seedOnce(ctx context.Context, s *Source, m *routing.Map, replace bool) (int64, error) {
	cur, err := s.ShardMap(ctx)
	var prev int64
	switch {
	case err == nil:
		prev = cur.Version()
	case errors.Is(err, topology.ErrInvalid):
		prev = 0 // nothing (valid) stored
	default:
		return 0, err
	}
	applied, err := s.Applied(ctx)
	if err != nil {
		return 0, err
	}
	if prev > 0 && !replace {
		return 0, &topology.ConflictError{Want: 0, Have: prev}
	}
	if top, who := topology.HighestApplied(applied); prev == 0 && top > 0 && !replace {
		return 0, fmt.Errorf("%w: no shard map stored, but live routers apply version %d (%s): the store lost its data; rebuild the map with -recover, or write the file's map above theirs with -replace",
			topology.ErrConflict, top, strings.Join(who, ", "))
	}
	next := m
	if v := topology.NextVersion(prev, applied); m.Version() < v {
		if next, err = routing.NewMap(v, m.Ranges(), nil); err != nil {
			return 0, err
		}
	}
	if err := s.UpdateShardMap(ctx, prev, next); err != nil {
		return 0, err
	}
	return next.Version(), nil
}

// ServiceDefinitions returns the Consul service registration of every
// instance of a static topology, named service, with meta cluster and role
// and a TCP check on the MySQL port, as each instance's Consul agent would
// register it.
func ServiceDefinitions(top *topology.Topology, service string) ([]*api.AgentServiceRegistration, error) {
	var out []*api.AgentServiceRegistration
	clusters := make([]topology.Cluster, 0, len(top.Clusters)+1)
	for _, name := range sortedClusters(top) {
		clusters = append(clusters, top.Clusters[name])
	}
	if top.Archive != nil {
		// The archive cluster is found by its cluster meta (buildLocked).
		clusters = append(clusters, *top.Archive)
	}
	for _, c := range clusters {
		name := c.Name
		dsns := append([]string{c.Primary}, c.Replicas...)
		for i, dsn := range dsns {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				return nil, fmt.Errorf("cluster %s: %w", name, err)
			}
			host, port, err := net.SplitHostPort(cfg.Addr)
			if err != nil {
				return nil, fmt.Errorf("cluster %s: address %q: %w", name, cfg.Addr, err)
			}
			p, err := strconv.Atoi(port)
			if err != nil {
				return nil, fmt.Errorf("cluster %s: port %q: %w", name, port, err)
			}
			role, id := RolePrimary, service+"-"+name+"-primary"
			if i > 0 {
				role, id = RoleReplica, fmt.Sprintf("%s-%s-replica%d", service, name, i)
			}
			out = append(out, &api.AgentServiceRegistration{
				ID: id, Name: service, Address: host, Port: p,
				Meta: map[string]string{MetaCluster: name, MetaRole: role},
				Check: &api.AgentServiceCheck{
					Name: "mysql port", TCP: cfg.Addr, Interval: "5s", Timeout: "2s",
					Status: api.HealthPassing,
				},
			})
		}
	}
	return out, nil
}

// ServiceConfig is one instance's service definition in the format of a
// Consul agent's configuration files (`consul validate` accepts a file of
// {"service": ServiceConfig} or {"services": [ServiceConfig, …]}).
type ServiceConfig struct {
	ID      string            `json:"id"`
	Name    string            `json:"name"`
	Address string            `json:"address"`
	Port    int               `json:"port"`
	Meta    map[string]string `json:"meta"`
	Checks  []CheckConfig     `json:"checks"`
}

// CheckConfig is a service check in an agent's configuration files.
type CheckConfig struct {
	Name     string `json:"name"`
	TCP      string `json:"tcp"`
	Interval string `json:"interval"`
	Timeout  string `json:"timeout"`
	// Status is the check's state until its first run.
	Status string `json:"status,omitempty"`
}

// ServiceConfigs turns registrations (ServiceDefinitions) into agent
// configuration-file definitions.
func ServiceConfigs(defs []*api.AgentServiceRegistration) []ServiceConfig {
	out := make([]ServiceConfig, 0, len(defs))
	for _, d := range defs {
		c := ServiceConfig{ID: d.ID, Name: d.Name, Address: d.Address, Port: d.Port, Meta: d.Meta, Checks: []CheckConfig{}}
		checks := append(api.AgentServiceChecks(nil), d.Checks...)
		if d.Check != nil {
			checks = append(api.AgentServiceChecks{d.Check}, checks...)
		}
		for _, ch := range checks {
			c.Checks = append(c.Checks, CheckConfig{Name: ch.Name, TCP: ch.TCP, Interval: ch.Interval, Timeout: ch.Timeout, Status: ch.Status})
		}
		out = append(out, c)
	}
	return out
}

func sortedClusters(top *topology.Topology) []string {
	names := make([]string, 0, len(top.Clusters))
	for n := range top.Clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
