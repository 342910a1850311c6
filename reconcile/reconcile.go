// Package reconcile runs the reconciliation job (DESIGN §6 "Status sync"):
// on every cluster it walks the messages of a time window, checks that
// message_store.msg_status agrees with the deliveries and the trace, that
// every subscription that existed when a message was produced has a
// delivery or a terminal event, that every message has its dedup key and
// that no delivery lacks its message; it repairs what can be derived and
// reports counts and samples of each kind of finding.
//
// The walk reads a replica when one is within the lag limit (it is only a
// candidate list); every repair re-checks its messages on the primary with
// their rows locked, so a replica's lag or a consumer acking meanwhile can
// never make a repair wrong.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// Scanner is what the walk needs from an endpoint (replica or primary).
type Scanner interface {
	CheckMessages(ctx context.Context, r store.CheckRange, subs store.SubscriptionsAt) ([]store.Finding, int, uint64, error)
	OrphanDeliveries(ctx context.Context, after store.OrphanCursor, vshards []uint16, limit int) ([]store.Finding, store.OrphanCursor, error)
}

// Repairer is what repairs need from a cluster's primary.
type Repairer interface {
	RepairMessages(ctx context.Context, ids []uint64, subs store.SubscriptionsAt, now time.Time) ([]store.Finding, error)
}

var (
	_ Scanner  = (*store.Store)(nil)
	_ Repairer = (*store.Store)(nil)
)

// ScanConn is the call point of the endpoint a walk reads: Do runs fn on
// its Scanner (in the router, through the endpoint's breaker).
type ScanConn interface {
	Do(ctx context.Context, fn func(ctx context.Context, s Scanner) error) error
}

// RepairConn is the call point of a cluster's primary for repairs.
type RepairConn interface {
	Do(ctx context.Context, fn func(ctx context.Context, r Repairer) error) error
}

// Endpoints resolves a cluster's endpoints.
type Endpoints interface {
	// Scan is where to walk: a replica within the lag limit, else the
	// primary; readFrom says which ("replica" or "primary").
	Scan(cluster string) (s ScanConn, readFrom, endpoint string, ok bool)
	// Primary is where repairs go.
	Primary(cluster string) (RepairConn, bool)
}

