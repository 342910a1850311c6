package rebalance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// run drives job id through its states until it ends, is paused, or ctx
// is done (leadership lost, router stopping): every step is recorded
// before or after it is taken so that the next runner resumes there.
func (m *Manager) run(ctx context.Context, id string) {
	failures := 0
	for ctx.Err() == nil {
		j, err := m.Get(ctx, id)
		if err != nil {
			m.cfg.Log.Warn("reshard: cannot read job", "job", id, "err", err)
			return
		}
		if Terminal(j.State) || (j.State == StatePaused && !j.AbortRequested) {
			return
		}
		if j.AbortRequested || j.State == StateAborting {
			err = m.rollback(ctx, j, StateAborted, "")
		} else {
			err = m.step(ctx, j)
		}
		switch {
		case err == nil, errors.Is(err, errInterrupted):
			failures = 0
			continue
		case ctx.Err() != nil:
			return
		case superseded(err):
			m.terms.supersede(err)
			return
		}
		failures++
		m.cfg.Log.Warn("reshard step failed; retrying", "job", id, "state", j.State, "failures", failures, "err", err)
		msg := err.Error()
		m.update(ctx, id, "", func(j *Job) error { j.Error = msg; return nil })
		if failures >= 10 && beforeCutover(j.State) && j.State != StateAborting {
			if err := m.rollback(ctx, j, StateFailed, msg); err == nil {
				return
			}
		}
		ctxwait.Sleep(ctx, time.Duration(min(failures, 10))*500*time.Millisecond)
	}
}

// step takes j one state further.
func (m *Manager) step(ctx context.Context, j *Job) error {
	switch j.State {
	case StatePending:
		total, err := m.countRows(ctx, j)
		if err != nil {
			return err
		}
		_, err = m.update(ctx, j.ID, StatePending, func(j *Job) error {
			j.RowsTotal, j.State = total, StateCopying
			return nil
		})
		return err
	case StateCopying:
		if err := m.copyAll(ctx, j); err != nil {
			return err
		}
		_, err := m.update(ctx, j.ID, StateCopying, func(j *Job) error { j.State = StateCatchingUp; return nil })
		return err
	case StateCatchingUp:
		for round := 0; round < m.cfg.CatchUpRounds; round++ {
			n, _, err := m.syncAll(ctx, j, false)
			if err != nil && !errors.Is(err, errMismatch) { // a mismatch: the source changed meanwhile
				return err
			}
			if n < m.cfg.CatchUpRows {
				break
			}
		}
		_, err := m.update(ctx, j.ID, StateCatchingUp, func(j *Job) error {
			now := m.cfg.Now().UTC()
			j.State, j.FrozenAt, j.Error = StateFreezing, &now, ""
			return nil
		})
		return err
	case StateFreezing:
		v, err := m.setFrozen(ctx, j, true)
		if err != nil {
			return err
		}
		bctx, cancel := context.WithTimeout(ctx, m.cfg.BarrierTimeout)
		err = m.maps.WaitApplied(bctx, v)
		cancel()
		if err != nil && ctx.Err() == nil {
			return m.retreat(ctx, j, fmt.Sprintf("routers did not apply the frozen map %d: %v", v, err))
		}
		if err != nil {
			return err
		}
		// Every live router applied v; a stale one (cut off from the
		// topology store, paused) may still write with an older map:
		// the sources' fences refuse it from now on, and what it wrote
		// before is there for the final sync.
		if err := m.raiseFences(ctx, j, v); err != nil {
			return err
		}
		_, err = m.update(ctx, j.ID, StateFreezing, func(j *Job) error { j.State, j.FencedAt = StateFrozen, v; return nil })
		return err
	case StateFrozen:
		err := m.finalSync(ctx, j)
		if err != nil && ctx.Err() == nil && !errors.Is(err, errInterrupted) {
			// Not retried under freeze: the vshards serve again first.
			return m.retreat(ctx, j, err.Error())
		}
		return err
	case StateCutover:
		return m.cutover(ctx, j)
	case StateCleanup:
		if err := m.checkCleanup(ctx, j); err != nil {
			return err
		}
		for _, mv := range j.Moves {
			// Every delete checks the source's record again, in its own
			// transaction: a runner that stalled past checkCleanup (a
			// demoted leader) deletes nothing a later map gave back.
			dctx := store.WithOwnerCheck(ctx, store.OwnerCheck{Cluster: mv.Target, MinVersion: j.FlippedAt, VShards: mv.VShards})
			for _, t := range store.MoveTables() {
				if err := m.deleteAll(dctx, mv.Source, t.Name, mv.VShards, true); err != nil {
					return fmt.Errorf("delete %s rows on %s: %w", t.Name, mv.Source, err)
				}
			}
		}
		nj, err := m.updateDoc(ctx, j.ID, StateCleanup, func(js *Jobs, j *Job) error {
			now := m.cfg.Now().UTC()
			j.State, j.FinishedAt, j.Error = StateDone, &now, ""
			if j.ReverseRequested {
				back := m.reverse(j)
				js.Jobs = append(js.Jobs, back)
				j.State, j.ReversedBy = StateAborted, back.ID
				j.Error = "aborted after the flip: job " + back.ID + " moves the vshards back"
			}
			return nil
		})
		if err == nil {
			m.cfg.Log.Info("reshard job finished", "job", j.ID, "state", nj.State, "rows_copied", nj.RowsCopied, "max_pause_ms", nj.MaxPauseMS, "reversed_by", nj.ReversedBy)
			m.poke()
		}
		return err
	}
	return fmt.Errorf("job %s in unknown state %q", j.ID, j.State)
}

