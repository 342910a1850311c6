package loadtest

import (
	"context"
	"github.com/shardmq/shardmq/internal/testbed"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"
)

// secondRouter starts another router over e's topology: the same
// clusters, the same databases.
func (e *env) secondRouter(t *testing.T) string {
	t.Helper()
	return startRouter(t, e.path)
}

// loseOne answers the first fresh message of its first batch created
// without storing it: a system that acknowledged a message and lost it.
type loseOne struct {
	Target
	mu   sync.Mutex
	lost string
}

func (l *loseOne) Produce(ctx context.Context, topic string, msgs []Message) ([]ProduceResult, error) {
	l.mu.Lock()
	drop := l.lost == "" && len(msgs) > 1 && !msgs[0].Repeat && !msgs[0].Retry
	if drop {
		l.lost = msgs[0].Key
	}
	l.mu.Unlock()
	if !drop {
		return l.Target.Produce(ctx, topic, msgs)
	}
	res, err := l.Target.Produce(ctx, topic, msgs[1:])
	if err != nil {
		return nil, err
	}
	return append([]ProduceResult{{Status: "created", ID: 1 << 62, VShard: -1}}, res...), nil
}

// A fleet run: two routers over the same clusters, two generators sharing
// the scenario through a coordinator, one verification. With a message
// lost on one worker's share, the merged verification names it; without,
// everything acknowledged by either worker is consumed once, by either.
func TestFleetMergedVerification(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, tc := range []struct {
		name    string
		routing string
		lose    bool
	}{
		{"two routers round robin, nothing lost", RouteRoundRobin, false},
		{"two routers by key, a loss on worker 1", RouteByKey, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupOn(t, bed)
			cfg := e.small(ScenarioMixed)
			cfg.Routers, cfg.Routing, cfg.Workers = []string{e.url, e.secondRouter(t)}, tc.routing, 2
			if tc.lose {
				cfg.Drain = 8 * time.Second // the lost message never settles the fleet
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var lost *loseOne
			var wg sync.WaitGroup
			results := make([]*WorkerResult, 2)
			errs := make([]error, 2)
			cfg.OnCoordinator = func(url string) error {
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results[i], errs[i] = RunWorker(ctx, url, WorkerOptions{Wrap: func(w int, t Target) Target {
							if !tc.lose || w != 1 {
								return t
							}
							lost = &loseOne{Target: t}
							return lost
						}})
					}()
				}
				return nil
			}
			rep, err := Run(ctx, cfg)
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("worker %d: %v", i, err)
				}
			}
			if len(rep.Verification) != 1 || len(rep.Phases) != 1 {
				t.Fatalf("%d verifications, %d phases: want one of each, merged", len(rep.Verification), len(rep.Phases))
			}
			v, p := rep.Verification[0], rep.Phases[0]
			var prodLat, claims int64
			for _, res := range results {
				if res.Phase.Produce.Messages == 0 || res.Phase.Consume.Messages == 0 {
					t.Fatalf("worker %d produced %d and consumed %d: each must do its share", res.Worker, res.Phase.Produce.Messages, res.Phase.Consume.Messages)
				}
				prodLat += res.Phase.Produce.Latency.Count
				claims += res.Phase.Consume.Latency.Count
			}
			if p.Produce.Latency.Count != prodLat || p.Consume.Latency.Count != claims || prodLat == 0 {
				t.Fatalf("merged histograms hold %d produce and %d claim latencies, the workers %d and %d", p.Produce.Latency.Count, p.Consume.Latency.Count, prodLat, claims)
			}
			if v.Duplicated != 0 || v.Unexpected != 0 || v.Acknowledged == 0 {
				t.Fatalf("books: %+v", v)
			}
			if !tc.lose {
				checkPassed(t, rep)
				if v.Consumed != v.Acknowledged {
					t.Fatalf("consumed %d of %d acknowledged", v.Consumed, v.Acknowledged)
				}
				lines := rep.SummaryLines()
				if lines[len(lines)-2] != "routers: 2, workers: 2" || !regexp.MustCompile(`^lost: 0, duplicated: 0, produced/s: \d+, consumed/s: \d+$`).MatchString(lines[len(lines)-1]) {
					t.Fatalf("last lines %q", lines[len(lines)-2:])
				}
				return
			}
			if lost == nil || lost.lost == "" {
				t.Fatal("worker 1 never lost a message")
			}
			if rep.Summary.Passed || v.Lost != 1 || !slices.Contains(v.LostKeys, lost.lost) || v.Consumed != v.Acknowledged-1 {
				t.Fatalf("lost %s on worker 1; verification says lost %d %v, consumed %d of %d, passed %v; books %+v", lost.lost, v.Lost, v.LostKeys, v.Consumed, v.Acknowledged, rep.Summary.Passed, v)
			}
		})
	}
}
