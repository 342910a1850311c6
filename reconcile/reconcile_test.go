package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// These tests run the job's own logic — paging, ownership, what is
// repaired where, sampling, errors per cluster, one run at a time, the
// schedule — against fakes of the interfaces the package declares. The SQL
// behind CheckMessages, OrphanDeliveries and RepairMessages is tested on
// real MariaDB in store/ and end to end in server/.

// fakeScanner answers CheckMessages with pages (one per call, the cursor
// of the next page being its index + 1) and OrphanDeliveries with orphans.
type fakeScanner struct {
	pages   [][]domain.Finding
	orphans []domain.Finding
	err     error
	block   chan struct{} // when set, CheckMessages signals entered, then waits for block to close
	entered chan struct{}

	mu     sync.Mutex
	ranges []store.CheckRange
}

func (f *fakeScanner) CheckMessages(ctx context.Context, r store.CheckRange, _ store.SubscriptionsAt) ([]domain.Finding, int, uint64, error) {
	if f.block != nil {
		f.entered <- struct{}{}
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, 0, 0, ctx.Err()
		}
	}
	f.mu.Lock()
	f.ranges = append(f.ranges, r)
	f.mu.Unlock()
	if f.err != nil {
		return nil, 0, 0, f.err
	}
	if len(f.pages) == 0 {
		return nil, 0, 0, nil
	}
	i := int(r.After)
	var next uint64
	if i+1 < len(f.pages) {
		next = uint64(i + 1)
	}
	return f.pages[i], 10, next, nil
}

func (f *fakeScanner) OrphanDeliveries(_ context.Context, after store.OrphanCursor, _ []uint16, _ int) ([]domain.Finding, store.OrphanCursor, error) {
	if after != (store.OrphanCursor{}) {
		return nil, store.OrphanCursor{}, nil
	}
	if len(f.orphans) == 0 {
		return nil, store.OrphanCursor{}, nil
	}
	last := f.orphans[len(f.orphans)-1]
	return f.orphans, store.OrphanCursor{MessageID: last.MessageID, Subscription: last.Subscription}, nil
}

// fakeRepairer confirms every message it is asked about as a finding of
// kind, repaired unless the id is in refuse.
type fakeRepairer struct {
	kind   string
	refuse map[uint64]bool
	err    error

	mu    sync.Mutex
	calls [][]uint64
}

func (f *fakeRepairer) RepairMessages(_ context.Context, ids []uint64, _ store.SubscriptionsAt, _ time.Time) ([]domain.Finding, error) {
	f.mu.Lock()
	f.calls = append(f.calls, slices.Clone(ids))
	f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	out := make([]domain.Finding, len(ids))
	for i, id := range ids {
		out[i] = domain.Finding{Kind: f.kind, MessageID: id, Repaired: !f.refuse[id]}
	}
	return out, nil
}

type fakeEndpoints struct {
	scan    map[string]*fakeScanner
	primary map[string]*fakeRepairer
}

func (e fakeEndpoints) Scan(cluster string) (ScanConn, string, string, bool) {
	s, ok := e.scan[cluster]
	if !ok {
		return nil, "", "", false
	}
	return direct[Scanner]{s}, "replica", cluster + "-r1:3306", true
}

func (e fakeEndpoints) Primary(cluster string) (RepairConn, bool) {
	p, ok := e.primary[cluster]
	if !ok {
		return nil, false
	}
	return direct[Repairer]{p}, true
}

// direct is an endpoint's call point that runs every call as it is.
type direct[S any] struct{ s S }

func (d direct[S]) Do(ctx context.Context, fn func(context.Context, S) error) error {
	return fn(ctx, d.s)
}

