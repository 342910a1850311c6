package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/store"
)

const (
	jobAnalyze = "analyze"
	jobRebuild = "rebuild"
)

// Upkeep refreshes the statistics of every partitioned table on every hot
// cluster once per AnalyzeEvery (recorded on the cluster, so a new leader
// does not do it again), and, only inside the off-peak window, rebuilds
// the partitions whose free space passed FreeRatio (and MinFreeBytes).
func (j *Job) Upkeep(ctx context.Context) error {
	return j.pass(ctx, JobUpkeep, func(ctx context.Context) error {
		now := j.cfg.Now()
		var errs []error
		hot := j.deps.Hot()
		for _, name := range sortedClusters(hot) {
			st := hot[name]
			for _, table := range store.PartitionedTables {
				if err := j.analyze(ctx, st, table); err != nil {
					errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
				}
				if !j.cfg.offPeak(now) {
					continue
				}
				if err := j.rebuild(ctx, name, st, table); err != nil {
					errs = append(errs, fmt.Errorf("cluster %s: %w", name, err))
				}
			}
		}
		return errors.Join(errs...)
	})
}

func (j *Job) analyze(ctx context.Context, st *store.Store, table string) error {
	at, _, err := st.DoneAt(ctx, jobAnalyze, table)
	switch {
	case err == nil && j.cfg.Now().Sub(at) < j.cfg.AnalyzeEvery:
		return nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return err
	}
	if err := st.Analyze(ctx, table); err != nil {
		return err
	}
	j.addItem(JobUpkeep, "table_analyzed")
	return st.MarkDone(ctx, jobAnalyze, table, "", j.cfg.Now())
}

// rebuild rebuilds table's fragmented partitions one at a time, checking
// the window again before each (a rebuild is not started past its end).
func (j *Job) rebuild(ctx context.Context, cluster string, st *store.Store, table string) error {
	parts, err := st.Partitions(ctx, table)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if p.FreeRatio() <= j.cfg.FreeRatio || p.DataFree < j.cfg.MinFreeBytes {
			continue
		}
		if !j.cfg.offPeak(j.cfg.Now()) || ctx.Err() != nil {
			return ctx.Err()
		}
		if err := st.RebuildPartition(ctx, table, p.Name); err != nil {
			return err
		}
		j.addItem(JobUpkeep, "partition_rebuilt")
		j.cfg.Log.Info("fragmented partition rebuilt", "cluster", cluster, "table", table, "partition", p.Name,
			"free_bytes", p.DataFree, "free_ratio", p.FreeRatio())
		if err := st.MarkDone(ctx, jobRebuild, table+"/"+p.Name, fmt.Sprintf("free=%d ratio=%.2f", p.DataFree, p.FreeRatio()), j.cfg.Now()); err != nil {
			return err
		}
		if err := ctxwait.Sleep(ctx, j.cfg.Pause); err != nil {
			return err
		}
	}
	return nil
}
