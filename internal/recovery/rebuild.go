package recovery

import (
	"fmt"
	"sort"
	"strings"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// Rebuilt is a shard map put back together from the clusters' records.
type Rebuilt struct {
	// Ranges assign every vshard.
	Ranges []routing.Range
	// Newest is the highest version any record holds; the rebuilt map
	// equals that version's map when every vshard was taken from it.
	Newest int64
	// FromFallback counts the vshards no cluster had a record of, taken
	// from the fallback map.
	FromFallback int
	// Notes say what was found, for the operator.
	Notes []string
}

// Rebuild puts the shard map back together from the records of every
// cluster that answered (cluster name → its vshard_owner rows): each vshard goes to
// the owner in the highest version recorded for it anywhere. Two records
// of one version naming different owners mean that version was rewritten
// by hand: Rebuild refuses, naming the vshard. Vshards nobody recorded take
// fallback's owner (a static file's map, say); without a fallback they
// are an error.
func Rebuild(records map[string][]store.VShardOwner, fallback *routing.Map) (*Rebuilt, error) {
	type best struct {
		rec store.VShardOwner
		by  string // the cluster whose record it is
	}
	var top [shard.Count]*best
	names := make([]string, 0, len(records))
	for n := range records {
		names = append(names, n)
	}
	sort.Strings(names)
	out := &Rebuilt{}
	for _, by := range names {
		var newest int64
		for _, r := range records[by] {
			if r.VShard < 0 || r.VShard >= shard.Count {
				return nil, fmt.Errorf("%w: cluster %s records vshard %d", topology.ErrInvalid, by, r.VShard)
			}
			newest = max(newest, r.MapVersion)
			b := top[r.VShard]
			switch {
			case b == nil || r.MapVersion > b.rec.MapVersion:
				top[r.VShard] = &best{rec: r, by: by}
			case r.MapVersion == b.rec.MapVersion && r.Cluster != b.rec.Cluster:
				return nil, fmt.Errorf("%w: vshard %d has two owners in version %d: %s (recorded by %s) and %s (recorded by %s); the map was rewritten under one version",
					topology.ErrInvalid, r.VShard, r.MapVersion, b.rec.Cluster, b.by, r.Cluster, by)
			}
		}
		out.Notes = append(out.Notes, fmt.Sprintf("cluster %s: %d vshards recorded, newest version %d", by, len(records[by]), newest))
		out.Newest = max(out.Newest, newest)
	}
	var missing []string
	for v := 0; v < shard.Count; v++ {
		b := top[v]
		if b != nil {
			out.Ranges = append(out.Ranges, routing.Range{From: v, To: v, Cluster: b.rec.Cluster, Frozen: b.rec.Frozen})
			continue
		}
		if fallback == nil {
			missing = append(missing, fmt.Sprint(v))
			continue
		}
		c, st := fallback.Lookup(shard.ID(v))
		out.Ranges = append(out.Ranges, routing.Range{From: v, To: v, Cluster: c, Frozen: st == routing.Frozen})
		out.FromFallback++
	}
	if len(missing) > 0 {
		if len(missing) > 10 {
			missing = append(missing[:10], "…")
		}
		return nil, fmt.Errorf("%w: no cluster recorded an owner of %d vshards (%s) and there is no fallback map", topology.ErrInvalid, shard.Count-len(out.Ranges), strings.Join(missing, ", "))
	}
	m, err := routing.NewMap(max(out.Newest, 1), out.Ranges, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	out.Ranges = m.Ranges() // merged into contiguous ranges
	if out.FromFallback > 0 {
		out.Notes = append(out.Notes, fmt.Sprintf("%d vshards had no record and follow the fallback map", out.FromFallback))
	}
	return out, nil
}

// CheckRebuilt compares a rebuilt map with what live routers apply: a
// router ahead of every record, or at the newest recorded version with
// another map, routes differently from the rebuilt map, and writing it
// would move those vshards under that router's feet. The error says who.
func CheckRebuilt(rb *Rebuilt, applied []topology.AppliedMap) error {
	m, err := routing.NewMap(max(rb.Newest, 1), rb.Ranges, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", topology.ErrInvalid, err)
	}
	var problems []string
	for _, a := range applied {
		switch {
		case a.Version > rb.Newest:
			problems = append(problems, fmt.Sprintf("router %s applies version %d, newer than every record (%d): wait until it has recorded its map on the clusters (it retries every second), or check that its clusters are reachable", a.Router, a.Version, rb.Newest))
		case a.Version == rb.Newest && a.Digest != "" && a.Digest != m.Digest():
			problems = append(problems, fmt.Sprintf("router %s applies another map under version %d than the clusters recorded", a.Router, a.Version))
		}
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("%w: %s", topology.ErrBehind, strings.Join(problems, "; "))
	}
	return nil
}