// Config tunes the job. Zero fields take the defaults named.
type Config struct {
	// Window is how far back a run looks by default. Defaults to 48h: a
	// daily run covers every message twice.
	Window time.Duration
	// Every is the schedule of Start's background runs. Defaults to 24h.
	Every time.Duration
	// PageSize is the messages checked per statement. Defaults to 500.
	PageSize int
	// Samples is how many findings of each kind a report keeps. Defaults
	// to 20.
	Samples int
	// Concurrency bounds the clusters walked at once. Defaults to 2: the
	// job is background work.
	Concurrency int
	// Subscriptions says which subscriptions a message must be delivered
	// to. Required.
	Subscriptions store.SubscriptionsAt
	// ShouldRun, if set, is asked before each scheduled run (only the
	// router that holds the background-jobs lock runs it).
	ShouldRun func() bool
	// OnReport, if set, receives every finished report (metrics, alerts).
	OnReport func(*Report)
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Log defaults to discarding.
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Window <= 0 {
		c.Window = 48 * time.Hour
	}
	if c.Every <= 0 {
		c.Every = 24 * time.Hour
	}
	if c.PageSize <= 0 {
		c.PageSize = 500
	}
	if c.Samples <= 0 {
		c.Samples = 20
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 2
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Request narrows a run. The zero value checks every cluster's last Window
// and repairs.
type Request struct {
	Clusters []string   // only these; all when empty
	VShards  []shard.ID // only these; all when empty
	Since    time.Time  // defaults to Until − Window
	Until    time.Time  // defaults to now
	// DryRun reports without repairing.
	DryRun bool
	// Samples overrides Config.Samples.
	Samples int
}

// ClusterReport is one cluster's part of a run.
type ClusterReport struct {
	Cluster  string `json:"cluster"`
	ReadFrom string `json:"read_from"`
	Endpoint string `json:"endpoint"`
	Scanned  int    `json:"scanned"`
	// Found counts findings by kind; repairable kinds count what the
	// primary confirmed under lock when repairing.
	Found    map[string]int  `json:"found"`
	Repaired map[string]int  `json:"repaired"`
	Samples  []store.Finding `json:"-"`
	Error    string          `json:"error,omitempty"`
}

// Report is one run's outcome.
type Report struct {
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Since      time.Time       `json:"since"`
	Until      time.Time       `json:"until"`
	DryRun     bool            `json:"dry_run"`
	Scanned    int             `json:"scanned"`
	Found      map[string]int  `json:"found"`
	Repaired   map[string]int  `json:"repaired"`
	Clusters   []ClusterReport `json:"clusters"`
}

// Failed lists the clusters whose walk did not finish.
func (r *Report) Failed() []string {
	var out []string
	for _, c := range r.Clusters {
		if c.Error != "" {
			out = append(out, c.Cluster)
		}
	}
	return out
}

// Runner runs the job on demand (Run) and on a schedule (Start).
type Runner struct {
	cfg   Config
	ep    Endpoints
	table *routing.Table

	mu      sync.Mutex
	last    *Report
	running bool
	stop    context.CancelFunc
	done    chan struct{}
}

// New returns a runner over ep, routing by table.
func New(cfg Config, ep Endpoints, table *routing.Table) (*Runner, error) {
	cfg = cfg.withDefaults()
	if cfg.Subscriptions == nil {
		return nil, errors.New("reconcile: Config.Subscriptions is required")
	}
	return &Runner{cfg: cfg, ep: ep, table: table}, nil
}

// ErrRunning: a run is already in progress on this router.
var ErrRunning = errors.New("a reconciliation is already running")

// Last is the newest finished report, or nil.
func (r *Runner) Last() *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Run reconciles as req asks and returns the report. One run at a time:
// a second concurrent Run gets ErrRunning. A cluster that fails is
// reported in its ClusterReport; the others go on.
func (r *Runner) Run(ctx context.Context, req Request) (*Report, error) {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return nil, ErrRunning
	}
	r.running = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}()

	now := r.cfg.Now().UTC()
	if req.Until.IsZero() {
		req.Until = now
	}
	if req.Since.IsZero() {
		req.Since = req.Until.Add(-r.cfg.Window)
	}
	if req.Samples <= 0 {
		req.Samples = r.cfg.Samples
	}
	m := r.table.Load()
	clusters := req.Clusters
	if len(clusters) == 0 {
		clusters = m.Clusters()
	}
	rep := &Report{StartedAt: now, Since: req.Since.UTC(), Until: req.Until.UTC(), DryRun: req.DryRun,
		Found: map[string]int{}, Repaired: map[string]int{}, Clusters: make([]ClusterReport, len(clusters))}
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, c := range clusters {
		var vs []uint16
		if len(req.VShards) > 0 {
			for _, v := range req.VShards {
				if owner, _ := m.Lookup(v); owner == c {
					vs = append(vs, uint16(v))
				}
			}
			if len(vs) == 0 {
				rep.Clusters[i] = ClusterReport{Cluster: c, Found: map[string]int{}, Repaired: map[string]int{}}
				continue
			}
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			rep.Clusters[i] = r.cluster(ctx, c, vs, req)
		})
	}
	wg.Wait()
	for _, c := range rep.Clusters {
		rep.Scanned += c.Scanned
		for k, n := range c.Found {
			rep.Found[k] += n
		}
		for k, n := range c.Repaired {
			rep.Repaired[k] += n
		}
	}
	rep.FinishedAt = r.cfg.Now().UTC()
	r.mu.Lock()
	r.last = rep
	r.mu.Unlock()
	if r.cfg.OnReport != nil {
		r.cfg.OnReport(rep)
	}
	r.cfg.Log.Info("reconciliation finished", "scanned", rep.Scanned, "found", rep.Found, "repaired", rep.Repaired,
		"failed_clusters", rep.Failed(), "elapsed", rep.FinishedAt.Sub(rep.StartedAt).Round(time.Millisecond))
	return rep, nil
}

func repairable(kind string) bool {
	return kind == store.FindingStatus || kind == store.FindingMissingDelivery
}

