package rebalance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// Mover is what a job needs from a cluster's primary: the statements of
// store/move.go.
type Mover interface {
	MoveCount(ctx context.Context, table string, vshards []uint16) (int64, error)
	MoveRead(ctx context.Context, table string, vshards []uint16, after store.MoveCursor, limit int) ([]store.MoveRow, store.MoveCursor, error)
	MoveReadKeys(ctx context.Context, table string, vshards []uint16, after store.MoveCursor, limit int) ([]store.MoveRow, store.MoveCursor, error)
	MoveWrite(ctx context.Context, table string, rows []store.MoveRow) error
	MoveDelete(ctx context.Context, table string, keys []store.MoveRow) (int64, error)
	MoveDeleteVShards(ctx context.Context, table string, vshards []uint16, limit int) (int64, error)
	MoveBuckets(ctx context.Context, table string, vshards []uint16) (map[uint64]store.MoveBucket, error)
	MoveBucketRows(ctx context.Context, table string, vshards []uint16, bucket uint64, keysOnly bool) ([]store.MoveRow, error)
	VShardLoads(ctx context.Context, since time.Time) (map[uint16]store.VShardLoad, error)
	// The cluster's own record of ownership (store/shard_fence.go).
	RaiseFence(ctx context.Context, version int64, owners []store.VShardOwner, by string, at time.Time) error
	RecordVShardOwners(ctx context.Context, owners []store.VShardOwner, at time.Time) error
	VShardOwners(ctx context.Context) ([]store.VShardOwner, error)
	EndStalledTransactions(ctx context.Context, idle time.Duration) (int, error)
}

var _ Mover = (*store.Store)(nil)

// ShardMaps is what a job needs from the topology backend: the stored map,
// its check-and-set update, and the barrier on every live router.
type ShardMaps interface {
	ShardMap(ctx context.Context) (*routing.Map, error)
	UpdateShardMap(ctx context.Context, prev int64, next *routing.Map) error
	WaitApplied(ctx context.Context, version int64) error
}

var _ ShardMaps = (topology.Backend)(nil)

// Config tunes the jobs. Zero fields take the defaults named.
type Config struct {
	// BatchRows is how many rows one copy or delete statement carries.
	// Defaults to 500.
	BatchRows int
	// RowsPerSecond throttles the copy and the deletes per job, so that
	// the clusters keep serving. Defaults to 20,000; -1 disables.
	RowsPerSecond int
	// ReplicaLag reports the replication lag of a cluster's least-lagged
	// replica (false when unknown or there is none). When set, the copy
	// and the deletes wait after a batch while the cluster they write to
	// lags more than MaxReplicaLag (default 2s), up to 10s per batch.
	ReplicaLag    func(cluster string) (time.Duration, bool)
	MaxReplicaLag time.Duration
	// CatchUpRounds bounds the re-sync rounds before the freeze; the
	// freeze comes earlier when a round changes fewer than CatchUpRows
	// rows. Default 5 and 200.
	CatchUpRounds int
	CatchUpRows   int64
	// FreezeBudget bounds the final sync and verification under freeze;
	// past it the vshards are unfrozen and the job catches up again, up to
	// FreezeRetries times before it fails. Default 1s and 3.
	FreezeBudget  time.Duration
	FreezeRetries int
	// StalledAfter is how long a transaction may stay open while its
	// client sends nothing before a job kills it, ahead of the steps that
	// need the range's locks (store.EndStalledTransactions). Defaults to
	// 15s.
	StalledAfter time.Duration
	// BarrierTimeout bounds the wait for every router to apply a frozen
	// map. Defaults to 30s.
	BarrierTimeout time.Duration
	// Leader elects the router that runs jobs; nil runs them here.
	Leader topology.Leader
	// Sessions opens a leader's own connections to a cluster for its
	// epoch (rebalance/term.go): every statement of a job then runs under
	// the session's time limits, and a new leader kills the connections
	// of older ones before its first step on a cluster. Nil uses the
	// clusters' shared pools as given (no takeover).
	Sessions OpenSession
	// OnState is called after every recorded change of a job's state
	// (tests stop a runner at a chosen step with it).
	OnState func(j *Job)
	Log     *slog.Logger
	Now     func() time.Time
}

