package retention

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/store"
)

// The warm move of one hot cluster's month M (docs/retention.md):
//
//  1. M is past the hot window, every older month of the cluster has
//     moved, and no message created before the end of M still has a
//     delivery in message_queue (ready, in flight or an unarchived dead
//     letter). Otherwise M and every later month stay hot, reported as
//     blocked. Months are immutable from then on: produce writes only the
//     current month, and trace events are written at the current time.
//  2. For message_store and message_trace, per vshard range: copy the
//     partition's rows to archive_message / archive_trace (upserts, so a
//     copy cut short is simply done again), then compare row counts and
//     checksums per vshard; a mismatch copies the range again once. A
//     range that matched is recorded (retention_state on the hot cluster)
//     and not copied again when a pass resumes.
//  3. When every range of both tables matched, and the queue still holds
//     no delivery of M, the partitions are dropped from the hot cluster.
//
// No resharding job may move vshards meanwhile: the whole pass waits.

const jobWarmCopy = "warm_copy"

// Warm moves months past the hot window from every hot cluster to the
// archive cluster.
func (j *Job) Warm(ctx context.Context) error {
	return j.pass(ctx, JobWarm, func(ctx context.Context) error {
		arch := j.deps.Archive()
		if arch == nil {
			return nil // no archive cluster: months stay hot
		}
		cutoff := store.MonthOf(j.cfg.Now()).AddDate(0, -j.cfg.HotMonths, 0)
		var errs []error
		hot := j.deps.Hot()
		for _, name := range sortedClusters(hot) {
			if err := j.warmCluster(ctx, name, hot[name], arch, cutoff); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
			}
		}
		return errors.Join(errs...)
	})
}

// monthParts is one month's partition in each partitioned table that
// still has it, with the lower bound of its rows (zero: the lowest
// partition, which holds everything older too).
type monthParts struct {
	bound time.Time // the partitions' upper bound
	name  string
	lower map[string]time.Time // by table; absent: the table has no such partition
}

// pastHot lists the month partitions of st below cutoff, oldest first.
func pastHot(ctx context.Context, st *store.Store, cutoff time.Time) ([]*monthParts, error) {
	byBound := map[time.Time]*monthParts{}
	for _, table := range store.PartitionedTables {
		parts, err := st.Partitions(ctx, table)
		if err != nil {
			return nil, err
		}
		var prev time.Time
		for _, p := range parts {
			if p.LessThan.IsZero() {
				continue
			}
			if !p.LessThan.After(cutoff) {
				mp := byBound[p.LessThan]
				if mp == nil {
					mp = &monthParts{bound: p.LessThan, name: p.Name, lower: map[string]time.Time{}}
					byBound[p.LessThan] = mp
				}
				mp.lower[table] = prev
			}
			prev = p.LessThan
		}
	}
	out := make([]*monthParts, 0, len(byBound))
	for _, mp := range byBound {
		out = append(out, mp)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].bound.Before(out[b].bound) })
	return out, nil
}

func (j *Job) warmCluster(ctx context.Context, cluster string, st, arch *store.Store, cutoff time.Time) error {
	months, err := pastHot(ctx, st, cutoff)
	if err != nil {
		return err
	}
	j.setBlocked(cluster, nil)
	for _, mp := range months {
		month := monthText(mp.bound.AddDate(0, -1, 0))
		if j.deps.Moving() {
			j.setBlocked(cluster, &Blocked{Cluster: cluster, Month: month, Reason: "resharding"})
			return nil
		}
		live, err := st.LiveDeliveriesBefore(ctx, mp.bound)
		if err != nil {
			return err
		}
		if live > 0 {
			j.setBlocked(cluster, &Blocked{Cluster: cluster, Month: month, Reason: "live_deliveries", LiveDeliveries: live})
			j.cfg.Log.Info("month stays hot: its messages still have deliveries", "cluster", cluster, "month", month, "deliveries", live)
			return nil
		}
		start := mp.bound.AddDate(0, -1, 0)
		for _, pair := range [][2]string{{store.TableMessages, store.TableArchiveMessages}, {store.TableTrace, store.TableArchiveTrace}} {
			lower, ok := mp.lower[pair[0]]
			if !ok {
				continue
			}
			if lower.IsZero() {
				if moved, err := j.copyOlder(ctx, cluster, st, arch, pair, mp.name, start); err != nil || !moved {
					if err == nil {
						j.setBlocked(cluster, &Blocked{Cluster: cluster, Month: month, Reason: "rows_older_than_month"})
						j.cfg.Log.Warn("month stays hot: its partition holds rows older than could be checked", "cluster", cluster, "table", pair[0], "month", month)
					}
					return err
				}
			}
			for _, r := range j.cfg.ranges() {
				sp := store.Span{From: start, To: mp.bound, VFrom: r[0], VTo: r[1]}
				item := fmt.Sprintf("%s/%s/%s/v%04d-%04d", cluster, pair[0], mp.name, r[0], r[1])
				if err := j.copyRange(ctx, st, arch, pair[0], pair[1], sp, item); err != nil {
					return err
				}
			}
		}
		// Nothing may have come back to life meanwhile.
		if live, err = st.LiveDeliveriesBefore(ctx, mp.bound); err != nil || live > 0 {
			if err == nil {
				err = fmt.Errorf("month %s got %d deliveries while it was copied; not dropped", month, live)
			}
			return err
		}
		if j.deps.Moving() {
			j.setBlocked(cluster, &Blocked{Cluster: cluster, Month: month, Reason: "resharding"})
			return nil
		}
		for _, table := range store.PartitionedTables {
			if _, ok := mp.lower[table]; !ok {
				continue
			}
			if err := st.DropPartition(ctx, table, mp.name); err != nil {
				return err
			}
			j.addItem(JobWarm, "partition_dropped")
		}
		for _, table := range store.PartitionedTables {
			if err := st.ForgetDone(ctx, jobWarmCopy, cluster+"/"+table+"/"+mp.name+"/"); err != nil {
				j.cfg.Log.Warn("retention: records of a moved month not removed", "cluster", cluster, "err", err)
			}
		}
		j.cfg.Log.Info("month moved to the archive cluster and dropped from the hot cluster", "cluster", cluster, "month", month)
	}
	return nil
}

