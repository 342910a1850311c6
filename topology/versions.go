package topology

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/shardmq/shardmq/routing"
)

// Shard-map versions only grow. A router never applies a map older than
// the one it routes with, so a map written under a version that a live
// router has already passed would never reach that router while every new
// router took it: two routers would send one vshard to two clusters. Hence
// the one rule every writer of the map (consul-seed, the admin API, the
// resharding job) follows, through NextVersion or WriteShardMap:
//
//	next version > max(stored version, every live router's applied version)
//
// Backends enforce it in UpdateShardMap (ErrBehind), and a starting router
// refuses a stored map that live routers are already past (CheckStored).
// Right after the topology store lost its data the live routers are
// invisible until they register again (milliseconds, at most a third of
// the session TTL); the clusters' own record of the map (vshard_owner,
// written by every router before it routes with a map) covers that
// window: writers that can read it pass its newest version as a floor
// (WriteShardMapAbove, consul-seed), and a router on Consul refuses to
// start on a map older than it.

// AppliedMap is what one live router reports routing with.
type AppliedMap struct {
	Router  string
	Version int64
	// Digest is routing.Map.Digest of the applied map; empty when the
	// router did not report one.
	Digest string
}

// ErrBehind marks a shard map whose version is not above what a live
// router has applied: written, it would split routing.
var ErrBehind = errors.New("shard map version behind the live routers")

// MapPublisher is implemented by registrations that publish the applied
// map's digest beside its version.
type MapPublisher interface {
	PublishMap(m *routing.Map)
}

// PublishMap publishes m on reg: version and digest when reg takes both.
func PublishMap(reg Registration, m *routing.Map) {
	if m == nil {
		return
	}
	if p, ok := reg.(MapPublisher); ok {
		p.PublishMap(m)
		return
	}
	reg.Publish(m.Version())
}

// HighestApplied returns the highest version among applied and the
// routers at it.
func HighestApplied(applied []AppliedMap) (int64, []string) {
	var top int64
	var who []string
	for _, a := range applied {
		switch {
		case a.Version > top:
			top, who = a.Version, []string{a.Router}
		case a.Version == top && top > 0:
			who = append(who, a.Router)
		}
	}
	sort.Strings(who)
	return top, who
}

// NextVersion is the version a writer gives the map that replaces the
// stored one (version stored, 0 when none): above it and above every
// version a live router applied.
func NextVersion(stored int64, applied []AppliedMap) int64 {
	top, _ := HighestApplied(applied)
	return max(stored, top) + 1
}

// CheckAbove refuses next when a live router has applied its version or a
// later one (ErrBehind). UpdateShardMap calls it with the registrations it
// reads, so a writer that skipped NextVersion cannot split routing.
func CheckAbove(next *routing.Map, applied []AppliedMap) error {
	if top, who := HighestApplied(applied); next.Version() <= top {
		return fmt.Errorf("%w: new version %d is not above version %d applied by %s (compute it with topology.NextVersion)",
			ErrBehind, next.Version(), top, strings.Join(who, ", "))
	}
	return nil
}

// RecoveryHint is how an operator recovers when the topology store lost
// or rolled back its shard map; errors that stop a router say it.
const RecoveryHint = "the topology store lost or rolled back its shard map: rebuild it with `consul-seed -recover` (see docs/consul.md, Recovery), or write a map whose version is above every live router's"

// CheckStored is the start-up check of a router: the stored map m must
// not be older than a map a live router applied, nor a different map
// under the same version. Either would make this router route some
// vshards differently from those routers, for good.
func CheckStored(m *routing.Map, applied []AppliedMap) error {
	var older, rewritten []string
	for _, a := range applied {
		switch {
		case a.Version > m.Version():
			older = append(older, fmt.Sprintf("%s at %d", a.Router, a.Version))
		case a.Version == m.Version() && a.Digest != "" && a.Digest != m.Digest():
			rewritten = append(rewritten, a.Router)
		}
	}
	sort.Strings(older)
	sort.Strings(rewritten)
	switch {
	case len(older) > 0:
		return fmt.Errorf("%w: stored shard map version %d is older than what live routers apply (%s); %s",
			ErrBehind, m.Version(), strings.Join(older, ", "), RecoveryHint)
	case len(rewritten) > 0:
		return fmt.Errorf("%w: stored shard map version %d differs from the map of that version applied by %s; %s",
			ErrBehind, m.Version(), strings.Join(rewritten, ", "), RecoveryHint)
	}
	return nil
}

// WriteShardMap is how every writer changes the shard map: it reads the
// stored map (nil when none or an invalid one is stored), asks change for
// the new ranges, gives them NextVersion and writes them with
// check-and-set, reading again and calling change again when another
// writer or a router moved meanwhile (up to 5 times). It returns the map
// written.
func WriteShardMap(ctx context.Context, b Backend, change func(cur *routing.Map) ([]routing.Range, error)) (*routing.Map, error) {
	return WriteShardMapAbove(ctx, b, 0, change)
}

// WriteShardMapAbove is WriteShardMap with a floor: the version written
// is also above floor. A writer that can read the clusters' own record of
// the map (store.VShardOwners: consul-seed, or a job inside a router)
// passes the newest version recorded there, which outlives a topology
// store that lost its data while the routers had not registered again.
func WriteShardMapAbove(ctx context.Context, b Backend, floor int64, change func(cur *routing.Map) ([]routing.Range, error)) (*routing.Map, error) {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := b.ShardMap(ctx)
		var stored int64
		switch {
		case err == nil:
			stored = cur.Version()
		case errors.Is(err, ErrInvalid):
			cur = nil // nothing valid stored: the write creates the map
		default:
			return nil, err
		}
		applied, err := b.Applied(ctx)
		if err != nil {
			return nil, err
		}
		ranges, err := change(cur)
		if err != nil {
			return nil, err
		}
		next, err := routing.NewMap(max(NextVersion(stored, applied), floor+1), ranges, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		err = b.UpdateShardMap(ctx, stored, next)
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, ErrConflict) && !errors.Is(err, ErrBehind) {
			return nil, err
		}
		last = err
	}
	return nil, fmt.Errorf("write shard map: %w", last)
}
