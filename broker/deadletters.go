package broker

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/store"
)

// DeadLetter is one dead delivery with its message (nil if missing).
type DeadLetter struct {
	store.DeadLetter
	Message *store.Message
}

// DeadPage is one page of a dead-letter listing, newest first.
type DeadPage struct {
	Items      []DeadLetter
	NextCursor string // empty on the last page
	// Missing names clusters that did not answer: the page lacks their
	// dead letters, and says so rather than silently returning less.
	Missing []string
}

// ListDead lists a subscription's dead letters newest first (by message
// id) across all clusters, at most limit and at most maxBytes of encoded
// answer (store.DeadLetter.Size; 0: no byte cap; the first whatever its
// size). Each cluster gives its newest page before the cursor, sized
// before any payload is read; the merge keeps the newest, and the cursor
// is the last id given, so paging is exact however the ids interleave.
func (b *Broker) ListDead(ctx context.Context, topic, sub, errorCode, cursor string, limit, maxBytes int) (DeadPage, error) {
	if _, err := b.GetSubscription(ctx, topic, sub); err != nil {
		return DeadPage{}, err
	}
	var before uint64
	if cursor != "" {
		v, err := strconv.ParseUint(cursor, 10, 64)
		if err != nil || v == 0 {
			return DeadPage{}, fmt.Errorf("%w: cursor %q", ErrBadCursor, cursor)
		}
		before = v
	}
	var mu sync.Mutex
	var all []DeadLetter
	var page DeadPage
	// bound: a cluster with more after its page could hide a dead letter
	// newer than any below its page's last id; the page ends there.
	var bound uint64
	missing, err := b.eachClusterMissing(ctx, func(ctx context.Context, name string, sh Cluster) error {
		dl, msgs, more, err := sh.ListDead(ctx, topic, sub, errorCode, before, limit, maxBytes, b.now().UTC())
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, d := range dl {
			all = append(all, DeadLetter{DeadLetter: d, Message: msgs[d.MessageID]})
		}
		if more && len(dl) > 0 {
			bound = max(bound, dl[len(dl)-1].MessageID)
		}
		return nil
	})
	page.Missing = missing
	if err != nil && len(page.Missing) == len(b.table.Load().Clusters()) {
		return DeadPage{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].MessageID > all[j].MessageID })
	used, n := 0, 0
	for n < len(all) {
		d := all[n]
		if d.MessageID < bound || n == limit || (maxBytes > 0 && n > 0 && used+d.Size > maxBytes) {
			break
		}
		used += d.Size
		n++
	}
	if n > 0 && (n < len(all) || bound != 0) {
		page.NextCursor = strconv.FormatUint(all[n-1].MessageID, 10)
	}
	page.Items = all[:n]
	return page, nil
}

// ErrBadCursor: a listing cursor this router did not give.
var ErrBadCursor = fmt.Errorf("malformed cursor")

// Redrive makes dead letters ready again with attempts reset, on every
// cluster: those with the given ids, or of one error code, or all.
func (b *Broker) Redrive(ctx context.Context, topic, sub string, ids []uint64, errorCode string) (int64, error) {
	s, err := b.GetSubscription(ctx, topic, sub)
	if err != nil {
		return 0, err
	}
	total, err := b.sumClusters(ctx, func(ctx context.Context, sh Cluster) (int64, error) {
		return sh.Redrive(ctx, store.RedriveRequest{Topic: topic, Subscription: sub, IDs: ids, ErrorCode: errorCode,
			Ordered: s.Ordered, Now: b.now().UTC()})
	})
	if total > 0 {
		b.wake.signal(topic)
	}
	return total, err
}

// DeadByCode counts, by error code and summed over every cluster, the dead
// letters that Redrive with the same arguments would make ready now,
// changing nothing: a redrive's dry run, and the page's dead letters by
// error code (no ids, no code). Clusters that did not answer are named
// in Missing, the others counted; it fails (unavailable) only when no
// cluster answered.
func (b *Broker) DeadByCode(ctx context.Context, topic, sub string, ids []uint64, errorCode string) (DeadCounts, error) {
	if _, err := b.GetSubscription(ctx, topic, sub); err != nil {
		return DeadCounts{}, err
	}
	out := DeadCounts{ByCode: map[string]int64{}}
	var mu sync.Mutex
	missing, err := b.eachClusterMissing(ctx, func(ctx context.Context, _ string, sh Cluster) error {
		m, err := sh.DeadByCode(ctx, store.RedriveRequest{Topic: topic, Subscription: sub, IDs: ids, ErrorCode: errorCode, Now: b.now().UTC()})
		if err != nil {
			return err // a cluster's part is all or nothing: no half-counted cluster
		}
		mu.Lock()
		for code, n := range m {
			out.ByCode[code] += n
		}
		mu.Unlock()
		return nil
	})
	out.Missing = missing
	if err != nil && len(missing) == len(b.table.Load().Clusters()) {
		return DeadCounts{}, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return out, nil
}

// DeadCounts are dead letters counted by error code over the clusters
// that answered; Missing names, sorted, those that did not (their dead
// letters are not counted: the sums are smaller than the truth).
type DeadCounts struct {
	ByCode  map[string]int64
	Missing []string
}

// PurgeDead deletes dead letters (of one error code, or all) everywhere.
func (b *Broker) PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error) {
	if _, err := b.GetSubscription(ctx, topic, sub); err != nil {
		return 0, err
	}
	return b.sumClusters(ctx, func(ctx context.Context, sh Cluster) (int64, error) { return sh.PurgeDead(ctx, topic, sub, errorCode) })
}

// DeleteDead deletes the dead letters with the given message ids (those
// of them that are dead letters of the subscription) everywhere and
// answers how many went.
func (b *Broker) DeleteDead(ctx context.Context, topic, sub string, ids []uint64) (int64, error) {
	if _, err := b.GetSubscription(ctx, topic, sub); err != nil {
		return 0, err
	}
	return b.sumClusters(ctx, func(ctx context.Context, sh Cluster) (int64, error) { return sh.DeleteDead(ctx, topic, sub, ids) })
}

// CountDead counts a subscription's dead letters on all clusters.
func (b *Broker) CountDead(ctx context.Context, topic, sub string) (int64, error) {
	return b.sumClusters(ctx, func(ctx context.Context, sh Cluster) (int64, error) { return sh.CountDead(ctx, topic, sub) })
}

// ArchiveDead moves dead letters that died before cutoff into the archive
// table on every cluster.
func (b *Broker) ArchiveDead(ctx context.Context, topic, sub string, cutoff time.Time) (int64, error) {
	return b.sumClusters(ctx, func(ctx context.Context, sh Cluster) (int64, error) {
		return sh.ArchiveDead(ctx, topic, sub, cutoff, b.now().UTC())
	})
}

// sumClusters runs fn on every cluster at once and adds up
// the counts it answers, those of clusters that failed too (what they did
// before failing); the error joins the failures, each naming its cluster.
func (b *Broker) sumClusters(ctx context.Context, fn func(ctx context.Context, sh Cluster) (int64, error)) (int64, error) {
	var total atomic.Int64
	err := b.eachCluster(ctx, func(ctx context.Context, _ string, sh Cluster) error {
		n, err := fn(ctx, sh)
		total.Add(n)
		return err
	})
	return total.Load(), err
}