// reverse is the job that moves j's vshards back to their sources.
func (m *Manager) reverse(j *Job) *Job {
	back := &Job{ID: newJobID(m.cfg.Now()), State: StatePending, StartedAt: m.cfg.Now().UTC(), Cursors: map[string]store.MoveCursor{}}
	for _, mv := range j.Moves {
		back.Moves = append(back.Moves, Move{Source: mv.Target, Target: mv.Source, VShards: append([]uint16(nil), mv.VShards...)})
		vs := make([]int, len(mv.VShards))
		for i, v := range mv.VShards {
			vs[i] = int(v)
		}
		back.Ranges = append(back.Ranges, toRanges(vs, mv.Source)...)
	}
	return back
}

// cluster is the primary of cluster name as this leader's jobs use it:
// with Config.Sessions, the leader's own connections of its epoch, opened
// (and the cluster taken over from older leaders) on first use.
func (m *Manager) cluster(ctx context.Context, name string) (Mover, error) {
	c, ok := m.clusters()[name]
	if !ok {
		return nil, fmt.Errorf("cluster %s has no connection on this router", name)
	}
	if m.cfg.Sessions == nil {
		return c, nil
	}
	return m.terms.session(ctx, name)
}

func (m *Manager) countRows(ctx context.Context, j *Job) (int64, error) {
	var total int64
	for _, mv := range j.Moves {
		src, err := m.cluster(ctx, mv.Source)
		if err != nil {
			return 0, err
		}
		for _, t := range store.MoveTables() {
			n, err := src.MoveCount(ctx, t.Name, mv.VShards)
			if err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}

// throttle paces n rows written to cluster at RowsPerSecond, then waits
// while the cluster's replicas lag more than MaxReplicaLag (10s at most).
// An operator's pause or abort (which pokes the manager) cuts the waits
// short.
func (m *Manager) throttle(ctx context.Context, n int, cluster string) {
	if n <= 0 {
		return
	}
	if m.cfg.RowsPerSecond > 0 && !m.pause(ctx, time.Duration(n)*time.Second/time.Duration(m.cfg.RowsPerSecond)) {
		return
	}
	if m.cfg.ReplicaLag == nil {
		return
	}
	for waited := time.Duration(0); waited < 10*time.Second; waited += 100 * time.Millisecond {
		lag, ok := m.cfg.ReplicaLag(cluster)
		if !ok || lag <= m.cfg.MaxReplicaLag {
			return
		}
		if !m.pause(ctx, 100*time.Millisecond) {
			return
		}
	}
	m.cfg.Log.Warn("reshard: replicas still lag; going on", "cluster", cluster, "max_replica_lag", m.cfg.MaxReplicaLag)
}

// pause waits d; false when ctx ended or the manager was poked first.
func (m *Manager) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-m.wake:
		return false
	case <-t.C:
		return true
	}
}

