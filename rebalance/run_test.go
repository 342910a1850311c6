package rebalance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// The job's state machine (run.go) over the fakes of fake_test.go: each
// step, a new runner resuming from each recorded state, the failure and
// abort paths, and cleanup's check of the source's own record. No
// database: `make test-fast` runs these.

// stepTo takes job id one step at a time with m until it is in state.
func stepTo(t *testing.T, w *world, m *Manager, id, state string) *Job {
	t.Helper()
	for range 10 {
		j := w.job(t, m, id)
		if j.State == state {
			return j
		}
		if err := m.step(t.Context(), j); err != nil {
			t.Fatalf("step from %s: %v", j.State, err)
		}
	}
	t.Fatalf("job %s never reached %s", id, state)
	return nil
}

// queueOnly and copied are the tables copied under the freeze and before.
func queueOnly() []string { return []string{queueTable()} }

func copiedBeforeFreeze() []string {
	var out []string
	for _, t := range store.MoveTables() {
		if !t.FrozenOnly {
			out = append(out, t.Name)
		}
	}
	return out
}

func checkOwners(t *testing.T, c *fakeCluster, cluster string, version int64) {
	t.Helper()
	for _, v := range moving {
		if o := c.owner(int(v)); o.Cluster != cluster || o.MapVersion != version {
			t.Fatalf("%s records vshard %d as %s's at map %d, want %s's at %d", c.name, v, o.Cluster, o.MapVersion, cluster, version)
		}
	}
}

// Each step does its part and records the next state.
func TestEachStep(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, sleeps := w.manager(config())
	id := w.submit(t, m).ID
	all := int64(len(allTables()) * rowsPerTable)
	before := int64(len(copiedBeforeFreeze()) * rowsPerTable)
	for _, tc := range []struct {
		from, to string
		check    func(t *testing.T, j *Job)
	}{
		{StatePending, StateCopying, func(t *testing.T, j *Job) {
			if j.RowsTotal != all || j.RowsCopied != 0 {
				t.Fatalf("counted %d rows (copied %d), want %d", j.RowsTotal, j.RowsCopied, all)
			}
			w.checkRows(t, "c3", moving, allTables(), false)
		}},
		{StateCopying, StateCatchingUp, func(t *testing.T, j *Job) {
			w.checkRows(t, "c3", moving, copiedBeforeFreeze(), true)
			w.checkRows(t, "c3", moving, queueOnly(), false) // claimable: only under the freeze
			w.checkRows(t, "c3", []uint16{100}, allTables(), false)
			if j.RowsCopied != before {
				t.Fatalf("copied %d rows, want %d", j.RowsCopied, before)
			}
			for _, table := range copiedBeforeFreeze() {
				if cur := j.Cursors["c1/c3/"+table]; !equalCursor(cur, doneCursor) {
					t.Fatalf("cursor of %s: %q, want done", table, cur)
				}
			}
			if c := w.clusters["c1"].count("MoveRead"); c < 2*len(copiedBeforeFreeze()) {
				t.Fatalf("%d reads: the copy did not go in batches of %d", c, config().BatchRows)
			}
			w.checkMap(t, "c1", routing.Serving)
		}},
		{StateCatchingUp, StateFreezing, func(t *testing.T, j *Job) {
			if j.FrozenAt == nil {
				t.Fatal("no FrozenAt recorded before the freeze")
			}
			w.checkMap(t, "c1", routing.Serving)
		}},
		{StateFreezing, StateFrozen, func(t *testing.T, j *Job) {
			w.checkMap(t, "c1", routing.Frozen)
			if v := w.maps.current().Version(); j.FencedAt != v || v != 2 {
				t.Fatalf("fenced at %d, frozen map %d; want 2", j.FencedAt, v)
			}
			if f := w.clusters["c1"].fence; f != 2 {
				t.Fatalf("c1's fence at %d, want 2", f)
			}
			checkOwners(t, w.clusters["c1"], "c1", 2)
		}},
		{StateFrozen, StateCutover, func(t *testing.T, j *Job) {
			w.checkRows(t, "c3", moving, allTables(), true)
			if j.RowsTotal != all || j.RowsCopied != all {
				t.Fatalf("verified %d of %d rows, want %d", j.RowsCopied, j.RowsTotal, all)
			}
			for _, table := range allTables() {
				if j.Verified[table] != rowsPerTable {
					t.Fatalf("verified %v, want %d rows of each table", j.Verified, rowsPerTable)
				}
			}
		}},
		{StateCutover, StateCleanup, func(t *testing.T, j *Job) {
			w.checkMap(t, "c3", routing.Serving)
			if v := w.maps.current().Version(); j.FlippedAt != v || v != 3 {
				t.Fatalf("flipped at %d, map %d; want 3", j.FlippedAt, v)
			}
			w.checkRows(t, "c1", moving, queueOnly(), false)
			w.checkRows(t, "c1", moving, copiedBeforeFreeze(), true)
			checkOwners(t, w.clusters["c1"], "c3", 3)
			checkOwners(t, w.clusters["c3"], "c3", 3)
			if j.FrozenAt != nil || j.MaxPauseMS < 0 {
				t.Fatalf("pause not recorded: frozen at %v, max %d ms", j.FrozenAt, j.MaxPauseMS)
			}
		}},
		{StateCleanup, StateDone, func(t *testing.T, j *Job) {
			w.checkMoved(t)
			if j.FinishedAt == nil || j.Error != "" {
				t.Fatalf("finished at %v, error %q", j.FinishedAt, j.Error)
			}
		}},
	} {
		j := w.job(t, m, id)
		if j.State != tc.from {
			t.Fatalf("job is %s, want %s", j.State, tc.from)
		}
		if err := m.step(t.Context(), j); err != nil {
			t.Fatalf("step from %s: %v", tc.from, err)
		}
		j = w.job(t, m, id)
		if j.State != tc.to {
			t.Fatalf("step from %s: job is %s, want %s (%s)", tc.from, j.State, tc.to, j.Error)
		}
		tc.check(t, j)
	}
	if len(w.maps.written) != 2 {
		t.Fatalf("%d maps written, want 2 (frozen, flipped)", len(w.maps.written))
	}
	if len(*sleeps) != 0 {
		t.Fatalf("waited %v with no failure", *sleeps)
	}
}

