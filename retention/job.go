package retention

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/store"
)

// Job names, as metrics, stats and logs name them.
const (
	JobPartitions = "partitions"
	JobWarm       = "warm"
	JobCold       = "cold"
	JobUpkeep     = "upkeep"
)

// Deps are what the jobs need from the router.
type Deps struct {
	// Hot returns each hot cluster's primary by cluster name.
	Hot func() map[string]*store.Store
	// Archive returns the archive cluster's primary; nil when the
	// topology names none (the warm and cold jobs then wait).
	Archive func() *store.Store
	// ArchiveNamed says whether the topology names an archive cluster
	// (Archive is then nil only while it cannot be reached). Nil: when
	// Archive answers one.
	ArchiveNamed func() bool
	// Leading says whether this router runs the jobs now. Nil: always.
	Leading func() bool
	// Moving says whether a resharding job is moving vshards: the warm
	// copy waits (a vshard's rows may be on two clusters meanwhile). Nil:
	// never.
	Moving func() bool
}

// Job runs the retention jobs. Start/Stop run them every Config.Every;
// the step methods (Partitions, Warm, Cold, Upkeep) run one pass each,
// for tests and operators.
type Job struct {
	cfg  Config
	deps Deps
	// run serializes passes: the loop and operator commands never overlap.
	run sync.Mutex

	mu      sync.Mutex
	status  map[string]*JobStatus
	blocked map[string]Blocked // by cluster

	rows     *prometheus.CounterVec
	items    *prometheus.CounterVec
	runs     *prometheus.CounterVec
	lastOK   *prometheus.GaugeVec
	held     *prometheus.GaugeVec
	ahead    *prometheus.GaugeVec
	stopOnce sync.Once
	cancel   context.CancelFunc
	done     chan struct{}
}

// JobStatus is one job's record on this router.
type JobStatus struct {
	Runs      int64     `json:"runs"`
	Failures  int64     `json:"failures"`
	LastRun   time.Time `json:"last_run"`
	LastOK    time.Time `json:"last_ok"`
	LastError string    `json:"last_error,omitempty"`
	// Rows moved (copied, exported, restored) and items done (partitions
	// created or dropped, files written, tables analyzed or rebuilt) in
	// all passes.
	Rows  int64 `json:"rows"`
	Items int64 `json:"items"`
}

// Blocked is a month that stays hot past the hot window, and why.
type Blocked struct {
	Cluster string `json:"cluster"`
	Month   string `json:"month"`
	Reason  string `json:"reason"`
	// LiveDeliveries counts (up to 1000) deliveries of its messages still
	// in the queue.
	LiveDeliveries int64 `json:"live_deliveries,omitempty"`
}

// Status is what GET /v1/admin/stats shows of retention.
type Status struct {
	Enabled bool `json:"enabled"`
	Leading bool `json:"leading"`
	Archive bool `json:"archive_cluster"`
	// ArchiveState is the archive cluster's health as this router sees
	// it: ok (connected), unreachable (the topology names one that
	// cannot be reached now: the warm and cold jobs wait) or none (the
	// topology names none: months past the hot window stay hot).
	ArchiveState string `json:"archive_state"`
	// Tiers are the months each tier holds now by the windows (months
	// held hot past the window are in Blocked).
	Tiers      []Tier               `json:"tiers"`
	HotMonths  int                  `json:"hot_months"`
	WarmMonths int                  `json:"warm_months"`
	Ahead      int                  `json:"ahead_months"`
	ColdDir    string               `json:"cold_dir"`
	Jobs       map[string]JobStatus `json:"jobs"`
	Blocked    []Blocked            `json:"blocked"`
}

// Tier is the months one tier holds: hot (the clusters), warm (the archive
// cluster) or cold (files); From is empty for cold (every older month).
type Tier struct {
	Tier  string `json:"tier"`
	From  string `json:"from,omitempty"`
	To    string `json:"to"`
	Where string `json:"where"`
}

