// Package rebalance moves vshards between clusters while they serve
// (DESIGN §7): a planner that says which vshards go where, and a job — a
// resumable state machine recorded in the topology store — that copies the
// vshards' rows, freezes them, copies the last changes, verifies counts and
// checksums, flips the shard map with check-and-set and deletes the source
// rows. docs/resharding.md describes the states and the failure cases.
package rebalance

import (
	"errors"
	"fmt"
	"sort"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
)

// Range asks to move vshards From..To (inclusive) to cluster Target.
type Range struct {
	From   int    `json:"from"`
	To     int    `json:"to"`
	Target string `json:"target"`
}

// Errors callers match with errors.Is.
var (
	// ErrInvalid: the request cannot be planned (overlapping or
	// out-of-range ranges, unknown target, vshards the target owns).
	ErrInvalid = errors.New("invalid reshard request")
	// ErrBusy: another job that is not finished moves some of the vshards.
	ErrBusy = errors.New("vshards are being moved by another job")
	// ErrNotFound: no such job.
	ErrNotFound = errors.New("no such reshard job")
	// ErrState: the job cannot do that in its state (abort after the flip,
	// resume of a job that is not paused).
	ErrState = errors.New("not possible in the job's state")
)

// Move is the part of a job that goes from one source cluster to one
// target: the unit that rows are copied and verified by.
type Move struct {
	Source  string   `json:"source"`
	Target  string   `json:"target"`
	VShards []uint16 `json:"vshards"`
}

// Plan checks ranges against the shard map m and the known clusters, and
// groups the vshards by source and target. busy holds the vshards of jobs
// not yet finished (ErrBusy when one is asked for again).
func Plan(ranges []Range, m *routing.Map, known map[string]bool, busy map[uint16]string) ([]Move, error) {
	if len(ranges) == 0 {
		return nil, fmt.Errorf("%w: ranges must hold at least one range", ErrInvalid)
	}
	owner := map[uint16]int{}
	for i, r := range ranges {
		switch {
		case r.From < 0 || r.To >= shard.Count || r.From > r.To:
			return nil, fmt.Errorf("%w: ranges[%d]: %d-%d is not a range within 0-%d", ErrInvalid, i, r.From, r.To, shard.Count-1)
		case r.Target == "":
			return nil, fmt.Errorf("%w: ranges[%d]: target is required", ErrInvalid, i)
		case !known[r.Target]:
			return nil, fmt.Errorf("%w: ranges[%d]: unknown target cluster %q", ErrInvalid, i, r.Target)
		}
		for v := r.From; v <= r.To; v++ {
			if j, ok := owner[uint16(v)]; ok {
				return nil, fmt.Errorf("%w: ranges[%d] overlaps ranges[%d] at vshard %d", ErrInvalid, i, j, v)
			}
			owner[uint16(v)] = i
			if c, _ := m.Lookup(shard.ID(v)); c == r.Target {
				return nil, fmt.Errorf("%w: ranges[%d]: vshard %d is already owned by %s", ErrInvalid, i, v, r.Target)
			}
		}
	}
	var taken []string
	for v := range owner {
		if job, ok := busy[v]; ok {
			taken = append(taken, fmt.Sprintf("%d (%s)", v, job))
		}
	}
	if len(taken) > 0 {
		sort.Strings(taken)
		if len(taken) > 5 {
			taken = append(taken[:5], fmt.Sprintf("and %d more", len(taken)-5))
		}
		return nil, fmt.Errorf("%w: %v", ErrBusy, taken)
	}
	groups := map[[2]string][]uint16{}
	for v, i := range owner {
		src, _ := m.Lookup(shard.ID(v))
		k := [2]string{src, ranges[i].Target}
		groups[k] = append(groups[k], v)
	}
	moves := make([]Move, 0, len(groups))
	for k, vs := range groups {
		sort.Slice(vs, func(a, b int) bool { return vs[a] < vs[b] })
		moves = append(moves, Move{Source: k[0], Target: k[1], VShards: vs})
	}
	sort.Slice(moves, func(a, b int) bool {
		if moves[a].Source != moves[b].Source {
			return moves[a].Source < moves[b].Source
		}
		return moves[a].Target < moves[b].Target
	})
	return moves, nil
}

// PlanAdd gives the cluster target an even share of the vshards (1024
// divided by the owning clusters plus target) with the fewest moves: it
// takes from the clusters owning the most, highest vshards first, so the
// ranges stay contiguous. The answer is explicit ranges for Plan.
func PlanAdd(m *routing.Map, target string) []Range {
	count := map[string]int{}
	for _, c := range m.Clusters() {
		count[c] = len(m.VShards(c))
	}
	n := len(count)
	if _, ok := count[target]; !ok {
		n++
	}
	want := shard.Count / n
	take := want - count[target]
	if take <= 0 {
		return nil
	}
	var vs []int
	owned := map[string][]shard.ID{}
	for c := range count {
		if c != target {
			owned[c] = m.VShards(c)
		}
	}
	for ; take > 0; take-- {
		// the cluster that owns the most gives one vshard
		big := ""
		for c := range owned {
			if big == "" || len(owned[c]) > len(owned[big]) || (len(owned[c]) == len(owned[big]) && c < big) {
				big = c
			}
		}
		if big == "" || len(owned[big]) <= want {
			break
		}
		last := owned[big][len(owned[big])-1]
		owned[big] = owned[big][:len(owned[big])-1]
		vs = append(vs, int(last))
	}
	return toRanges(vs, target)
}

// PlanDrain moves every vshard of cluster from to the other owning
// clusters (or targets, when given), spreading them evenly.
func PlanDrain(m *routing.Map, from string, targets []string) []Range {
	if len(targets) == 0 {
		for _, c := range m.Clusters() {
			if c != from {
				targets = append(targets, c)
			}
		}
	}
	if len(targets) == 0 {
		return nil
	}
	vs := m.VShards(from)
	per := (len(vs) + len(targets) - 1) / len(targets)
	var out []Range
	for i, t := range targets {
		lo := i * per
		hi := min(lo+per, len(vs))
		if lo >= hi {
			break
		}
		part := make([]int, 0, hi-lo)
		for _, v := range vs[lo:hi] {
			part = append(part, int(v))
		}
		out = append(out, toRanges(part, t)...)
	}
	return out
}

func toRanges(vs []int, target string) []Range {
	sort.Ints(vs)
	var out []Range
	for i := 0; i < len(vs); i++ {
		r := Range{From: vs[i], To: vs[i], Target: target}
		for i+1 < len(vs) && vs[i+1] == r.To+1 {
			i++
			r.To = vs[i]
		}
		out = append(out, r)
	}
	return out
}