// A new runner (a new leader, a restarted router) takes a job from any
// recorded state to the end.
func TestResumeFromEachState(t *testing.T) {
	t.Parallel()
	for _, state := range []string{StatePending, StateCopying, StateCatchingUp, StateFreezing, StateFrozen, StateCutover, StateCleanup} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			first, _ := w.manager(config())
			id := w.submit(t, first).ID
			stepTo(t, w, first, id, state)
			next, sleeps := w.manager(config())
			next.run(t.Context(), id)
			if j := w.job(t, next, id); j.State != StateDone {
				t.Fatalf("resumed from %s: job ends %s (%s)", state, j.State, j.Error)
			}
			w.checkMoved(t)
			if len(w.maps.written) != 2 || len(*sleeps) != 0 {
				t.Fatalf("resumed from %s: %d maps written (want 2), waits %v", state, len(w.maps.written), *sleeps)
			}
		})
	}
}

// A runner that stopped inside a step (its router died, an error) left
// part of the step done; the next runner finishes it without redoing
// what must happen once (a second freeze, a second flip).
func TestResumeAfterAStepStoppedHalfway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, state string
		cluster, op string
		after       int // calls of op that succeed first
		check       func(t *testing.T, w *world, j *Job)
	}{
		{"copy after some batches", StateCopying, "c3", "MoveWrite", 3, func(t *testing.T, w *world, j *Job) {
			if j.RowsCopied == 0 || j.RowsCopied >= int64(len(copiedBeforeFreeze())*rowsPerTable) {
				t.Fatalf("copied %d rows before the stop", j.RowsCopied)
			}
		}},
		{"freeze after the frozen map", StateFreezing, "c1", "RaiseFence", 0, func(t *testing.T, w *world, j *Job) {
			w.checkMap(t, "c1", routing.Frozen)
		}},
		{"final sync halfway", StateFrozen, "c3", "MoveBuckets", 2, nil},
		{"cutover after the flip", StateCutover, "c1", "RecordVShardOwners", 0, func(t *testing.T, w *world, j *Job) {
			w.checkMap(t, "c3", routing.Serving)
		}},
		{"cleanup after some deletes", StateCleanup, "c1", "MoveDelete", 2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			first, _ := w.manager(config())
			id := w.submit(t, first).ID
			j := stepTo(t, w, first, id, tc.state)
			// The runner stops as a leader does that loses its term: its
			// context ends in the middle of the step.
			ctx, stop := context.WithCancel(t.Context())
			calls := 0
			w.clusters[tc.cluster].setInject(func(op, _ string) error {
				if op != tc.op {
					return nil
				}
				if calls++; calls > tc.after {
					stop()
					return ctx.Err()
				}
				return nil
			})
			if err := first.step(ctx, j); !errors.Is(err, context.Canceled) {
				t.Fatalf("step from %s: %v, want the runner stopped", tc.state, err)
			}
			w.clusters[tc.cluster].setInject(nil)
			j = w.job(t, first, id)
			if j.State != tc.state {
				t.Fatalf("after the stop the job is %s, want %s", j.State, tc.state)
			}
			if tc.check != nil {
				tc.check(t, w, j)
			}
			next, _ := w.manager(config())
			next.run(t.Context(), id)
			if j := w.job(t, next, id); j.State != StateDone {
				t.Fatalf("job ends %s (%s)", j.State, j.Error)
			}
			w.checkMoved(t)
			if len(w.maps.written) != 2 {
				t.Fatalf("%d maps written, want 2 (frozen, flipped)", len(w.maps.written))
			}
		})
	}
}