// doneCursor marks a table whose copy finished.
var doneCursor = store.MoveCursor{"\x00done"}

func cursorKey(mv Move, table string) string { return mv.Source + "/" + mv.Target + "/" + table }

// copyAll copies the rows of every table but message_queue from source to
// target in batches, recording the position after each.
func (m *Manager) copyAll(ctx context.Context, j *Job) error {
	for _, mv := range j.Moves {
		src, err := m.cluster(ctx, mv.Source)
		if err != nil {
			return err
		}
		dst, err := m.cluster(ctx, mv.Target)
		if err != nil {
			return err
		}
		for _, t := range store.MoveTables() {
			if t.FrozenOnly {
				continue
			}
			key := cursorKey(mv, t.Name)
			cur := j.Cursors[key]
			for !equalCursor(cur, doneCursor) {
				rows, next, err := src.MoveRead(ctx, t.Name, mv.VShards, cur, m.cfg.BatchRows)
				if err != nil {
					return err
				}
				if len(rows) == 0 {
					next = doneCursor
				} else if err := dst.MoveWrite(ctx, t.Name, rows); err != nil {
					return err
				}
				m.rows.Add(float64(len(rows)))
				nj, err := m.update(ctx, j.ID, StateCopying, func(j *Job) error {
					if j.Cursors == nil {
						j.Cursors = map[string]store.MoveCursor{}
					}
					j.Cursors[key] = next
					j.RowsCopied += int64(len(rows))
					j.RowsTotal = max(j.RowsTotal, j.RowsCopied) // rows produced after the count
					return nil
				})
				if err != nil {
					return err
				}
				j, cur = nj, next
				m.throttle(ctx, len(rows), mv.Target)
			}
		}
	}
	return nil
}