// tiers are the windows' months at now.
func (c Config) tiers(now time.Time) []Tier {
	cur := store.MonthOf(now)
	hot := cur.AddDate(0, -c.HotMonths, 0)
	warm := cur.AddDate(0, -c.WarmMonths, 0)
	return []Tier{
		{Tier: "hot", From: monthText(hot), To: monthText(cur), Where: "each message's cluster"},
		{Tier: "warm", From: monthText(warm), To: monthText(hot.AddDate(0, -1, 0)), Where: "the archive cluster"},
		{Tier: "cold", To: monthText(warm.AddDate(0, -1, 0)), Where: "files under " + c.ColdDir},
	}
}

// New returns the jobs; cfg is filled with its defaults.
func New(cfg Config, deps Deps) (*Job, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if deps.Hot == nil {
		return nil, errors.New("retention: Deps.Hot is required")
	}
	if deps.Archive == nil {
		deps.Archive = func() *store.Store { return nil }
	}
	if deps.Leading == nil {
		deps.Leading = func() bool { return true }
	}
	if deps.Moving == nil {
		deps.Moving = func() bool { return false }
	}
	j := &Job{cfg: cfg, deps: deps, status: map[string]*JobStatus{}, blocked: map[string]Blocked{},
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_retention_rows_total",
			Help: "Rows moved by the retention jobs: copied to the warm tier (warm), exported to files (cold), restored from files (restore)."}, []string{"task"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_retention_items_total",
			Help: "Things the retention jobs finished: partitions created or dropped, files written, tables analyzed, partitions rebuilt."}, []string{"task", "what"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_retention_runs_total",
			Help: "Passes of each retention job by result (ok, error)."}, []string{"task", "result"}),
		lastOK: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardmq_retention_last_success_timestamp_seconds",
			Help: "When each retention job last finished a pass without error (Unix seconds)."}, []string{"task"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardmq_retention_months_held_hot",
			Help: "1 while a cluster keeps a month past the hot window (live deliveries, a resharding job), else 0."}, []string{"cluster"}),
		ahead: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardmq_retention_partitions_ahead_months",
			Help: "Months after the current one that have their partition, by cluster and table (the fewest seen)."}, []string{"cluster", "table"}),
	}
	for _, name := range []string{JobPartitions, JobWarm, JobCold, JobUpkeep} {
		j.status[name] = &JobStatus{}
		j.runs.WithLabelValues(name, "ok")
		j.runs.WithLabelValues(name, "error")
	}
	return j, nil
}

// Config returns the configuration in use, defaults filled.
func (j *Job) Config() Config { return j.cfg }

// Collectors are the jobs' metrics, for the router's registry.
func (j *Job) Collectors() []prometheus.Collector {
	return []prometheus.Collector{j.rows, j.items, j.runs, j.lastOK, j.held, j.ahead}
}

// Start runs the partition upkeep right away (a router started after a
// long stop creates the months it missed) and every job every
// Config.Every, while this router leads; the heavier jobs wait for the
// first tick so that a router's start is not slowed by them. Safe to call
// once; Stop ends it.
func (j *Job) Start(ctx context.Context) {
	if j.cfg.Disabled {
		return
	}
	ctx, j.cancel = context.WithCancel(ctx)
	j.done = make(chan struct{})
	go func() {
		defer close(j.done)
		t := time.NewTicker(j.cfg.Every)
		defer t.Stop()
		if j.deps.Leading() {
			j.Partitions(ctx)
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if j.deps.Leading() {
				j.RunOnce(ctx)
			}
		}
	}()
}

// Stop ends the loop and waits for a pass in progress to stop (its
// batches check the context). Safe to call twice.
func (j *Job) Stop() {
	j.stopOnce.Do(func() {
		if j.cancel != nil {
			j.cancel()
			<-j.done
		}
	})
}

// ErrNotLeading: passes, restores and releases run on the leading router
// only (two routers moving the same months would race).
var ErrNotLeading = errors.New("this router does not lead: retention runs on the leading router")