// An abort before the flip rolls back from every state: the source keeps
// every row and serves, the target keeps none.
func TestAbortBeforeTheFlip(t *testing.T) {
	t.Parallel()
	for _, state := range []string{StatePending, StateCopying, StateCatchingUp, StateFreezing, StateFrozen, StatePaused} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			m, _ := w.manager(config())
			id := w.submit(t, m).ID
			if state == StatePaused {
				stepTo(t, w, m, id, StateCatchingUp)
				if _, err := m.Pause(t.Context(), id); err != nil {
					t.Fatal(err)
				}
			} else {
				stepTo(t, w, m, id, state)
			}
			j, err := m.Abort(t.Context(), id)
			if err != nil || j.State != StateAborting || !j.AbortRequested {
				t.Fatalf("abort: %+v %v", j, err)
			}
			next, _ := w.manager(config())
			next.run(t.Context(), id)
			j = w.job(t, next, id)
			if j.State != StateAborted || j.AbortRequested || j.FinishedAt == nil {
				t.Fatalf("aborted from %s: %s, abort requested %v, finished %v (%s)", state, j.State, j.AbortRequested, j.FinishedAt, j.Error)
			}
			w.checkRolledBack(t)
			if _, err := m.Abort(t.Context(), id); err != nil {
				t.Fatalf("second abort: %v", err)
			}
		})
	}
}

// An abort after the flip finishes the cleanup and records the reverse
// move as a new job, which brings everything back.
func TestAbortAfterTheFlipMovesBack(t *testing.T) {
	t.Parallel()
	for _, state := range []string{StateCutover, StateCleanup} {
		t.Run(state, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			m, _ := w.manager(config())
			id := w.submit(t, m).ID
			stepTo(t, w, m, id, state)
			j, err := m.Abort(t.Context(), id)
			if err != nil || j.State != state || !j.ReverseRequested {
				t.Fatalf("abort: %+v %v", j, err)
			}
			m.run(t.Context(), id)
			j = w.job(t, m, id)
			if j.State != StateAborted || j.ReversedBy == "" {
				t.Fatalf("job ends %s, reversed by %q (%s)", j.State, j.ReversedBy, j.Error)
			}
			w.checkMoved(t)
			back := w.job(t, m, j.ReversedBy)
			want := []Move{{Source: "c3", Target: "c1", VShards: moving}}
			if back.State != StatePending || len(back.Moves) != 1 || back.Moves[0].Source != "c3" || back.Moves[0].Target != "c1" ||
				!slices.Equal(back.Moves[0].VShards, moving) || len(back.Ranges) != 1 || back.Ranges[0] != (Range{From: 0, To: 7, Target: "c1"}) {
				t.Fatalf("reverse job %+v, want pending with moves %+v", back, want)
			}
			m.run(t.Context(), back.ID)
			if back = w.job(t, m, back.ID); back.State != StateDone {
				t.Fatalf("reverse job ends %s (%s)", back.State, back.Error)
			}
			w.checkRolledBack(t)
			if _, err := m.Abort(t.Context(), back.ID); !errors.Is(err, ErrState) {
				t.Fatalf("abort of a finished job: %v, want ErrState", err)
			}
		})
	}
}