func (c Config) withDefaults() Config {
	if c.BatchRows <= 0 {
		c.BatchRows = 500
	}
	if c.RowsPerSecond == 0 {
		c.RowsPerSecond = 20000
	}
	if c.MaxReplicaLag <= 0 {
		c.MaxReplicaLag = 2 * time.Second
	}
	if c.CatchUpRounds <= 0 {
		c.CatchUpRounds = 5
	}
	if c.CatchUpRows <= 0 {
		c.CatchUpRows = 200
	}
	if c.FreezeBudget <= 0 {
		c.FreezeBudget = time.Second
	}
	if c.FreezeRetries <= 0 {
		c.FreezeRetries = 3
	}
	if c.StalledAfter <= 0 {
		c.StalledAfter = 15 * time.Second
	}
	if c.BarrierTimeout <= 0 {
		c.BarrierTimeout = 30 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Manager records jobs and, while its router leads, runs them one at a
// time in the order they were asked for.
type Manager struct {
	cfg      Config
	state    StateStore
	maps     ShardMaps
	clusters func() map[string]Mover

	terms *terms

	pauses *prometheus.HistogramVec // per freeze: how long the vshards stopped serving
	rows   prometheus.Counter       // rows copied, synced and deleted

	wake   chan struct{} // buffered 1: a job was submitted or changed here
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a manager over the state store, the shard maps and the
// clusters' primaries (every cluster of the topology, those that own no
// vshard yet included).
func New(cfg Config, state StateStore, maps ShardMaps, clusters func() map[string]Mover) *Manager {
	cfg = cfg.withDefaults()
	return &Manager{cfg: cfg, state: state, maps: maps, clusters: clusters, wake: make(chan struct{}, 1),
		terms: &terms{open: cfg.Sessions, log: cfg.Log},
		pauses: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardmq_reshard_pause_seconds",
			Help:    "How long the vshards of a resharding job stayed frozen, per freeze (outcome=flipped or given_up); every vshard of a job pauses together.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30}}, []string{"outcome"}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardmq_reshard_rows_total",
			Help: "Rows written by resharding jobs on targets (copy and sync)."}),
	}
}

// Collectors returns the manager's metrics, for the router's registry.
func (m *Manager) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.pauses, m.rows}
}

// Start runs jobs in the background while this router leads, until Stop.
// Safe to call twice.
func (m *Manager) Start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go func() {
		defer close(m.done)
		m.loop(ctx)
	}()
}

// Stop stops running jobs (a job in progress stays recorded at its step
// and resumes under the next runner) and waits for the runner to return.
// Safe to call twice.
func (m *Manager) Stop() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// jobPoll is how often an idle runner looks for jobs submitted through
// other routers.
const jobPoll = time.Second