// twoClusters: c1 serves vshards 0-511, c2 512-1023, and vshard 1000
// (on c2) is frozen.
func twoClusters(t *testing.T) *routing.Table {
	t.Helper()
	m, err := routing.NewMap(1, []routing.Range{
		{From: 0, To: 511, Cluster: "c1"},
		{From: 512, To: 999, Cluster: "c2"},
		{From: 1000, To: 1000, Cluster: "c2", Frozen: true},
		{From: 1001, To: 1023, Cluster: "c2"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return routing.NewTable(m)
}

func noSubs(context.Context, string, time.Time) ([]string, error) { return nil, nil }

func newRunner(t *testing.T, ep Endpoints, cfg Config) *Runner {
	t.Helper()
	cfg.Subscriptions = noSubs
	if cfg.Now == nil {
		now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
		cfg.Now = func() time.Time { return now }
	}
	r, err := New(cfg, ep, twoClusters(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func finding(kind string, id uint64, v uint16) domain.Finding {
	return domain.Finding{Kind: kind, MessageID: id, VShard: v, Topic: "t"}
}

func TestNewRequiresSubscriptions(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}, fakeEndpoints{}, twoClusters(t)); err == nil {
		t.Fatal("New without Config.Subscriptions succeeded")
	}
}

func TestRunRepairsOnPrimaryAndReportsTheRest(t *testing.T) {
	t.Parallel()
	page := []domain.Finding{
		finding(domain.FindingStatus, 1, 10),
		finding(domain.FindingMissingDelivery, 1, 10), // same message: asked once
		finding(domain.FindingMissingDelivery, 2, 11),
		finding(domain.FindingMissingKey, 3, 12),
		finding(domain.FindingKeyMismatch, 4, 13),
	}
	cases := []struct {
		name         string
		dryRun       bool
		refuse       map[uint64]bool
		wantCalls    [][]uint64
		wantFound    map[string]int
		wantRepaired map[string]int
	}{
		{
			name: "dry run reports every finding and repairs none", dryRun: true,
			wantFound: map[string]int{domain.FindingStatus: 1, domain.FindingMissingDelivery: 2, domain.FindingMissingKey: 1,
				domain.FindingKeyMismatch: 1, domain.FindingOrphanDelivery: 1},
			wantRepaired: map[string]int{},
		},
		{
			name:      "repairable kinds go to the primary once per message; its answer is what counts",
			wantCalls: [][]uint64{{1, 2}},
			wantFound: map[string]int{domain.FindingStatus: 2, domain.FindingMissingKey: 1, domain.FindingKeyMismatch: 1,
				domain.FindingOrphanDelivery: 1},
			wantRepaired: map[string]int{domain.FindingStatus: 2},
		},
		{
			name: "a repair the primary does not confirm is found, not repaired", refuse: map[uint64]bool{2: true},
			wantCalls: [][]uint64{{1, 2}},
			wantFound: map[string]int{domain.FindingStatus: 2, domain.FindingMissingKey: 1, domain.FindingKeyMismatch: 1,
				domain.FindingOrphanDelivery: 1},
			wantRepaired: map[string]int{domain.FindingStatus: 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			scan := &fakeScanner{pages: [][]domain.Finding{page}, orphans: []domain.Finding{finding(domain.FindingOrphanDelivery, 9, 20)}}
			prim := &fakeRepairer{kind: domain.FindingStatus, refuse: tc.refuse}
			r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": scan}, primary: map[string]*fakeRepairer{"c1": prim}}, Config{})
			rep, err := r.Run(context.Background(), Request{Clusters: []string{"c1"}, DryRun: tc.dryRun})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(prim.calls, tc.wantCalls, slices.Equal) {
				t.Errorf("repair calls %v, want %v", prim.calls, tc.wantCalls)
			}
			c := rep.Clusters[0]
			if fmt.Sprint(c.Found) != fmt.Sprint(tc.wantFound) || fmt.Sprint(c.Repaired) != fmt.Sprint(tc.wantRepaired) {
				t.Errorf("found %v repaired %v, want %v and %v", c.Found, c.Repaired, tc.wantFound, tc.wantRepaired)
			}
			if fmt.Sprint(rep.Found) != fmt.Sprint(tc.wantFound) || rep.Scanned != 10 || c.ReadFrom != "replica" || c.Endpoint != "c1-r1:3306" {
				t.Errorf("report %+v", rep)
			}
			if rep.DryRun != tc.dryRun || r.Last() != rep {
				t.Errorf("dry_run %v, last report kept: %v", rep.DryRun, r.Last() == rep)
			}
		})
	}
}

// Rows of vshards a cluster does not serve (now) belong to a resharding
// job: they are neither reported nor repaired there.
func TestRunIgnoresVShardsTheClusterDoesNotServe(t *testing.T) {
	t.Parallel()
	scan := &fakeScanner{pages: [][]domain.Finding{{
		finding(domain.FindingStatus, 1, 600),    // c2 serves it
		finding(domain.FindingStatus, 2, 1000),   // c2's, frozen
		finding(domain.FindingMissingKey, 3, 10), // c1's
	}}, orphans: []domain.Finding{finding(domain.FindingOrphanDelivery, 4, 1000), finding(domain.FindingOrphanDelivery, 5, 511)}}
	scan2 := &fakeScanner{pages: [][]domain.Finding{{finding(domain.FindingMissingKey, 6, 1000), finding(domain.FindingMissingKey, 7, 512)}}}
	prim := &fakeRepairer{kind: domain.FindingStatus}
	r := newRunner(t, fakeEndpoints{
		scan:    map[string]*fakeScanner{"c1": scan, "c2": scan2},
		primary: map[string]*fakeRepairer{"c1": prim, "c2": prim},
	}, Config{})
	rep, err := r.Run(context.Background(), Request{})
	if err != nil {
		t.Fatal(err)
	}
	if len(prim.calls) != 0 {
		t.Errorf("repaired %v on a cluster that does not serve them", prim.calls)
	}
	want := map[string]map[string]int{
		"c1": {domain.FindingMissingKey: 1, domain.FindingOrphanDelivery: 1},
		"c2": {domain.FindingMissingKey: 1},
	}
	for _, c := range rep.Clusters {
		if fmt.Sprint(c.Found) != fmt.Sprint(want[c.Cluster]) {
			t.Errorf("%s found %v, want %v", c.Cluster, c.Found, want[c.Cluster])
		}
	}
}

func TestRunWalksEveryPageAndNarrowsToTheRequest(t *testing.T) {
	t.Parallel()
	pages := [][]domain.Finding{
		{finding(domain.FindingMissingKey, 1, 5)},
		{finding(domain.FindingMissingKey, 2, 6)},
		{finding(domain.FindingMissingKey, 3, 7)},
	}
	scan := &fakeScanner{pages: pages}
	scan2 := &fakeScanner{pages: pages}
	r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": scan, "c2": scan2}}, Config{PageSize: 7, Window: time.Hour})
	until := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	rep, err := r.Run(context.Background(), Request{DryRun: true, Until: until, VShards: []shard.ID{5, 6, 7, 1023, 600}})
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.ranges) != 3 {
		t.Fatalf("c1 read %d pages, want 3", len(scan.ranges))
	}
	for i, rg := range scan.ranges {
		if rg.After != uint64(i) || rg.Limit != 7 || !rg.Until.Equal(until) || !rg.Since.Equal(until.Add(-time.Hour)) ||
			!slices.Equal(rg.VShards, []uint16{5, 6, 7}) {
			t.Errorf("page %d asked %+v", i, rg)
		}
	}
	if got := scan2.ranges[0].VShards; !slices.Equal(got, []uint16{1023, 600}) {
		t.Errorf("c2 asked for vshards %v", got)
	}
	if rep.Found[domain.FindingMissingKey] != 3 || rep.Scanned != 60 {
		t.Errorf("report found %v scanned %d", rep.Found, rep.Scanned)
	}
}

func TestRunSkipsClustersWithoutRequestedVShards(t *testing.T) {
	t.Parallel()
	scan := &fakeScanner{}
	r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": scan, "c2": scan}}, Config{})
	rep, err := r.Run(context.Background(), Request{DryRun: true, VShards: []shard.ID{3}})
	if err != nil {
		t.Fatal(err)
	}
	if len(scan.ranges) != 1 || len(rep.Clusters) != 2 || rep.Clusters[1].Cluster != "c2" || rep.Clusters[1].Scanned != 0 {
		t.Errorf("walked %d times; clusters %+v", len(scan.ranges), rep.Clusters)
	}
}

func TestRunSamplesAtMostSamplesPerKind(t *testing.T) {
	t.Parallel()
	var page []domain.Finding
	for i := range 5 {
		page = append(page, finding(domain.FindingMissingKey, uint64(i+1), 1), finding(domain.FindingKeyMismatch, uint64(i+10), 1))
	}
	r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": {pages: [][]domain.Finding{page}}}}, Config{Samples: 3})
	for _, tc := range []struct {
		samples, want int
	}{{0, 3}, {1, 1}, {10, 5}} {
		rep, err := r.Run(context.Background(), Request{Clusters: []string{"c1"}, DryRun: true, Samples: tc.samples})
		if err != nil {
			t.Fatal(err)
		}
		perKind := map[string]int{}
		for i, f := range rep.Clusters[0].Samples {
			perKind[f.Kind]++
			if i > 0 && rep.Clusters[0].Samples[i-1].Kind > f.Kind {
				t.Errorf("samples not sorted by kind: %v", rep.Clusters[0].Samples)
			}
		}
		if perKind[domain.FindingMissingKey] != tc.want || perKind[domain.FindingKeyMismatch] != tc.want {
			t.Errorf("samples %d: kept %v, want %d of each", tc.samples, perKind, tc.want)
		}
		if rep.Found[domain.FindingMissingKey] != 5 {
			t.Errorf("found %v, want every finding counted", rep.Found)
		}
	}
}

func TestRunReportsAFailedClusterAndGoesOn(t *testing.T) {
	t.Parallel()
	ok := &fakeScanner{pages: [][]domain.Finding{{finding(domain.FindingStatus, 1, 600)}}}
	cases := []struct {
		name    string
		ep      fakeEndpoints
		req     Request
		wantErr string
	}{
		{"scan fails", fakeEndpoints{scan: map[string]*fakeScanner{"c1": {err: errors.New("replica gone")}, "c2": ok}},
			Request{DryRun: true}, "replica gone"},
		{"no endpoint", fakeEndpoints{scan: map[string]*fakeScanner{"c2": ok}}, Request{DryRun: true}, "has no endpoint to read"},
		{"no primary to repair on", fakeEndpoints{scan: map[string]*fakeScanner{"c1": {}, "c2": ok}, primary: map[string]*fakeRepairer{"c2": {kind: domain.FindingStatus}}},
			Request{}, "has no primary to repair on"},
		{"repair fails", fakeEndpoints{
			scan:    map[string]*fakeScanner{"c1": {pages: [][]domain.Finding{{finding(domain.FindingStatus, 1, 1)}}}, "c2": ok},
			primary: map[string]*fakeRepairer{"c1": {err: errors.New("primary read-only")}, "c2": {kind: domain.FindingStatus}}},
			Request{}, "primary read-only"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRunner(t, tc.ep, Config{})
			rep, err := r.Run(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Failed(); !slices.Equal(got, []string{"c1"}) {
				t.Fatalf("failed clusters %v, want [c1]", got)
			}
			if e := rep.Clusters[0].Error; !strings.Contains(e, tc.wantErr) {
				t.Errorf("c1 error %q, want %q", e, tc.wantErr)
			}
			if rep.Clusters[1].Error != "" || rep.Found[domain.FindingStatus] != 1 {
				t.Errorf("c2 %+v; total found %v", rep.Clusters[1], rep.Found)
			}
		})
	}
}

func TestOneRunAtATime(t *testing.T) {
	t.Parallel()
	scan := &fakeScanner{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": scan}}, Config{})
	first := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), Request{Clusters: []string{"c1"}, DryRun: true})
		first <- err
	}()
	select {
	case <-scan.entered:
	case err := <-first:
		t.Fatalf("first run ended before its scan: %v", err)
	}
	if _, err := r.Run(context.Background(), Request{Clusters: []string{"c2"}, DryRun: true}); !errors.Is(err, ErrRunning) {
		t.Fatalf("second run while the first one scans: %v, want ErrRunning", err)
	}
	close(scan.block)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), Request{Clusters: []string{"c1"}, DryRun: true}); err != nil {
		t.Fatalf("run after the first finished: %v", err)
	}
}

func TestStartRunsOnScheduleWhenAllowedAndStops(t *testing.T) {
	t.Parallel()
	reports := make(chan *Report, 16)
	var mu sync.Mutex
	asked := 0
	cfg := Config{
		Every: time.Millisecond,
		ShouldRun: func() bool {
			mu.Lock()
			defer mu.Unlock()
			asked++
			return asked%2 == 0 // every other tick: not the leader
		},
		OnReport: func(rep *Report) {
			select {
			case reports <- rep:
			default:
			}
		},
	}
	r := newRunner(t, fakeEndpoints{scan: map[string]*fakeScanner{"c1": {}, "c2": {}}}, cfg)
	r.Stop() // safe without Start
	r.Start(context.Background())
	r.Start(context.Background()) // safe twice
	for range 2 {
		select {
		case rep := <-reports:
			if rep.DryRun || len(rep.Clusters) != 2 {
				t.Errorf("scheduled report %+v", rep)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no scheduled run")
		}
	}
	r.Stop()
	r.Stop()
	mu.Lock()
	n := asked
	mu.Unlock()
	if n < 3 {
		t.Errorf("ShouldRun asked %d times for 2 runs, want every tick asked", n)
	}
}
