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

// Weights tells the planner how heavy each vshard is (vshards absent
// weigh 1). nil weighs every vshard 1: the plan balances vshard counts.
type Weights map[uint16]float64

func (w Weights) of(v shard.ID) float64 {
	if x, ok := w[uint16(v)]; ok && x > 0 {
		return x
	}
	return 1
}

// PlanAdd gives the cluster target an even share of the weight (the total
// divided by the owning clusters plus target) with the fewest moves: it
// takes from the cluster that carries the most, its highest vshard first
// (so the ranges stay contiguous), and stops before a vshard would
// overshoot the share by more than half its weight. The answer is explicit
// ranges for Plan.
func PlanAdd(m *routing.Map, target string, w Weights) []Range {
	load := map[string]float64{}
	owned := map[string][]shard.ID{}
	total := 0.0
	for _, c := range m.Clusters() {
		owned[c] = m.VShards(c)
		for _, v := range owned[c] {
			load[c] += w.of(v)
		}
		total += load[c]
	}
	n := len(load)
	if _, ok := load[target]; !ok {
		n++
	}
	share := total / float64(n)
	var vs []int
	for {
		donor := ""
		for c := range owned {
			if c == target || len(owned[c]) == 0 {
				continue
			}
			if donor == "" || load[c] > load[donor] || (load[c] == load[donor] && c < donor) {
				donor = c
			}
		}
		if donor == "" {
			break
		}
		last := owned[donor][len(owned[donor])-1]
		wt := w.of(last)
		if load[target]+wt/2 > share || load[donor]-wt/2 < share {
			break
		}
		owned[donor] = owned[donor][:len(owned[donor])-1]
		load[donor] -= wt
		load[target] += wt
		vs = append(vs, int(last))
	}
	return toRanges(vs, target)
}

// PlanDrain moves every vshard of cluster from to the other owning
// clusters (or targets, when given): its vshards in order, cut into one
// contiguous part per target of about equal weight.
func PlanDrain(m *routing.Map, from string, targets []string, w Weights) []Range {
	if len(targets) == 0 {
		for _, c := range m.Clusters() {
			if c != from {
				targets = append(targets, c)
			}
		}
	}
	vs := m.VShards(from)
	if len(targets) == 0 || len(vs) == 0 {
		return nil
	}
	total := 0.0
	for _, v := range vs {
		total += w.of(v)
	}
	var out []Range
	i, acc := 0, 0.0
	for k, t := range targets {
		var part []int
		limit := total * float64(k+1) / float64(len(targets))
		for i < len(vs) && (k == len(targets)-1 || acc+w.of(vs[i])/2 <= limit || len(part) == 0) {
			acc += w.of(vs[i])
			part = append(part, int(vs[i]))
			i++
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
