// Package recovery rebuilds a shard map that the topology store lost from
// what the clusters themselves recorded (store.VShardOwners) and what the
// live routers report, and keeps seeds above both (docs/consul.md,
// Recovery). cmd/consul-seed runs it.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
	"github.com/shardmq/shardmq/topology/consul"
)

// Recover rebuilds the shard map from the vshard_owner record of every
// cluster of top (read from its primary, else from a replica: the table
// replicates), checks it against the live routers and writes it above
// every version in sight. Vshards that no cluster recorded follow top's
// map. Every cluster must answer, and the live routers must route as the
// records say, unless force is set. It reports on info and returns the
// map written.
func Recover(ctx context.Context, top *topology.Topology, src *consul.Source, force bool, info io.Writer) (*routing.Map, error) {
	names := sortedNames(top)
	records := map[string][]topology.OwnerRecord{}
	var unread []error
	for _, name := range names {
		rows, from, err := readOwners(ctx, top.Clusters[name])
		if err != nil {
			unread = append(unread, fmt.Errorf("cluster %s: %w", name, err))
			fmt.Fprintf(info, "cluster %s: no record read: %v\n", name, err)
			continue
		}
		fmt.Fprintf(info, "cluster %s: record read from %s\n", name, from)
		for _, r := range rows {
			records[name] = append(records[name], topology.OwnerRecord{VShard: r.VShard, Cluster: r.Cluster, Version: r.MapVersion, Frozen: r.Frozen})
		}
	}
	if len(unread) > 0 && !force {
		return nil, fmt.Errorf("recover: %w (every cluster must answer, or pass -force)", errors.Join(unread...))
	}
	rb, err := topology.Rebuild(records, top.Map)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	for _, n := range rb.Notes {
		fmt.Fprintln(info, n)
	}
	m, err := consul.RecoverMap(ctx, src, rb, force)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	fmt.Fprintf(info, "recovered shard map (newest record version %d) stored as version %d at %sshardmap\n", rb.Newest, m.Version(), src.Prefix())
	return m, nil
}

// readOwners reads a cluster's record from its primary, else from the
// first replica that answers.
func readOwners(ctx context.Context, c topology.Cluster) ([]store.VShardOwner, string, error) {
	var errs []error
	for _, dsn := range append([]string{c.Primary}, c.Replicas...) {
		st, err := store.Open(ctx, dsn, store.Options{MaxOpen: 2})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rows, err := st.VShardOwners(ctx)
		st.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return rows, redact(dsn), nil
	}
	return nil, "", errors.Join(errs...)
}

// redact drops the password from a DSN for display.
func redact(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "?"
	}
	return cfg.User + "@" + cfg.Net + "(" + cfg.Addr + ")/" + cfg.DBName
}

// AboveRecords returns the file's map, its version raised above the
// newest version any cluster recorded (store.VShardOwners): right after
// the topology store lost its data the live routers have not registered
// again yet, and the clusters' record is what remembers how far they
// went. A cluster that cannot be read within 2s is skipped.
func AboveRecords(ctx context.Context, top *topology.Topology, info io.Writer) (*routing.Map, error) {
	var newest int64
	for _, name := range sortedNames(top) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rows, _, err := readOwners(rctx, top.Clusters[name])
		cancel()
		if err != nil {
			fmt.Fprintf(info, "cluster %s: record not read (%v); its versions are not taken into account\n", name, err)
			continue
		}
		for _, r := range rows {
			newest = max(newest, r.MapVersion)
		}
	}
	if newest < top.Map.Version() {
		return top.Map, nil
	}
	fmt.Fprintf(info, "the clusters recorded shard map version %d: the file's map is written above it\n", newest)
	m, err := routing.NewMap(newest+1, top.Map.Ranges(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	return m, nil
}

func sortedNames(top *topology.Topology) []string {
	names := make([]string, 0, len(top.Clusters))
	for n := range top.Clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