func (m *Manager) loop(ctx context.Context) {
	for {
		runCtx, cancel := ctx, context.CancelFunc(func() {})
		if l := m.cfg.Leader; l != nil {
			lost, err := l.Leading(ctx)
			if err != nil {
				return
			}
			runCtx, cancel = context.WithCancel(ctx)
			go func() {
				select {
				case <-lost:
				case <-runCtx.Done():
				}
				cancel()
			}()
		}
		if m.cfg.Sessions == nil {
			m.runWhileLeading(runCtx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			continue
		}
		epoch, err := m.newEpoch(runCtx)
		for err != nil && runCtx.Err() == nil {
			m.cfg.Log.Warn("reshard: cannot take a leader epoch; retrying", "err", err)
			ctxwait.Sleep(runCtx, time.Second)
			epoch, err = m.newEpoch(runCtx)
		}
		if err == nil {
			m.cfg.Log.Info("reshard: leading", "epoch", epoch)
			superseded := m.terms.begin(epoch)
			termCtx, stop := context.WithCancel(runCtx)
			go func() {
				select {
				case <-superseded:
				case <-termCtx.Done():
				}
				stop()
			}()
			m.runWhileLeading(termCtx)
			stop()
			m.terms.end()
			// Superseded while the election still says this router
			// leads: wait until it says otherwise rather than take the
			// clusters back from the newer leader.
			<-runCtx.Done()
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

func (m *Manager) runWhileLeading(ctx context.Context) {
	for {
		id, err := m.nextJob(ctx)
		if err != nil {
			m.cfg.Log.Warn("reshard: cannot read jobs", "err", err)
		}
		if id != "" {
			m.run(ctx, id)
		}
		if ctx.Err() != nil {
			return
		}
		if id == "" || err != nil {
			t := time.NewTimer(jobPoll)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-m.wake:
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// nextJob is the oldest unfinished job that is not paused.
func (m *Manager) nextJob(ctx context.Context) (string, error) {
	js, err := m.state.Load(ctx)
	if err != nil {
		return "", err
	}
	for _, j := range js.Jobs {
		if !Terminal(j.State) && (j.State != StatePaused || j.AbortRequested) {
			return j.ID, nil
		}
	}
	return "", nil
}

// errInterrupted: an operator paused or aborted the job under the step.
var errInterrupted = errors.New("interrupted by an operator")

// update changes job id in the state store with check-and-set: fn sees the
// stored job and changes it; a job no longer in state want (when want is
// set) is left alone and errInterrupted returned.
func (m *Manager) update(ctx context.Context, id, want string, fn func(j *Job) error) (*Job, error) {
	return m.updateDoc(ctx, id, want, func(_ *Jobs, j *Job) error { return fn(j) })
}

// updateDoc is update whose fn may also change the rest of the document
// (add a job).
func (m *Manager) updateDoc(ctx context.Context, id, want string, fn func(js *Jobs, j *Job) error) (*Job, error) {
	for attempt := 0; ; attempt++ {
		js, err := m.state.Load(ctx)
		if err != nil {
			return nil, err
		}
		var j *Job
		for _, x := range js.Jobs {
			if x.ID == id {
				j = x
			}
		}
		if j == nil {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		if want != "" && (j.State != want || j.AbortRequested) {
			return j, errInterrupted
		}
		before := j.State
		if err := fn(js, j); err != nil {
			return j, err
		}
		err = m.state.Save(ctx, js.Version, js)
		if errors.Is(err, ErrConflict) && attempt < 20 {
			continue
		}
		if err != nil {
			return nil, err
		}
		if j.State != before && m.cfg.OnState != nil {
			m.cfg.OnState(j.clone())
		}
		return j, nil
	}
}

// Submit plans ranges and, unless dryRun, records a new job (state
// pending) for the leader to run. It returns the job (nil on a dry run)
// and the plan.
func (m *Manager) Submit(ctx context.Context, ranges []Range, dryRun bool) (*Job, []Move, error) {
	cur, err := m.maps.ShardMap(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read shard map: %w", err)
	}
	known := map[string]bool{}
	for name := range m.clusters() {
		known[name] = true
	}
	for attempt := 0; attempt < 20; attempt++ {
		js, err := m.state.Load(ctx)
		if err != nil {
			return nil, nil, err
		}
		busy := map[uint16]string{}
		for _, j := range js.Jobs {
			if !Terminal(j.State) {
				for v := range j.vshards() {
					busy[v] = j.ID
				}
			}
		}
		moves, err := Plan(ranges, cur, known, busy)
		if err != nil || dryRun {
			return nil, moves, err
		}
		j := &Job{ID: newJobID(m.cfg.Now()), State: StatePending, Ranges: ranges, Moves: moves,
			StartedAt: m.cfg.Now().UTC(), Cursors: map[string]store.MoveCursor{}}
		js.Jobs = append(js.Jobs, j)
		err = m.state.Save(ctx, js.Version, js)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		m.cfg.Log.Info("reshard job submitted", "job", j.ID, "moves", len(moves))
		m.poke()
		return j.clone(), moves, nil
	}
	return nil, nil, fmt.Errorf("submit reshard job: %w", ErrConflict)
}

func newJobID(now time.Time) string {
	var b [4]byte
	rand.Read(b[:])
	return "rs-" + now.UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// Get returns job id.
func (m *Manager) Get(ctx context.Context, id string) (*Job, error) {
	js, err := m.state.Load(ctx)
	if err != nil {
		return nil, err
	}
	for _, j := range js.Jobs {
		if j.ID == id {
			return j, nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
}

// List returns every recorded job, newest first.
func (m *Manager) List(ctx context.Context) ([]*Job, error) {
	js, err := m.state.Load(ctx)
	if err != nil {
		return nil, err
	}
	out := append([]*Job(nil), js.Jobs...)
	sort.SliceStable(out, func(a, b int) bool { return out[a].StartedAt.After(out[b].StartedAt) })
	return out, nil
}

// beforeFreeze: states an operator may pause in.
func beforeFreeze(s string) bool {
	return s == StatePending || s == StateCopying || s == StateCatchingUp
}

// beforeCutover: states an abort rolls back from (the source still owns
// the vshards).
func beforeCutover(s string) bool {
	return beforeFreeze(s) || s == StateFreezing || s == StateFrozen || s == StatePaused
}

// Pause holds a job that has not frozen its vshards yet.
func (m *Manager) Pause(ctx context.Context, id string) (*Job, error) {
	j, err := m.update(ctx, id, "", func(j *Job) error {
		if j.State == StatePaused {
			return nil
		}
		if !beforeFreeze(j.State) || j.AbortRequested {
			return fmt.Errorf("%w: a job %s cannot be paused", ErrState, j.State)
		}
		j.Resume, j.State = j.State, StatePaused
		return nil
	})
	m.poke()
	return j, err
}

// Resume continues a paused job.
func (m *Manager) Resume(ctx context.Context, id string) (*Job, error) {
	j, err := m.update(ctx, id, "", func(j *Job) error {
		if j.State != StatePaused {
			return fmt.Errorf("%w: a job %s is not paused", ErrState, j.State)
		}
		j.State, j.Resume = j.Resume, ""
		return nil
	})
	m.poke()
	return j, err
}

// Abort rolls a job back. Before the flip the source keeps serving and the
// rows copied to the target are removed. After the flip (cutover,
// cleanup) it means a reverse move: the job finishes its cleanup, ends
// aborted, and a new job moves the vshards back (ReversedBy names it). A
// finished job is refused (ErrState): submit the reverse move.
func (m *Manager) Abort(ctx context.Context, id string) (*Job, error) {
	j, err := m.update(ctx, id, "", func(j *Job) error {
		if j.State == StateAborting || j.State == StateAborted || j.ReverseRequested {
			return nil
		}
		if j.State == StateCutover || j.State == StateCleanup {
			j.ReverseRequested = true
			j.Error = "abort requested after the flip: the vshards move back once the cleanup is done"
			return nil
		}
		if !beforeCutover(j.State) {
			return fmt.Errorf("%w: a job %s is finished; move the vshards back with a new job", ErrState, j.State)
		}
		j.AbortRequested = true
		j.State = StateAborting
		return nil
	})
	m.poke()
	return j, err
}

// PlanRanges turns an operator's intent into explicit ranges against the
// stored shard map: addCluster takes an even share (PlanAdd), drain gives
// all of its vshards to the other owning clusters (PlanDrain).
func (m *Manager) PlanRanges(ctx context.Context, addCluster, drain string) ([]Range, error) {
	cur, err := m.maps.ShardMap(ctx)
	if err != nil {
		return nil, fmt.Errorf("read shard map: %w", err)
	}
	known := m.clusters()
	switch {
	case addCluster != "" && drain != "":
		return nil, fmt.Errorf("%w: add_cluster and drain exclude each other", ErrInvalid)
	case addCluster != "":
		if _, ok := known[addCluster]; !ok {
			return nil, fmt.Errorf("%w: unknown cluster %q (add it to the topology first)", ErrInvalid, addCluster)
		}
		if out := PlanAdd(cur, addCluster, m.weights(ctx, cur)); len(out) > 0 {
			return out, nil
		}
		return nil, fmt.Errorf("%w: cluster %s already owns its share", ErrInvalid, addCluster)
	case drain != "":
		if len(cur.VShards(drain)) == 0 {
			return nil, fmt.Errorf("%w: cluster %q owns no vshards", ErrInvalid, drain)
		}
		if out := PlanDrain(cur, drain, nil, m.weights(ctx, cur)); len(out) > 0 {
			return out, nil
		}
		return nil, fmt.Errorf("%w: no other cluster owns vshards to take those of %s", ErrInvalid, drain)
	}
	return nil, nil
}

// weights weighs every vshard by what its owner holds: 1 + its messages +
// its messages of the last hour (recent writes count twice). A cluster
// that does not answer leaves its vshards at weight 1.
func (m *Manager) weights(ctx context.Context, cur *routing.Map) Weights {
	w := Weights{}
	since := m.cfg.Now().Add(-time.Hour)
	for name, c := range m.clusters() {
		loads, err := c.VShardLoads(ctx, since)
		if err != nil {
			m.cfg.Log.Warn("reshard planner: cannot weigh the vshards of a cluster; counting them", "cluster", name, "err", err)
			continue
		}
		for v, l := range loads {
			if owner, _ := cur.Lookup(shard.ID(v)); owner == name {
				w[v] = float64(1 + l.Messages + l.Recent)
			}
		}
	}
	return w
}
