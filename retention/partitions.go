package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/store"
)

// Partitions gives every month up to AheadMonths after the current one its
// partition on every hot cluster (message_store and message_trace), by
// splitting pmax. A month that already has rows in pmax (the router was
// stopped past its last partition) gets them moved to its partition by the
// same split, so no insert is ever refused and every row ends in its
// month.
func (j *Job) Partitions(ctx context.Context) error {
	return j.pass(ctx, JobPartitions, func(ctx context.Context) error {
		want := store.MonthOf(j.cfg.Now()).AddDate(0, j.cfg.AheadMonths, 0)
		var errs []error
		hot := j.deps.Hot()
		for _, name := range sortedClusters(hot) {
			for _, table := range store.PartitionedTables {
				if err := j.extend(ctx, name, hot[name], table, want); err != nil {
					errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
				}
			}
		}
		return errors.Join(errs...)
	})
}

// extend splits pmax of table so that month last has its partition.
func (j *Job) extend(ctx context.Context, cluster string, st *store.Store, table string, last time.Time) error {
	parts, err := st.Partitions(ctx, table)
	if err != nil {
		return err
	}
	var top time.Time // the bound of the last month partition
	hasMax := false
	for _, p := range parts {
		if p.LessThan.IsZero() {
			hasMax = p.Name == "pmax"
			continue
		}
		if p.LessThan.After(top) {
			top = p.LessThan
		}
	}
	if !hasMax || top.IsZero() {
		return fmt.Errorf("%s is not partitioned by month with a pmax partition", table)
	}
	var months []time.Time
	for m := top; !m.After(last); m = m.AddDate(0, 1, 0) {
		months = append(months, m)
	}
	if len(months) > 0 {
		if err := st.SplitMax(ctx, table, months); err != nil {
			return err
		}
		for range months {
			j.addItem(JobPartitions, "partition_created")
		}
		j.cfg.Log.Info("month partitions created", "cluster", cluster, "table", table, "from", monthText(months[0]), "to", monthText(months[len(months)-1]))
		top = months[len(months)-1].AddDate(0, 1, 0)
	}
	now := store.MonthOf(j.cfg.Now())
	ahead := 0
	for m := now.AddDate(0, 1, 0); m.Before(top); m = m.AddDate(0, 1, 0) {
		ahead++
	}
	j.ahead.WithLabelValues(cluster, table).Set(float64(ahead))
	return nil
}