// RunOnce runs a pass of every job, in order, and returns the errors.
func (j *Job) RunOnce(ctx context.Context) error {
	if !j.deps.Leading() {
		return ErrNotLeading
	}
	var errs []error
	for _, step := range []func(context.Context) error{j.Partitions, j.Warm, j.Cold, j.Upkeep} {
		if ctx.Err() != nil {
			break
		}
		if err := step(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// pass runs fn as one pass of job, serialized with every other pass, and
// records it.
func (j *Job) pass(ctx context.Context, job string, fn func(ctx context.Context) error) error {
	if !j.deps.Leading() {
		return ErrNotLeading
	}
	j.run.Lock()
	defer j.run.Unlock()
	start := j.cfg.Now()
	err := fn(ctx)
	j.mu.Lock()
	st := j.status[job]
	st.Runs++
	st.LastRun = start
	if err != nil {
		st.Failures++
		st.LastError = err.Error()
	} else {
		st.LastOK, st.LastError = start, ""
	}
	j.mu.Unlock()
	if err != nil {
		j.runs.WithLabelValues(job, "error").Inc()
		j.cfg.Log.Warn("retention pass failed; it resumes at the next run", "job", job, "err", err)
		return fmt.Errorf("retention %s: %w", job, err)
	}
	j.runs.WithLabelValues(job, "ok").Inc()
	j.lastOK.WithLabelValues(job).Set(float64(start.Unix()))
	return nil
}

func (j *Job) addRows(job string, n int64) {
	if n == 0 {
		return
	}
	j.rows.WithLabelValues(job).Add(float64(n))
	j.mu.Lock()
	j.status[statusOf(job)].Rows += n
	j.mu.Unlock()
}

func (j *Job) addItem(job, what string) {
	j.items.WithLabelValues(job, what).Inc()
	j.mu.Lock()
	j.status[statusOf(job)].Items++
	j.mu.Unlock()
}

// statusOf maps the restore's counters onto the cold job's record.
func statusOf(job string) string {
	if job == "restore" {
		return JobCold
	}
	return job
}

func (j *Job) setBlocked(cluster string, b *Blocked) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if b == nil {
		delete(j.blocked, cluster)
		j.held.WithLabelValues(cluster).Set(0)
		return
	}
	j.blocked[cluster] = *b
	j.held.WithLabelValues(cluster).Set(1)
}

// Status reports the jobs' configuration and records on this router.
func (j *Job) Status() Status {
	leading, archive := j.deps.Leading(), j.deps.Archive() != nil // outside mu: may connect
	state := "ok"
	switch {
	case archive:
	case j.deps.ArchiveNamed != nil && j.deps.ArchiveNamed():
		state = "unreachable"
	default:
		state = "none"
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	out := Status{Enabled: !j.cfg.Disabled, Leading: leading, Archive: archive, ArchiveState: state,
		HotMonths: j.cfg.HotMonths, WarmMonths: j.cfg.WarmMonths, Ahead: j.cfg.AheadMonths, ColdDir: j.cfg.ColdDir,
		Tiers: j.cfg.tiers(j.cfg.Now()), Jobs: map[string]JobStatus{}, Blocked: []Blocked{}}
	for k, v := range j.status {
		out.Jobs[k] = *v
	}
	for _, b := range j.blocked {
		out.Blocked = append(out.Blocked, b)
	}
	sort.Slice(out.Blocked, func(a, b int) bool { return out.Blocked[a].Cluster < out.Blocked[b].Cluster })
	return out
}

// sortedClusters returns the hot clusters in name order.
func sortedClusters(m map[string]*store.Store) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// monthText is a month as YYYY-MM.
func monthText(m time.Time) string { return m.UTC().Format("2006-01") }

// ParseMonth reads YYYY-MM.
func ParseMonth(s string) (time.Time, error) {
	t, err := time.Parse("2006-01", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("month %q is not YYYY-MM", s)
	}
	return t.UTC(), nil
}