func equalCursor(a, b store.MoveCursor) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// syncAll makes the target's rows of every move equal to the source's,
// bucket by bucket: buckets whose count and checksum agree are skipped; in
// the others, rows that differ or are missing are upserted and rows the
// source no longer has are deleted, and the bucket is compared again row
// by row (primary key and MD5 of every column). withQueue includes
// message_queue (only under freeze). Tables and moves are synced
// concurrently. It returns how many rows it changed; err wraps errMismatch
// when a repaired bucket still differs (the source changed meanwhile).
// It also returns each table's row count on the source, as compared.
func (m *Manager) syncAll(ctx context.Context, j *Job, withQueue bool) (int64, map[string]int64, error) {
	type task struct {
		mv    Move
		table string
	}
	var tasks []task
	for _, mv := range j.Moves {
		for _, t := range store.MoveTables() {
			if !t.FrozenOnly || withQueue {
				tasks = append(tasks, task{mv, t.Name})
			}
		}
	}
	// changed counts every row written or deleted; copied the deliveries
	// among them, whose first copy is this sync's (under the freeze).
	var changed, copied atomic.Int64
	var mismatch atomic.Pointer[error]
	var countMu sync.Mutex
	counts := map[string]int64{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, tk := range tasks {
		g.Go(func() error {
			src, err := m.cluster(gctx, tk.mv.Source)
			if err != nil {
				return err
			}
			dst, err := m.cluster(gctx, tk.mv.Target)
			if err != nil {
				return err
			}
			began := time.Now()
			n, rows, err := m.syncTable(gctx, src, dst, tk.table, tk.mv.VShards)
			countMu.Lock()
			counts[tk.table] += rows
			countMu.Unlock()
			m.cfg.Log.Debug("reshard: table synced", "job", j.ID, "table", tk.table, "source", tk.mv.Source, "target", tk.mv.Target,
				"changed", n, "took", time.Since(began), "err", err)
			changed.Add(n)
			if tk.table == queueTable() {
				copied.Add(n)
			}
			if errors.Is(err, errMismatch) {
				// Not an error of the others: they go on.
				e := fmt.Errorf("sync %s %s→%s: %w", tk.table, tk.mv.Source, tk.mv.Target, err)
				mismatch.CompareAndSwap(nil, &e)
				return nil
			}
			if err != nil {
				return fmt.Errorf("sync %s %s→%s: %w", tk.table, tk.mv.Source, tk.mv.Target, err)
			}
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		if p := mismatch.Load(); p != nil {
			err = *p
		}
	}
	if n := changed.Load(); n > 0 {
		m.rows.Add(float64(n))
		c := copied.Load()
		m.update(ctx, j.ID, "", func(j *Job) error {
			j.RowsCopied += c
			j.RowsResynced += n - c
			j.RowsTotal = max(j.RowsTotal, j.RowsCopied)
			return nil
		})
	}
	return changed.Load(), counts, err
}

// buckets reads the bucket sums of both sides concurrently.
func bothBuckets(ctx context.Context, src, dst Mover, table string, vs []uint16) (sb, tb map[uint64]store.MoveBucket, err error) {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { sb, err = src.MoveBuckets(gctx, table, vs); return err })
	g.Go(func() (err error) { tb, err = dst.MoveBuckets(gctx, table, vs); return err })
	return sb, tb, g.Wait()
}

func (m *Manager) syncTable(ctx context.Context, src, dst Mover, table string, vs []uint16) (int64, int64, error) {
	sb, tb, err := bothBuckets(ctx, src, dst, table, vs)
	if err != nil {
		return 0, 0, err
	}
	var rows int64
	for _, b := range sb {
		rows += b.Rows
	}
	var diff []uint64
	for b, s := range sb {
		if tb[b] != s {
			diff = append(diff, b)
		}
	}
	for b := range tb {
		if _, ok := sb[b]; !ok {
			diff = append(diff, b)
		}
	}
	sort.Slice(diff, func(a, b int) bool { return diff[a] < diff[b] })
	var changed int64
	var mismatch error
	for _, b := range diff {
		srows, err := src.MoveBucketRows(ctx, table, vs, b, false)
		if err != nil {
			return 0, 0, err
		}
		tkeys, err := dst.MoveBucketRows(ctx, table, vs, b, true)
		if err != nil {
			return 0, 0, err
		}
		have := map[string]any{}
		for _, k := range tkeys {
			have[store.MoveKeyText(k[:len(k)-1])] = k[len(k)-1]
		}
		var up []store.MoveRow
		seen := map[string]bool{}
		for _, r := range srows {
			row, sum := r[:len(r)-1], r[len(r)-1]
			key, err := store.MoveKeyOf(table, row)
			if err != nil {
				return 0, 0, err
			}
			kt := store.MoveKeyText(key)
			seen[kt] = true
			if h, ok := have[kt]; !ok || fmt.Sprint(h) != fmt.Sprint(sum) {
				up = append(up, row)
			}
		}
		var del []store.MoveRow
		for _, k := range tkeys {
			if !seen[store.MoveKeyText(k[:len(k)-1])] {
				del = append(del, k[:len(k)-1])
			}
		}
		for i := 0; i < len(up); i += m.cfg.BatchRows {
			if err := dst.MoveWrite(ctx, table, up[i:min(i+m.cfg.BatchRows, len(up))]); err != nil {
				return 0, 0, err
			}
		}
		for i := 0; i < len(del); i += m.cfg.BatchRows {
			if _, err := dst.MoveDelete(ctx, table, del[i:min(i+m.cfg.BatchRows, len(del))]); err != nil {
				return 0, 0, err
			}
		}
		changed += int64(len(up) + len(del))
		if err := sameBucket(ctx, src, dst, table, vs, b); err != nil {
			if !errors.Is(err, errMismatch) {
				return changed, rows, err
			}
			if mismatch == nil {
				mismatch = err // the source changed meanwhile: go on with the other buckets
			}
		}
	}
	return changed, rows, mismatch
}

// sameBucket compares one bucket row by row: the same primary keys with
// the same MD5 of every column on both sides.
func sameBucket(ctx context.Context, src, dst Mover, table string, vs []uint16, b uint64) error {
	var s, t []store.MoveRow
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { s, err = src.MoveBucketRows(gctx, table, vs, b, true); return err })
	g.Go(func() (err error) { t, err = dst.MoveBucketRows(gctx, table, vs, b, true); return err })
	if err := g.Wait(); err != nil {
		return err
	}
	sum := func(rows []store.MoveRow) map[string]string {
		out := make(map[string]string, len(rows))
		for _, r := range rows {
			out[store.MoveKeyText(r[:len(r)-1])] = fmt.Sprint(r[len(r)-1])
		}
		return out
	}
	ss, ts := sum(s), sum(t)
	if len(ss) != len(ts) {
		return fmt.Errorf("%w: %s bucket %d: %d rows on the source, %d on the target", errMismatch, table, b, len(ss), len(ts))
	}
	for k, v := range ss {
		if ts[k] != v {
			return fmt.Errorf("%w: %s bucket %d: a row differs", errMismatch, table, b)
		}
	}
	return nil
}

var errMismatch = errors.New("verification failed")

// finalSync copies the last changes under freeze, message_queue included,
// and verifies; within FreezeBudget it moves on to the cutover, past it
// the freeze is given up (retreat) and the job catches up again.
func (m *Manager) finalSync(ctx context.Context, j *Job) error {
	began := time.Now()
	var last error
	var verified map[string]int64
	for round := 0; round < 3 && time.Since(began) < m.cfg.FreezeBudget; round++ {
		// Under freeze nothing writes the vshards: a bucket whose count
		// and checksum agreed in the sync's scan still agrees, and every
		// repaired bucket was compared again row by row.
		if _, verified, last = m.syncAll(ctx, j, true); last == nil {
			break
		}
		if !errors.Is(last, errMismatch) {
			return last
		}
	}
	if last == nil {
		// Verified (a round over the budget still counts: its pause is
		// spent already).
		var rows int64
		for _, n := range verified {
			rows += n
		}
		_, err := m.update(ctx, j.ID, StateFrozen, func(j *Job) error {
			// Every row of the vshards is on the target now, verified.
			j.State, j.Verified = StateCutover, verified
			j.RowsTotal, j.RowsCopied = rows, rows
			return nil
		})
		if err == nil {
			m.cfg.Log.Info("reshard: verified under freeze", "job", j.ID, "rows", verified, "took", time.Since(began).Round(time.Millisecond))
		}
		return err
	}
	return m.retreat(ctx, j, fmt.Sprintf("final sync did not converge within the freeze budget of %v: %v", m.cfg.FreezeBudget, last))
}

// retreat gives up a freeze: the target's deliveries go, the vshards
// serve from the source again, and the job catches up and freezes later —
// or fails after FreezeRetries.
func (m *Manager) retreat(ctx context.Context, j *Job, reason string) error {
	m.cfg.Log.Warn("reshard: freeze given up; unfreezing", "job", j.ID, "reason", reason)
	if err := m.deleteTarget(ctx, j, true); err != nil {
		return err
	}
	if _, err := m.setFrozen(ctx, j, false); err != nil {
		return err
	}
	m.recordPause(ctx, j, "given_up")
	nj, err := m.update(ctx, j.ID, j.State, func(j *Job) error {
		j.FreezeAttempts++
		j.Error = "freeze given up: " + reason
		j.State = StateCatchingUp
		return nil
	})
	if err != nil {
		return err
	}
	if nj.FreezeAttempts >= m.cfg.FreezeRetries {
		return m.rollback(ctx, nj, StateFailed, fmt.Sprintf("gave up after %d freezes: %s", nj.FreezeAttempts, reason))
	}
	return nil
}

// recordPause records the pause of the freeze that ends now: from the
// write of the frozen map to now (the unfrozen map applied everywhere),
// an upper bound of any request's hold.
func (m *Manager) recordPause(ctx context.Context, j *Job, outcome string) {
	m.update(ctx, j.ID, "", func(j *Job) error {
		if j.FrozenAt != nil {
			d := m.cfg.Now().Sub(*j.FrozenAt)
			j.MaxPauseMS = max(j.MaxPauseMS, d.Milliseconds())
			j.FrozenAt = nil
			m.pauses.WithLabelValues(outcome).Observe(d.Seconds())
		}
		return nil
	})
}

// allVShards lists every vshard of j.
func allVShards(j *Job) []shard.ID {
	var out []shard.ID
	for _, mv := range j.Moves {
		for _, v := range mv.VShards {
			out = append(out, shard.ID(v))
		}
	}
	return out
}

// setFrozen writes (check-and-set) a shard map where j's vshards are
// frozen (or serving) on their source, unless the stored one already says
// so, and returns the version that does.
func (m *Manager) setFrozen(ctx context.Context, j *Job, frozen bool) (int64, error) {
	want := routing.Serving
	if frozen {
		want = routing.Frozen
	}
	for attempt := 0; attempt < 20; attempt++ {
		cur, err := m.maps.ShardMap(ctx)
		if err != nil {
			return 0, err
		}
		ok := true
		for _, mv := range j.Moves {
			for _, v := range mv.VShards {
				owner, st := cur.Lookup(shard.ID(v))
				if owner != mv.Source {
					return 0, fmt.Errorf("vshard %d is owned by %s, not the job's source %s: the shard map changed under the job", v, owner, mv.Source)
				}
				if st != want {
					ok = false
				}
			}
		}
		if ok {
			return cur.Version(), nil
		}
		next, err := cur.With(cur.Version()+1, allVShards(j), "", want)
		if err != nil {
			return 0, err
		}
		err = m.maps.UpdateShardMap(ctx, cur.Version(), next)
		if err == nil {
			m.cfg.Log.Info("reshard: shard map written", "job", j.ID, "version", next.Version(), "frozen", frozen)
			return next.Version(), nil
		}
		if !isConflict(err) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("shard map kept changing under the job")
}

func isConflict(err error) bool { return errors.Is(err, topology.ErrConflict) }

// cutover is past the point of no return: the source's deliveries of the
// vshards go (the target has them, verified), the map flips to the target
// with the vshards serving (check-and-set), and once every router applied
// it the pause ends.
func (m *Manager) cutover(ctx context.Context, j *Job) error {
	flipped := true
	cur, err := m.maps.ShardMap(ctx)
	if err != nil {
		return err
	}
	for _, mv := range j.Moves {
		for _, v := range mv.VShards {
			if owner, st := cur.Lookup(shard.ID(v)); owner != mv.Target || st != routing.Serving {
				flipped = false
			}
		}
	}
	if !flipped {
		for _, mv := range j.Moves {
			if c, err := m.cluster(ctx, mv.Source); err == nil {
				m.endStalled(ctx, c, mv.Source)
			}
			// Under freeze: not throttled, the pause is running.
			if err := m.deleteAll(ctx, mv.Source, queueTable(), mv.VShards, false); err != nil {
				return fmt.Errorf("delete source deliveries on %s: %w", mv.Source, err)
			}
		}
		for attempt := 0; ; attempt++ {
			cur, err = m.maps.ShardMap(ctx)
			if err != nil {
				return err
			}
			next := cur
			for _, mv := range j.Moves {
				vs := make([]shard.ID, len(mv.VShards))
				for i, v := range mv.VShards {
					vs[i] = shard.ID(v)
				}
				if next, err = next.With(cur.Version()+1, vs, mv.Target, routing.Serving); err != nil {
					return err
				}
			}
			err = m.maps.UpdateShardMap(ctx, cur.Version(), next)
			if err == nil {
				cur = next
				m.cfg.Log.Info("reshard: shard map flipped", "job", j.ID, "version", next.Version())
				break
			}
			if !isConflict(err) || attempt >= 20 {
				return err
			}
		}
	}
	// The flipped map is recorded on the sources and targets before
	// anything is deleted: cleanup checks the sources' records.
	if err := m.recordOwners(ctx, j, cur); err != nil {
		return err
	}
	if err := m.maps.WaitApplied(ctx, cur.Version()); err != nil {
		return err
	}
	m.recordPause(ctx, j, "flipped")
	_, err = m.update(ctx, j.ID, StateCutover, func(j *Job) error { j.State, j.FlippedAt = StateCleanup, cur.Version(); return nil })
	return err
}

// ownersOf is sm as vshard_owner rows.
func ownersOf(sm *routing.Map) []store.VShardOwner {
	owners := make([]store.VShardOwner, 0, shard.Count)
	for _, rg := range sm.Ranges() {
		for v := rg.From; v <= rg.To; v++ {
			owners = append(owners, store.VShardOwner{VShard: v, Cluster: rg.Cluster, MapVersion: sm.Version(), Frozen: rg.Frozen})
		}
	}
	return owners
}

// raiseFences raises the fence of every source of j to version v and
// records the map of v there (store.RaiseFence): from then on a write
// routed with an older map is refused on the sources. The map read here
// is v or newer (only this job changes its vshards).
func (m *Manager) raiseFences(ctx context.Context, j *Job, v int64) error {
	sm, err := m.maps.ShardMap(ctx)
	if err != nil {
		return err
	}
	if sm.Version() < v {
		return fmt.Errorf("shard map read back at version %d, older than the frozen map %d", sm.Version(), v)
	}
	owners := ownersOf(sm)
	done := map[string]bool{}
	for _, mv := range j.Moves {
		if done[mv.Source] {
			continue
		}
		done[mv.Source] = true
		c, err := m.cluster(ctx, mv.Source)
		if err != nil {
			return err
		}
		m.endStalled(ctx, c, mv.Source)
		if err := c.RaiseFence(ctx, v, owners, "reshard "+j.ID, m.cfg.Now()); err != nil {
			return fmt.Errorf("raise the fence of %s to map %d: %w", mv.Source, v, err)
		}
	}
	m.cfg.Log.Info("reshard: sources fenced", "job", j.ID, "version", v)
	return nil
}

// endStalled kills the transactions left open on cluster by stalled
// clients (a router stopped mid-transaction holds the locks the next
// step needs); a failure is only logged: the step's own lock waits are
// bounded and retried.
func (m *Manager) endStalled(ctx context.Context, c Mover, cluster string) {
	n, err := c.EndStalledTransactions(ctx, m.cfg.StalledAfter)
	if err != nil {
		m.cfg.Log.Warn("reshard: cannot end stalled transactions", "cluster", cluster, "err", err)
	}
	if n > 0 {
		m.cfg.Log.Warn("reshard: ended transactions of stalled clients", "cluster", cluster, "killed", n, "idle_at_least", m.cfg.StalledAfter)
	}
}

// recordOwners records sm (the flipped map) on every source and target
// of j.
func (m *Manager) recordOwners(ctx context.Context, j *Job, sm *routing.Map) error {
	owners := ownersOf(sm)
	done := map[string]bool{}
	for _, mv := range j.Moves {
		for _, name := range []string{mv.Source, mv.Target} {
			if done[name] {
				continue
			}
			done[name] = true
			c, err := m.cluster(ctx, name)
			if err != nil {
				return err
			}
			if err := c.RecordVShardOwners(ctx, owners, m.cfg.Now()); err != nil {
				return fmt.Errorf("record the flipped map %d on %s: %w", sm.Version(), name, err)
			}
		}
	}
	return nil
}

// ErrNotGiven: a job in cleanup found a source's own record not giving
// the job's vshards to its target (at the flipped version or later), so
// it deletes nothing there — a restored older map, or a later move.
var ErrNotGiven = errors.New("source's record does not give the vshards to the target")

// checkCleanup lets cleanup delete only what each source's own record
// (vshard_owner) gives to the job's target at the job's flipped version or
// later.
func (m *Manager) checkCleanup(ctx context.Context, j *Job) error {
	for _, mv := range j.Moves {
		c, err := m.cluster(ctx, mv.Source)
		if err != nil {
			return err
		}
		rows, err := c.VShardOwners(ctx)
		if err != nil {
			return fmt.Errorf("read the owner record of %s: %w", mv.Source, err)
		}
		byVShard := make(map[uint16]store.VShardOwner, len(rows))
		for _, o := range rows {
			byVShard[uint16(o.VShard)] = o
		}
		for _, v := range mv.VShards {
			o, ok := byVShard[v]
			if !ok || o.Cluster != mv.Target || o.MapVersion < j.FlippedAt {
				return fmt.Errorf("%w: cleanup of job %s on %s: vshard %d is recorded as %s's at map %d, the job gave it to %s at map %d; nothing deleted",
					ErrNotGiven, j.ID, mv.Source, v, o.Cluster, o.MapVersion, mv.Target, j.FlippedAt)
			}
		}
	}
	return nil
}

func queueTable() string {
	for _, t := range store.MoveTables() {
		if t.FrozenOnly {
			return t.Name
		}
	}
	return "message_queue"
}

// deleteAll deletes table's rows of vs on cluster in batches, throttled
// unless the vshards are frozen (the pause is running): then the
// deliveries go by vshard, 10,000 per statement, without reading them
// first.
func (m *Manager) deleteAll(ctx context.Context, cluster string, table string, vs []uint16, throttled bool) error {
	c, err := m.cluster(ctx, cluster)
	if err != nil {
		return err
	}
	if !throttled && table == queueTable() {
		_, err := c.MoveDeleteVShards(ctx, table, vs, 10000)
		return err
	}
	var cur store.MoveCursor
	for {
		keys, next, err := c.MoveReadKeys(ctx, table, vs, cur, m.cfg.BatchRows)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			return nil
		}
		if _, err := c.MoveDelete(ctx, table, keys); err != nil {
			return err
		}
		cur = next
		if throttled {
			m.throttle(ctx, len(keys), cluster)
		}
	}
}

// deleteTarget deletes the job's rows on its targets: the deliveries only
// (queueOnly), or every table, deliveries first.
func (m *Manager) deleteTarget(ctx context.Context, j *Job, queueOnly bool) error {
	tables := []string{queueTable()}
	if !queueOnly {
		for _, t := range store.MoveTables() {
			if !t.FrozenOnly {
				tables = append(tables, t.Name)
			}
		}
	}
	for _, mv := range j.Moves {
		for _, t := range tables {
			// The deliveries go while the vshards may be frozen: not
			// throttled.
			if err := m.deleteAll(ctx, mv.Target, t, mv.VShards, !queueOnly); err != nil {
				return fmt.Errorf("delete %s rows on target %s: %w", t, mv.Target, err)
			}
		}
	}
	return nil
}

// rollback ends a job that has not flipped: the target's deliveries go
// while the vshards may still be frozen, the vshards serve from the source
// again, the target's other rows go, and the job ends in state final.
func (m *Manager) rollback(ctx context.Context, j *Job, final, reason string) error {
	if !beforeCutover(j.State) && j.State != StateAborting {
		return fmt.Errorf("%w: job %s is %s", ErrState, j.ID, j.State)
	}
	if err := m.deleteTarget(ctx, j, true); err != nil {
		return err
	}
	if _, err := m.setFrozen(ctx, j, false); err != nil {
		return err
	}
	m.recordPause(ctx, j, "given_up")
	if err := m.deleteTarget(ctx, j, false); err != nil {
		return err
	}
	_, err := m.update(ctx, j.ID, "", func(j *Job) error {
		now := m.cfg.Now().UTC()
		j.State, j.FinishedAt, j.AbortRequested = final, &now, false
		if reason != "" {
			j.Error = reason
		}
		return nil
	})
	if err == nil {
		m.cfg.Log.Info("reshard job rolled back", "job", j.ID, "state", final, "reason", reason)
	}
	return err
}