// copyOlder copies the rows of the lowest partition that are older than
// its month (start): rows a resharding copy brought from a cluster that
// had not moved their month yet, after this cluster had dropped it. They
// are copied and checked month by month and vshard range by range like a
// partition's own rows (their vshards' rows of that month lived on the
// other cluster only). False when rows older than the oldest month found
// remain (then nothing is dropped).
func (j *Job) copyOlder(ctx context.Context, cluster string, st, arch *store.Store, pair [2]string, part string, start time.Time) (bool, error) {
	all := store.Span{To: start, VFrom: 0, VTo: 1023}
	rows, _, err := st.TierRead(ctx, pair[0], all, 0, 1)
	if err != nil || len(rows) == 0 {
		return err == nil, err
	}
	at, ok := rows[0][1].(time.Time) // created_at of either table
	if !ok {
		return false, fmt.Errorf("%s: created_at of type %T", pair[0], rows[0][1])
	}
	// Ids grow with time only roughly across routers: a month earlier too.
	first := store.MonthOf(at).AddDate(0, -1, 0)
	for m := first; m.Before(start); m = m.AddDate(0, 1, 0) {
		for _, r := range j.cfg.ranges() {
			sp := store.Span{From: m, To: m.AddDate(0, 1, 0), VFrom: r[0], VTo: r[1]}
			item := fmt.Sprintf("%s/%s/%s/older-%s/v%04d-%04d", cluster, pair[0], part, monthText(m), r[0], r[1])
			if err := j.copyRange(ctx, st, arch, pair[0], pair[1], sp, item); err != nil {
				return false, err
			}
		}
	}
	left, err := st.TierSums(ctx, pair[0], store.Span{To: first, VFrom: 0, VTo: 1023})
	return err == nil && len(left) == 0, err
}

// copyRange copies one span of a hot table to its archive table and checks
// it, unless a pass already did (recorded as item).
func (j *Job) copyRange(ctx context.Context, st, arch *store.Store, from, to string, sp store.Span, item string) error {
	if _, _, err := st.DoneAt(ctx, jobWarmCopy, item); err == nil {
		return nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	var detail string
	for attempt := 0; ; attempt++ {
		n, err := j.copySpan(ctx, st, arch, from, to, sp)
		if err != nil {
			return err
		}
		j.addRows(JobWarm, n)
		ok, d, err := sameRows(ctx, st, arch, from, to, sp)
		if err != nil {
			return err
		}
		if ok {
			detail = d
			break
		}
		if attempt == 1 {
			return fmt.Errorf("%s %s: archive copy differs after copying twice (%s); kept hot", from, sp, d)
		}
	}
	return st.MarkDone(ctx, jobWarmCopy, item, detail, j.cfg.Now())
}

// copySpan copies a span in batches, pausing between them.
func (j *Job) copySpan(ctx context.Context, src, dst *store.Store, from, to string, sp store.Span) (int64, error) {
	var after uint64
	var n int64
	for {
		rows, last, err := src.TierRead(ctx, from, sp, after, j.cfg.BatchRows)
		if err != nil {
			return n, err
		}
		if len(rows) == 0 {
			return n, nil
		}
		if err := dst.TierWrite(ctx, to, rows); err != nil {
			return n, err
		}
		n += int64(len(rows))
		after = last
		// A short batch is not the end: reads stop early on large rows
		// (store.TierRead); the next read's empty answer is.
		if err := ctxwait.Sleep(ctx, j.cfg.Pause); err != nil {
			return n, err
		}
	}
}

// sameRows compares the counts and checksums of every vshard the source
// holds rows of in sp. Vshards only the destination has are not the
// source's (another cluster's rows, archived already).
func sameRows(ctx context.Context, src, dst *store.Store, from, to string, sp store.Span) (bool, string, error) {
	a, err := src.TierSums(ctx, from, sp)
	if err != nil {
		return false, "", err
	}
	if len(a) == 0 {
		return true, "rows=0", nil
	}
	b, err := dst.TierSums(ctx, to, sp)
	if err != nil {
		return false, "", err
	}
	var rows int64
	for v, x := range a {
		if y := b[v]; x != y {
			return false, fmt.Sprintf("vshard %d: %d rows sum %s here, %d rows sum %s in %s", v, x.Rows, x.Sum, y.Rows, y.Sum, to), nil
		}
		rows += x.Rows
	}
	return true, fmt.Sprintf("rows=%d vshards=%d", rows, len(a)), nil
}