// A barrier that routers do not pass gives the freeze up (the vshards
// serve from the source again) and the job catches up and freezes again,
// failing, rolled back, after FreezeRetries.
func TestBarrierNotPassedGivesTheFreezeUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cfg := config()
	cfg.FreezeRetries = 2
	m, _ := w.manager(cfg)
	id := w.submit(t, m).ID
	j := stepTo(t, w, m, id, StateFreezing)
	w.maps.setBarrier(func(int64) error { return errors.New("router r2 is still on map 1") })
	if err := m.step(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	j = w.job(t, m, id)
	if j.State != StateCatchingUp || j.FreezeAttempts != 1 || !strings.Contains(j.Error, "routers did not apply the frozen map") || j.MaxPauseMS < 0 || j.FrozenAt != nil {
		t.Fatalf("after a failed barrier: %s, %d attempts, %q", j.State, j.FreezeAttempts, j.Error)
	}
	w.checkMap(t, "c1", routing.Serving)

	m.run(t.Context(), id)
	j = w.job(t, m, id)
	if j.State != StateFailed || j.FreezeAttempts != 2 || !strings.Contains(j.Error, "gave up after 2 freezes") {
		t.Fatalf("job ends %s after %d freezes (%s)", j.State, j.FreezeAttempts, j.Error)
	}
	w.checkRolledBack(t)
}

// After a barrier that failed once, the job freezes again and ends.
func TestBarrierPassedOnTheSecondFreeze(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	failed := false
	w.maps.setBarrier(func(int64) error {
		if failed {
			return nil
		}
		failed = true
		return errors.New("router r2 is still on map 1")
	})
	m.run(t.Context(), id)
	j := w.job(t, m, id)
	if j.State != StateDone || j.FreezeAttempts != 1 {
		t.Fatalf("job ends %s after %d given-up freezes (%s)", j.State, j.FreezeAttempts, j.Error)
	}
	w.checkMoved(t)
	// Frozen, unfrozen, frozen again, flipped.
	if len(w.maps.written) != 4 {
		t.Fatalf("%d maps written, want 4", len(w.maps.written))
	}
}