// cluster walks one cluster.
func (r *Runner) cluster(ctx context.Context, name string, vshards []uint16, req Request) ClusterReport {
	cr := ClusterReport{Cluster: name, Found: map[string]int{}, Repaired: map[string]int{}}
	perKind := map[string]int{}
	sample := func(f store.Finding) {
		if perKind[f.Kind] < req.Samples {
			perKind[f.Kind]++
			cr.Samples = append(cr.Samples, f)
		}
	}
	scan, readFrom, endpoint, ok := r.ep.Scan(name)
	if !ok {
		cr.Error = fmt.Sprintf("cluster %s has no endpoint to read", name)
		return cr
	}
	cr.ReadFrom, cr.Endpoint = readFrom, endpoint
	var primary RepairConn
	if !req.DryRun {
		if primary, ok = r.ep.Primary(name); !ok {
			cr.Error = fmt.Sprintf("cluster %s has no primary to repair on", name)
			return cr
		}
	}
	rng := store.CheckRange{Since: req.Since, Until: req.Until, VShards: vshards, Limit: r.cfg.PageSize}
	for {
		var found []store.Finding
		var n int
		var next uint64
		err := scan.Do(ctx, func(ctx context.Context, s Scanner) (err error) {
			found, n, next, err = s.CheckMessages(ctx, rng, r.cfg.Subscriptions)
			return err
		})
		if err != nil {
			cr.Error = err.Error()
			return cr
		}
		cr.Scanned += n
		var ids []uint64
		seen := map[uint64]bool{}
		for _, f := range found {
			if !r.owns(name, f.VShard) {
				continue
			}
			if repairable(f.Kind) && !req.DryRun {
				if !seen[f.MessageID] {
					seen[f.MessageID] = true
					ids = append(ids, f.MessageID)
				}
				continue
			}
			cr.Found[f.Kind]++
			sample(f)
		}
		if len(ids) > 0 {
			var fixed []store.Finding
			err := primary.Do(ctx, func(ctx context.Context, p Repairer) (err error) {
				fixed, err = p.RepairMessages(ctx, ids, r.cfg.Subscriptions, r.cfg.Now().UTC())
				return err
			})
			if err != nil {
				cr.Error = err.Error()
				return cr
			}
			for _, f := range fixed {
				cr.Found[f.Kind]++
				if f.Repaired {
					cr.Repaired[f.Kind]++
				}
				sample(f)
			}
		}
		if next == 0 {
			break
		}
		rng.After = next
	}
	var cur store.OrphanCursor
	for {
		var found []store.Finding
		var next store.OrphanCursor
		err := scan.Do(ctx, func(ctx context.Context, s Scanner) (err error) {
			found, next, err = s.OrphanDeliveries(ctx, cur, vshards, r.cfg.PageSize)
			return err
		})
		if err != nil {
			cr.Error = err.Error()
			return cr
		}
		for _, f := range found {
			if !r.owns(name, f.VShard) {
				continue
			}
			cr.Found[f.Kind]++
			sample(f)
		}
		if next == (store.OrphanCursor{}) {
			break
		}
		cur = next
	}
	sort.SliceStable(cr.Samples, func(i, j int) bool { return cr.Samples[i].Kind < cr.Samples[j].Kind })
	return cr
}

// owns says whether cluster serves vshard v now. Rows of other vshards on
// a cluster are a resharding job's (copied in before the flip, or left
// until the cleanup after it): the job makes them exact, and a repair here
// could create a claimable delivery on a cluster that does not serve it.
func (r *Runner) owns(cluster string, v uint16) bool {
	owner, st := r.table.Load().Lookup(shard.ID(v))
	return owner == cluster && st == routing.Serving
}

// Start runs the job every Every in the background until ctx is done or
// Stop (when ShouldRun allows). Safe to call twice.
func (r *Runner) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil {
		return
	}
	ctx, r.stop = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		tick := time.NewTicker(r.cfg.Every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if r.cfg.ShouldRun != nil && !r.cfg.ShouldRun() {
				continue
			}
			if _, err := r.Run(ctx, Request{}); err != nil {
				r.cfg.Log.Warn("scheduled reconciliation skipped", "err", err)
			}
		}
	}()
}

// Stop ends the schedule and waits for a run in progress to stop. Safe to
// call twice, and without Start.
func (r *Runner) Stop() {
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
}
