// Package recovery is shard-map recovery in one place: it rebuilds a
// shard map that the topology store lost from what the clusters
// themselves recorded (the vshard_owner table, store.VShardOwners), checks
// it against what the live routers report, writes it above every version
// in sight, and keeps seeds above the records (docs/consul.md, Recovery).
// cmd/consul-seed runs it. The records are written by the routers
// (server's map recorder) and by resharding jobs; their SQL is in
// store/vshard_owner.go.
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
	records := map[string][]store.VShardOwner{}
	var unread []error
	for _, name := range names {
		rows, from, err := readOwners(ctx, top.Clusters[name])
		if err != nil {
			unread = append(unread, fmt.Errorf("cluster %s: %w", name, err))
			fmt.Fprintf(info, "cluster %s: no record read: %v\n", name, err)
			continue
		}
		fmt.Fprintf(info, "cluster %s: record read from %s\n", name, from)
		if len(rows) > 0 {
			records[name] = rows
		}
	}
	if len(unread) > 0 && !force {
		return nil, fmt.Errorf("recover: %w (every cluster must answer, or pass -force)", errors.Join(unread...))
	}
	rb, err := Rebuild(records, top.Map)
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	for _, n := range rb.Notes {
		fmt.Fprintln(info, n)
	}
	m, err := RecoverMap(ctx, src, rb, force)
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

// RecoverMap writes rb, a shard map rebuilt from the clusters' own
// records (Rebuild), after the topology store lost or rolled back its
// map. The version written is above the stored map's, above every live
// router's and above every record, so that every router takes it. Unless
// force is set it first checks that the live routers route as the
// rebuilt map does (CheckRebuilt), so that recovering moves no vshard
// under a running router.
func RecoverMap(ctx context.Context, s *consul.Source, rb *Rebuilt, force bool) (*routing.Map, error) {
	applied, err := s.Applied(ctx)
	if err != nil {
		return nil, err
	}
	if !force {
		if err := CheckRebuilt(rb, applied); err != nil {
			return nil, err
		}
	}
	var stored int64
	switch cur, err := s.ShardMap(ctx); {
	case err == nil:
		stored = cur.Version()
	case errors.Is(err, topology.ErrInvalid):
	default:
		return nil, err
	}
	next, err := routing.NewMap(max(topology.NextVersion(stored, applied), rb.Newest+1), rb.Ranges, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	if err := s.UpdateShardMap(ctx, stored, next); err != nil {
		return nil, fmt.Errorf("write recovered shard map: %w", err)
	}
	return next, nil
}