// A final sync that does not converge (the source keeps changing under
// the freeze) gives the freeze up, the target's deliveries removed; the
// job then catches up and ends with the source's rows as they are.
func TestFinalSyncNotConvergingGivesTheFreezeUp(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	j := stepTo(t, w, m, id, StateFrozen)
	src := w.clusters["c1"]
	n := 0
	src.setInject(func(op, table string) error {
		// Row 0 changes before every scan and every comparison.
		if table == "message_store" && (op == "MoveBuckets" || op == "MoveBucketKeys") {
			n++
			row := testRow(table, 0, moving[0])
			row[colOf(table, "payload")] = []byte(fmt.Sprint("changed-", n))
			src.mu.Lock()
			src.put(table, row)
			src.mu.Unlock()
		}
		return nil
	})
	if err := m.step(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	src.setInject(nil)
	j = w.job(t, m, id)
	if j.State != StateCatchingUp || j.FreezeAttempts != 1 || !strings.Contains(j.Error, "final sync did not converge") {
		t.Fatalf("after a final sync that did not converge: %s, %d attempts, %q", j.State, j.FreezeAttempts, j.Error)
	}
	w.checkMap(t, "c1", routing.Serving)
	w.checkRows(t, "c3", moving, queueOnly(), false)

	want := map[string]map[string]string{}
	for _, table := range allTables() {
		want[table] = src.snapshot(table, moving)
	}
	m.run(t.Context(), id)
	if j = w.job(t, m, id); j.State != StateDone {
		t.Fatalf("job ends %s (%s)", j.State, j.Error)
	}
	w.checkMap(t, "c3", routing.Serving)
	for _, table := range allTables() {
		if got := w.clusters["c3"].snapshot(table, moving); !mapsEqual(got, want[table]) {
			t.Fatalf("%s on the target differs from the source's last rows", table)
		}
	}
	w.checkRows(t, "c1", moving, allTables(), false)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A step that fails is retried after a growing wait; a job that failed
// ten times before the flip is rolled back and ends failed.
func TestFailingStepsAreRetriedThenFail(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fails  int // then it works; -1 never
		state  string
		sleeps []time.Duration
	}{
		{"transient", 2, StateDone, []time.Duration{500 * time.Millisecond, time.Second}},
		{"lasting", -1, StateFailed, []time.Duration{500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second,
			2500 * time.Millisecond, 3 * time.Second, 3500 * time.Millisecond, 4 * time.Second, 4500 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			m, sleeps := w.manager(config())
			id := w.submit(t, m).ID
			n := 0
			w.clusters["c3"].setInject(func(op, _ string) error {
				if op == "MoveWrite" && (tc.fails < 0 || n < tc.fails) {
					n++
					return errors.New("c3 is down")
				}
				return nil
			})
			m.run(t.Context(), id)
			j := w.job(t, m, id)
			if j.State != tc.state {
				t.Fatalf("job ends %s, want %s (%s)", j.State, tc.state, j.Error)
			}
			if !slices.Equal(*sleeps, tc.sleeps) {
				t.Fatalf("waited %v, want %v", *sleeps, tc.sleeps)
			}
			if tc.state == StateFailed {
				if !strings.Contains(j.Error, "c3 is down") {
					t.Fatalf("error %q does not say why", j.Error)
				}
				w.checkRolledBack(t)
			} else {
				w.checkMoved(t)
			}
		})
	}
}

// Cleanup deletes a source's rows only while the source's own record
// gives the vshards to the target at the flipped version or later, checked
// before it starts and again by every delete.
func TestCleanupChecksTheSourceRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		record func(c *fakeCluster, flipped int64)
		// during changes the record after the check, before the first
		// delete (a runner that stalled past its check).
		during func(c *fakeCluster, flipped int64)
		want   error
	}{
		{"record gives them to the target", nil, nil, nil},
		{"a later map gave them back", func(c *fakeCluster, flipped int64) { c.setOwners(moving, "c1", flipped+1) }, nil, ErrNotGiven},
		{"an older map restored", func(c *fakeCluster, flipped int64) { c.setOwners(moving, "c3", flipped-1) }, nil, ErrNotGiven},
		{"one vshard not given", func(c *fakeCluster, flipped int64) { c.setOwners(moving[3:4], "c2", flipped) }, nil, ErrNotGiven},
		{"no record", func(c *fakeCluster, _ int64) {
			c.mu.Lock()
			defer c.mu.Unlock()
			clear(c.owners)
		}, nil, ErrNotGiven},
		{"given back after the check", nil, func(c *fakeCluster, flipped int64) { c.setOwners(moving, "c1", flipped+1) }, store.ErrNotOwnerRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			m, _ := w.manager(config())
			id := w.submit(t, m).ID
			j := stepTo(t, w, m, id, StateCleanup)
			src := w.clusters["c1"]
			if tc.record != nil {
				tc.record(src, j.FlippedAt)
			}
			if tc.during != nil {
				src.setInject(func(op, _ string) error {
					if op == "MoveReadKeys" {
						src.setInject(nil)
						tc.during(src, j.FlippedAt)
					}
					return nil
				})
			}
			err := m.step(t.Context(), j)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				w.checkMoved(t)
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("cleanup: %v, want %v", err, tc.want)
			}
			if j := w.job(t, m, id); j.State != StateCleanup {
				t.Fatalf("job is %s after a refused cleanup", j.State)
			}
			w.checkRows(t, "c1", moving, copiedBeforeFreeze(), true)
		})
	}
}

