// Package routing answers "which cluster serves this vshard": the shard map
// as an immutable value, swapped atomically when the topology changes.
package routing

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/shardmq/shardmq/shard"
)

// State is the serving state of one vshard.
type State uint8

const (
	// Serving vshards take reads and writes on their owning cluster.
	Serving State = iota
	// Frozen vshards are in a resharding cut-over: requests are held for a
	// bounded time and then answered unavailable.
	Frozen
)

func (s State) String() string {
	if s == Frozen {
		return "frozen"
	}
	return "serving"
}

// Range assigns the vshards From..To (inclusive) to a cluster.
type Range struct {
	From    int    `json:"from" yaml:"from"`
	To      int    `json:"to" yaml:"to"`
	Cluster string `json:"cluster" yaml:"cluster"`
	Frozen  bool   `json:"frozen,omitempty" yaml:"frozen,omitempty"`
}

// Map is an immutable shard map: every vshard has exactly one cluster.
// Build one with NewMap; never modify it after, share it freely.
type Map struct {
	version  int64
	owner    [shard.Count]string
	state    [shard.Count]State
	clusters []string
}

// RangeError says which range of a shard map is wrong, by index.
type RangeError struct {
	Index int // index in the ranges list, -1 when the error is about the whole map
	Msg   string
}

func (e *RangeError) Error() string {
	if e.Index < 0 {
		return "shard map: " + e.Msg
	}
	return fmt.Sprintf("shard map: ranges[%d]: %s", e.Index, e.Msg)
}

// NewMap validates ranges and builds a map. Every vshard 0..1023 must be
// assigned exactly once to a cluster listed in known (when known is not
// nil). Errors are *RangeError so that file loaders can add line numbers.
func NewMap(version int64, ranges []Range, known map[string]bool) (*Map, error) {
	m := &Map{version: version}
	assigned := [shard.Count]int{}
	for i := range assigned {
		assigned[i] = -1
	}
	seen := map[string]bool{}
	for i, r := range ranges {
		switch {
		case r.Cluster == "":
			return nil, &RangeError{i, "cluster is empty"}
		case known != nil && !known[r.Cluster]:
			return nil, &RangeError{i, fmt.Sprintf("unknown cluster %q", r.Cluster)}
		case r.From < 0 || r.To >= shard.Count:
			return nil, &RangeError{i, fmt.Sprintf("range %d-%d outside 0-%d", r.From, r.To, shard.Count-1)}
		case r.From > r.To:
			return nil, &RangeError{i, fmt.Sprintf("from %d is greater than to %d", r.From, r.To)}
		}
		for v := r.From; v <= r.To; v++ {
			if prev := assigned[v]; prev >= 0 {
				return nil, &RangeError{i, fmt.Sprintf("vshard %d is also assigned by ranges[%d]", v, prev)}
			}
			assigned[v] = i
			m.owner[v] = r.Cluster
			if r.Frozen {
				m.state[v] = Frozen
			}
		}
		if !seen[r.Cluster] {
			seen[r.Cluster] = true
			m.clusters = append(m.clusters, r.Cluster)
		}
	}
	var missing []string
	for v := 0; v < shard.Count; v++ {
		if assigned[v] < 0 {
			start := v
			for v+1 < shard.Count && assigned[v+1] < 0 {
				v++
			}
			if start == v {
				missing = append(missing, fmt.Sprint(start))
			} else {
				missing = append(missing, fmt.Sprintf("%d-%d", start, v))
			}
		}
	}
	if len(missing) > 0 {
		return nil, &RangeError{-1, "vshards not assigned to any cluster: " + strings.Join(missing, ", ")}
	}
	sort.Strings(m.clusters)
	return m, nil
}

// Version is the shard map's version; it only grows.
func (m *Map) Version() int64 { return m.version }

// Lookup returns the cluster that owns v and v's state.
func (m *Map) Lookup(v shard.ID) (cluster string, state State) {
	return m.owner[v], m.state[v]
}

// Clusters lists the clusters that own at least one vshard, sorted.
func (m *Map) Clusters() []string { return append([]string(nil), m.clusters...) }

// VShards lists the vshards a cluster owns, ascending.
func (m *Map) VShards(cluster string) []shard.ID {
	var out []shard.ID
	for v := 0; v < shard.Count; v++ {
		if m.owner[v] == cluster {
			out = append(out, shard.ID(v))
		}
	}
	return out
}

// Ranges returns the map as contiguous ranges (same cluster and state).
func (m *Map) Ranges() []Range {
	var out []Range
	for v := 0; v < shard.Count; v++ {
		r := Range{From: v, To: v, Cluster: m.owner[v], Frozen: m.state[v] == Frozen}
		for v+1 < shard.Count && m.owner[v+1] == r.Cluster && (m.state[v+1] == Frozen) == r.Frozen {
			v++
		}
		r.To = v
		out = append(out, r)
	}
	return out
}

// FrozenVShards lists the vshards in a cut-over (state Frozen), ascending;
// nil when none is.
func (m *Map) FrozenVShards() []uint16 {
	var out []uint16
	for v := 0; v < shard.Count; v++ {
		if m.state[v] == Frozen {
			out = append(out, uint16(v))
		}
	}
	return out
}

// With returns a copy of m at version: the vshards listed go to cluster
// (when cluster is not empty) and take state.
func (m *Map) With(version int64, vshards []shard.ID, cluster string, state State) (*Map, error) {
	owner, st := m.owner, m.state
	for _, v := range vshards {
		if int(v) >= shard.Count {
			return nil, &RangeError{-1, fmt.Sprintf("vshard %d outside 0-%d", v, shard.Count-1)}
		}
		if cluster != "" {
			owner[v] = cluster
		}
		st[v] = state
	}
	n := &Map{version: version, owner: owner, state: st}
	seen := map[string]bool{}
	for _, c := range owner {
		if !seen[c] {
			seen[c] = true
			n.clusters = append(n.clusters, c)
		}
	}
	sort.Strings(n.clusters)
	return n, nil
}

// Table holds the current map. Readers take a snapshot with Load and use it
// for a whole request, so one request never sees two maps.
type Table struct {
	cur atomic.Pointer[Map]

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when the map changes
}

// NewTable returns a table holding m.
func NewTable(m *Map) *Table {
	t := &Table{changed: make(chan struct{})}
	t.cur.Store(m)
	return t
}

// Changed returns a channel closed at the next change of the map: a
// request held on a frozen vshard waits on it instead of polling.
func (t *Table) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil { // a zero Table
		t.changed = make(chan struct{})
	}
	return t.changed
}

// Load returns the current map.
func (t *Table) Load() *Map { return t.cur.Load() }

// Store swaps in m if its version is not older than the current one, and
// reports whether it did: a late-arriving stale map must never win.
func (t *Table) Store(m *Map) bool {
	for {
		old := t.cur.Load()
		if old != nil && m.version < old.version {
			return false
		}
		if t.cur.CompareAndSwap(old, m) {
			if old != m {
				t.mu.Lock()
				if t.changed != nil {
					close(t.changed)
				}
				t.changed = make(chan struct{})
				t.mu.Unlock()
			}
			return true
		}
	}
}