// An operator's pause stops the copy at its next batch; the job resumes
// where it stopped.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	writes := 0
	w.clusters["c3"].setInject(func(op, _ string) error {
		if op == "MoveWrite" {
			if writes++; writes == 2 {
				if _, err := m.Pause(t.Context(), id); err != nil {
					t.Error(err)
				}
			}
		}
		return nil
	})
	m.run(t.Context(), id)
	j := w.job(t, m, id)
	if j.State != StatePaused || j.Resume != StateCopying {
		t.Fatalf("after a pause: %s (resume to %q)", j.State, j.Resume)
	}
	if writes != 2 {
		t.Fatalf("%d batches written, want the copy stopped after the second", writes)
	}
	copied := j.RowsCopied
	if _, err := m.Resume(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	m.run(t.Context(), id)
	if j = w.job(t, m, id); j.State != StateDone || j.RowsCopied < copied {
		t.Fatalf("resumed job ends %s, %d rows copied (%d before the pause) (%s)", j.State, j.RowsCopied, copied, j.Error)
	}
	w.checkMoved(t)
	if _, err := m.Pause(t.Context(), id); !errors.Is(err, ErrState) {
		t.Fatalf("pause of a finished job: %v, want ErrState", err)
	}
	if _, err := m.Resume(t.Context(), id); !errors.Is(err, ErrState) {
		t.Fatalf("resume of a job not paused: %v, want ErrState", err)
	}
}

// No pause once the vshards are frozen: the pause would hold them.
func TestNoPauseFromTheFreezeOn(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	for _, state := range []string{StateFreezing, StateFrozen, StateCutover, StateCleanup} {
		stepTo(t, w, m, id, state)
		if _, err := m.Pause(t.Context(), id); !errors.Is(err, ErrState) {
			t.Fatalf("pause of a job %s: %v, want ErrState", state, err)
		}
	}
}

// A runner that a newer leader superseded stops at once, counting no
// failure and recording nothing.
func TestSupersededRunnerStops(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, sleeps := w.manager(config())
	id := w.submit(t, m).ID
	w.clusters["c1"].setInject(func(op, _ string) error {
		return fmt.Errorf("count rows: %w", store.ErrSuperseded)
	})
	m.run(t.Context(), id)
	if j := w.job(t, m, id); j.State != StatePending || j.Error != "" || len(*sleeps) != 0 {
		t.Fatalf("superseded runner left the job %s (%q), waited %v", j.State, j.Error, *sleeps)
	}
}

// A freeze refuses a shard map that no longer gives the job's vshards to
// its source, writing nothing.
func TestFreezeRefusesAMapChangedUnderTheJob(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	j := stepTo(t, w, m, id, StateFreezing)
	moved, err := w.maps.current().With(2, []shard.ID{3}, "c2", routing.Serving)
	if err != nil {
		t.Fatal(err)
	}
	w.maps.set(moved)
	if err := m.step(t.Context(), j); err == nil || !strings.Contains(err.Error(), "vshard 3 is owned by c2") {
		t.Fatalf("freeze over a changed map: %v", err)
	}
	if w.maps.current() != moved || len(w.maps.written) != 0 {
		t.Fatalf("a map was written over the changed one")
	}
}

// A check-and-set conflict on the shard map (another writer in between)
// is retried with the map read again.
func TestFreezeRetriesAShardMapConflict(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	m, _ := w.manager(config())
	id := w.submit(t, m).ID
	j := stepTo(t, w, m, id, StateFreezing)
	// Another writer's map 2 (vshard 900 frozen on c2) lands between the
	// job's read and its write.
	cm := &conflictingMaps{fakeMaps: w.maps}
	m.maps = cm
	if err := m.step(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	w.checkMap(t, "c1", routing.Frozen)
	if c, st := w.maps.current().Lookup(900); c != "c2" || st != routing.Frozen || w.maps.current().Version() != 3 {
		t.Fatalf("the other writer's change was lost: vshard 900 %s %v at map %d", c, st, w.maps.current().Version())
	}
}

// conflictingMaps writes another map just before the first update.
type conflictingMaps struct {
	*fakeMaps
	done bool
}

func (c *conflictingMaps) UpdateShardMap(ctx context.Context, prev int64, next *routing.Map) error {
	if !c.done {
		c.done = true
		cur := c.current()
		other, err := cur.With(cur.Version()+1, []shard.ID{900}, "", routing.Frozen)
		if err != nil {
			return err
		}
		if err := c.fakeMaps.UpdateShardMap(ctx, cur.Version(), other); err != nil {
			return err
		}
	}
	return c.fakeMaps.UpdateShardMap(ctx, prev, next)
}
