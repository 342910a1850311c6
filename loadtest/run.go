package loadtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
)

// runner is one Run.
type runner struct {
	cfg      *Config
	run      string
	ks       *keyspace
	progress *progress
	router   *Fleet
	direct   *Direct
	report   *Report
	faulted  bool
	books    []*workload
}

// Run runs cfg's scenario to its end and returns the report; the run is
// bounded by its durations and stops by itself. The error is for a run
// that could not be carried out (bad config, target unreachable); a run
// that lost messages returns its report with Summary.Passed false.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var rnd [3]byte
	rand.Read(rnd[:])
	r := &runner{cfg: &cfg, run: "lt" + hex.EncodeToString(rnd[:]), progress: &progress{w: cfg.Progress, live: cfg.Live}}
	r.ks = newKeyspace(r.run, cfg.Payload, cfg.Keys)
	r.report = &Report{RunID: r.run, Scenario: cfg.Scenario, Command: cfg.Command, Started: time.Now(), Host: host(), Settings: settings(&cfg)}

	if cfg.Scenario != ScenarioBaseline {
		var rs []*Router
		for _, u := range cfg.Routers {
			rt := NewRouter(u, cfg.Producers+cfg.Consumers+cfg.SingleClients+8, cfg.Durability)
			rt.SetToken(cfg.Token)
			rs = append(rs, rt)
		}
		if r.router, err = NewFleet(rs, cfg.Routing); err != nil {
			return nil, err
		}
		defer r.router.Close()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.router.Ready(rctx)
		cancel()
		if err != nil {
			return nil, err
		}
		r.report.Router = strings.Join(cfg.Routers, ", ")
		r.report.Settings.Routers, r.report.Settings.Routing = len(cfg.Routers), r.router.mode
	}
	if cfg.Topology != nil {
		if r.direct, err = OpenDirect(ctx, cfg.Topology, store.Options{}); err != nil {
			return nil, err
		}
		defer r.direct.Close()
		r.report.Settings.SandboxCluster = len(cfg.Topology.Clusters)
		for _, st := range r.direct.stores {
			if r.report.Servers, err = ServerSettingsOf(ctx, st.DB()); err != nil {
				return nil, err
			}
			break
		}
	}

	switch cfg.Scenario {
	case ScenarioProduce:
		err = r.produce(ctx)
	case ScenarioConsume:
		err = r.consume(ctx)
	case ScenarioBenchProduce:
		err = r.benchProduce(ctx)
	case ScenarioBenchConsume:
		err = r.benchConsume(ctx)
	case ScenarioMixed, ScenarioDedup, ScenarioDeadletter:
		if cfg.Workers > 0 {
			err = r.coordinate(ctx)
			break
		}
		err = r.mixed(ctx)
	default:
		err = r.mixed(ctx)
	}
	if err != nil {
		return nil, err
	}
	r.finish()
	return r.report, nil
}

func host() Host {
	h := Host{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version()}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		h.Load1 = strings.Join(strings.Fields(string(data))[:3], " ")
	}
	return h
}

func settings(c *Config) Settings {
	s := Settings{Producers: c.Producers, Consumers: c.Consumers, Batch: c.Batch, ClaimMax: c.ClaimMax,
		ProduceRate: c.ProduceRate, ConsumeRate: c.ConsumeRate, DurationS: c.Duration.Seconds(), WarmupS: c.Warmup.Seconds(),
		DrainS: c.Drain.Seconds(), Payload: c.Payload.String(), Keys: c.Keys.String(), Topics: c.Topics, Subscriptions: c.Subscriptions,
		DupShare: c.DupShare, NackShare: c.NackShare, RetryShare: c.RetryShare, DropShare: c.DropShare,
		VisibilityS: c.Visibility.Seconds(), Durability: c.Durability, BaselineIncl: c.Baseline}
	switch c.Scenario {
	case ScenarioBenchProduce:
		s.SingleClients, s.Rounds, s.AsyncCount = c.SingleClients, c.Rounds, c.AsyncCount
		s.ProduceRate, s.ConsumeRate = 0, 0
	case ScenarioBenchConsume:
		s.Rounds, s.Preload = c.Rounds, c.Preload
		s.ProduceRate, s.ConsumeRate = 0, 0
	case ScenarioConsume:
		s.Preload = c.Preload
	}
	if c.Fault != nil {
		s.Fault, s.FaultAtS, s.FaultDownS = c.Fault.Name(), c.FaultAt.Seconds(), c.FaultDown.Seconds()
	}
	return s
}

// workload makes the topics (and subscriptions) of one target. name
// tells the workloads of a run apart in topic names.
func (r *runner) workload(ctx context.Context, name string, t Target) (*workload, error) {
	c := r.cfg
	wl := &workload{target: t, ks: r.ks, seqs: make([]uint64, max(c.Producers, c.SingleClients))}
	for i := range c.Topics {
		wl.topics = append(wl.topics, fmt.Sprintf("%s-%s-%d", r.run, name, i))
	}
	if c.Subscriptions == 1 {
		wl.subs = []string{"default"}
	} else {
		for i := range c.Subscriptions {
			wl.subs = append(wl.subs, "s"+strconv.Itoa(i+1))
		}
		for _, topic := range wl.topics {
			if err := t.Subscribe(ctx, topic, wl.subs, c.MaxAttempts); err != nil {
				return nil, err
			}
		}
	}
	v := NewVerifier(len(wl.subs), ConsumerPolicy{NackShare: c.NackShare, RetryShare: c.RetryShare, DropShare: c.DropShare})
	v.Visibility = c.Visibility
	wl.v = v
	if r.direct != nil {
		d := r.direct
		wl.lookup = func(ctx context.Context, topic int, k keyID) (uint64, bool, error) {
			return d.Lookup(ctx, wl.topics[topic], r.ks.key(k), r.ks.orderKey(k))
		}
	}
	r.books = append(r.books, wl)
	return wl, nil
}

// target returns the router, or the baseline.
func (r *runner) target(baseline bool) Target {
	if baseline {
		return r.direct
	}
	return r.router
}

// spec is a phase of the configured shape; kind decides which workers run.
func (r *runner) spec(name, kind string) phaseSpec {
	c := r.cfg
	return phaseSpec{Name: name, Kind: kind, Producers: c.Producers, Consumers: c.Consumers, Batch: c.Batch, ClaimMax: c.ClaimMax,
		ProduceRate: c.ProduceRate, ConsumeRate: c.ConsumeRate, Duration: c.Duration, Warmup: c.Warmup, Drain: c.Drain, DupShare: c.DupShare}
}

// runPhase runs a phase, arming the fault on the first router phase that
// produces, and adds its report.
func (r *runner) runPhase(ctx context.Context, wl *workload, s phaseSpec) PhaseReport {
	if r.cfg.Fault != nil && !r.faulted && !s.Preload && s.Kind != "consume" && wl.target.Name() == "router" {
		s.Fault, s.FaultAt, s.FaultDown = r.cfg.Fault, r.cfg.FaultAt, r.cfg.FaultDown
		r.faulted = true
	}
	fmt.Fprintf(r.cfg.Progress, "== %s (%s, %s)\n", s.Name, wl.target.Name(), s.Kind)
	p := newPhase(s, r.cfg, wl, r.smap())
	rep := p.run(ctx, r.progress)
	r.report.Phases = append(r.report.Phases, rep)
	return rep
}

func (r *runner) smap() *routing.Map {
	if r.cfg.Topology == nil {
		return nil
	}
	return r.cfg.Topology.Map
}

// verify closes a workload's books.
func (r *runner) verify(ctx context.Context, wl *workload, name string, consumed bool) {
	v := wl.v.(*Verifier).Finish(ctx, consumed, 2000, wl.lookup, r.ks.key)
	v.Workload = name
	r.report.Verification = append(r.report.Verification, v)
}

func (r *runner) produce(ctx context.Context) error {
	for _, baseline := range r.sides() {
		t := r.target(baseline)
		wl, err := r.workload(ctx, t.Name()[:1], t)
		if err != nil {
			return err
		}
		rep := r.runPhase(ctx, wl, r.spec(t.Name()+" produce", "produce"))
		r.result(fmt.Sprintf("produce batch %d, %d producers", r.cfg.Batch, r.cfg.Producers), t.Name(), rep.Produce.Messages, rep.WindowS)
		r.verify(ctx, wl, t.Name(), false)
	}
	r.ratio("produce", "produce")
	return nil
}

// sides lists the targets of a scenario: the router, then the baseline
// when asked for (or the baseline alone).
func (r *runner) sides() []bool {
	switch {
	case r.cfg.Scenario == ScenarioBaseline:
		return []bool{true}
	case r.cfg.Baseline:
		return []bool{false, true}
	}
	return []bool{false}
}

func (r *runner) preload(ctx context.Context, wl *workload, n int) {
	s := r.spec(wl.target.Name()+" preload", "produce")
	s.Count, s.Preload = int64(n), true
	s.ProduceRate, s.Warmup, s.Duration, s.Drain, s.DupShare = 0, 0, 5*time.Minute, 30*time.Second, 0
	r.runPhase(ctx, wl, s)
}

func (r *runner) consumeSpec(name string) phaseSpec {
	s := r.spec(name, "consume")
	s.Warmup, s.Duration = 0, max(r.cfg.Duration, time.Minute)
	return s
}

func (r *runner) consume(ctx context.Context) error {
	for _, baseline := range r.sides() {
		t := r.target(baseline)
		wl, err := r.workload(ctx, t.Name()[:1], t)
		if err != nil {
			return err
		}
		r.preload(ctx, wl, r.cfg.Preload)
		rep := r.runPhase(ctx, wl, r.consumeSpec(t.Name()+" consume"))
		r.result(fmt.Sprintf("consume claim %d + ack, %d consumers", r.cfg.ClaimMax, r.cfg.Consumers), t.Name(), rep.Consume.Messages, rep.WindowS)
		r.verify(ctx, wl, t.Name(), true)
	}
	r.ratio("consume", "consume")
	return nil
}

func (r *runner) mixed(ctx context.Context) error {
	prod := fmt.Sprintf("%s produce batch %d, %d producers", r.cfg.Scenario, r.cfg.Batch, r.cfg.Producers)
	cons := fmt.Sprintf("%s consume claim %d + ack, %d consumers", r.cfg.Scenario, r.cfg.ClaimMax, r.cfg.Consumers)
	for _, baseline := range r.sides() {
		t := r.target(baseline)
		wl, err := r.workload(ctx, t.Name()[:1], t)
		if err != nil {
			return err
		}
		rep := r.runPhase(ctx, wl, r.spec(t.Name()+" "+r.cfg.Scenario, "mixed"))
		r.result(prod, t.Name(), rep.Produce.Messages, rep.WindowS)
		r.result(cons, t.Name(), rep.Consume.Messages, rep.WindowS)
		r.verify(ctx, wl, t.Name(), true)
	}
	r.ratio("produce", prod)
	r.ratio("consume", cons)
	return nil
}

func (r *runner) benchProduce(ctx context.Context) error {
	c := r.cfg
	wlR, err := r.workload(ctx, "r", r.router)
	if err != nil {
		return err
	}
	wlB, err := r.workload(ctx, "b", r.direct)
	if err != nil {
		return err
	}
	wlS, err := r.workload(ctx, "s", r.router)
	if err != nil {
		return err
	}
	// The Go client: the same single-message senders, each Send gathered
	// with the others' into batched requests by client.Producer.
	pc := c.ClientProducer
	pc.Durability = c.Durability
	ct, err := NewClientTarget(c.Router, c.Token, pc, r.router)
	if err != nil {
		return err
	}
	defer ct.Close()
	wlC, err := r.workload(ctx, "c", ct)
	if err != nil {
		return err
	}
	// The Go client's Publisher: one goroutine, one Publish call per
	// message, the publisher batching them itself.
	ap := c.AsyncPublisher
	ap.Durability = c.Durability
	at, err := NewAsyncTarget(c.Router, c.Token, ap, r.router)
	if err != nil {
		return err
	}
	defer at.Close()
	wlA, err := r.workload(ctx, "a", at)
	if err != nil {
		return err
	}
	batched := fmt.Sprintf("produce batch %d, %d producers", c.Batch, c.Producers)
	single := fmt.Sprintf("produce 1 message per request, %d clients", c.SingleClients)
	clientSingle := fmt.Sprintf("produce 1 message per Send through the Go client, %d goroutines", c.SingleClients)
	clientAsync := fmt.Sprintf("produce %d messages, 1 Publish call at a time, through the Go client's Publisher, 1 goroutine", c.AsyncCount)
	runOne := func(round int, which string) {
		var s phaseSpec
		switch which {
		case "r":
			s = r.spec(fmt.Sprintf("router batched #%d", round+1), "produce")
		case "b":
			s = r.spec(fmt.Sprintf("baseline batched #%d", round+1), "produce")
		case "s":
			s = r.spec(fmt.Sprintf("router single #%d", round+1), "produce")
			s.Producers, s.Batch = c.SingleClients, 1
		case "c":
			s = r.spec(fmt.Sprintf("client single #%d", round+1), "produce")
			s.Producers, s.Batch = c.SingleClients, 1
		case "a":
			// A count, not a duration: the rate is the count over the time
			// from the first Publish to the last answer (a bound of ten
			// minutes only stops a run gone wrong).
			s = r.spec(fmt.Sprintf("client async #%d", round+1), "produce")
			s.Producers, s.Batch, s.Async, s.Count = 1, 1, true, int64(c.AsyncCount)
			s.Warmup, s.Duration = 0, 10*time.Minute
		}
		s.ProduceRate, s.Drain, s.DupShare = 0, 0, 0
		wl := map[string]*workload{"r": wlR, "b": wlB, "s": wlS, "c": wlC, "a": wlA}[which]
		rep := r.runPhase(ctx, wl, s)
		name := batched
		switch which {
		case "s":
			name = single
		case "c":
			name = clientSingle
		case "a":
			name = clientAsync
		}
		r.result(name, wl.target.Name(), rep.Produce.Messages, rep.WindowS)
	}
	for round := range c.Rounds {
		order := []string{"b", "r", "s", "c", "a"}
		if round%2 == 1 {
			order = []string{"a", "c", "s", "r", "b"}
		}
		for _, w := range order {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			runOne(round, w)
		}
	}
	r.verify(ctx, wlR, "router batched", false)
	r.verify(ctx, wlB, "baseline batched", false)
	r.verify(ctx, wlS, "router single", false)
	r.verify(ctx, wlC, "client single", false)
	r.verify(ctx, wlA, "client async", false)
	r.ratio("produce", batched)
	r.ratioOf("client_single_vs_router_batched", clientSingle, "client", batched, "router")
	r.ratioOf("client_async_vs_router_batched", clientAsync, "client", batched, "router")
	r.ratioOf("single_vs_batched_baseline", single, "router", batched, "baseline")
	return nil
}

func (r *runner) benchConsume(ctx context.Context) error {
	c := r.cfg
	wlR, err := r.workload(ctx, "r", r.router)
	if err != nil {
		return err
	}
	wlB, err := r.workload(ctx, "b", r.direct)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("consume claim %d + ack, %d consumers", c.ClaimMax, c.Consumers)
	for round := range c.Rounds {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.preload(ctx, wlR, c.Preload)
		r.preload(ctx, wlB, c.Preload)
		order := []*workload{wlB, wlR}
		if round%2 == 1 {
			order = []*workload{wlR, wlB}
		}
		for _, wl := range order {
			rep := r.runPhase(ctx, wl, r.consumeSpec(fmt.Sprintf("%s consume #%d", wl.target.Name(), round+1)))
			r.result(name, wl.target.Name(), rep.Consume.Messages, rep.WindowS)
		}
	}
	r.verify(ctx, wlR, "router", true)
	r.verify(ctx, wlB, "baseline", true)
	r.ratio("consume", name)
	return r.benchSQS(ctx)
}

// result adds messages over seconds to the named figure of target.
func (r *runner) result(name, target string, msgs int64, secs float64) {
	for i := range r.report.Results {
		res := &r.report.Results[i]
		if res.Name == name && res.Target == target {
			res.Messages += msgs
			res.Seconds += secs
			res.PerSecond = float64(res.Messages) / res.Seconds
			return
		}
	}
	res := Result{Name: name, Target: target, Messages: msgs, Seconds: secs}
	if secs > 0 {
		res.PerSecond = float64(msgs) / secs
	}
	r.report.Results = append(r.report.Results, res)
}

func (r *runner) find(name, target string) (Result, bool) {
	for _, res := range r.report.Results {
		if res.Name == name && res.Target == target {
			return res, true
		}
	}
	return Result{}, false
}

// ratio records router/baseline for the figure name, when both ran.
func (r *runner) ratio(key, name string) { r.ratioOf(key, name, "router", name, "baseline") }

func (r *runner) ratioOf(key, num, numTarget, den, denTarget string) {
	a, ok1 := r.find(num, numTarget)
	b, ok2 := r.find(den, denTarget)
	if !ok1 || !ok2 || b.PerSecond == 0 {
		return
	}
	if r.report.Ratios == nil {
		r.report.Ratios = map[string]float64{}
	}
	r.report.Ratios[key] = a.PerSecond / b.PerSecond
}

// finish writes the verdict.
func (r *runner) finish() {
	rep := r.report
	rep.ElapsedS = time.Since(rep.Started).Seconds()
	sm := &rep.Summary
	for _, v := range rep.Verification {
		sm.Lost += v.Lost
		sm.Duplicated += v.Duplicated
		sm.Pending += v.Pending
		if v.Unexpected > 0 {
			sm.Problems = append(sm.Problems, fmt.Sprintf("%s: %d unexpected deliveries", v.Workload, v.Unexpected))
		}
		if v.Mode == "consumed" && v.Unchecked > 0 {
			// Neither consumed nor found by a lookup: nothing proves it
			// is not lost, so the run cannot pass.
			sm.Problems = append(sm.Problems, fmt.Sprintf("%s: %d acknowledged messages neither consumed nor checked", v.Workload, v.Unchecked))
		}
		if v.Corrupt > 0 {
			sm.Problems = append(sm.Problems, fmt.Sprintf("%s: %d corrupt payloads", v.Workload, v.Corrupt))
		}
		if v.DuplicateOfFresh > 0 || v.Conflicts > 0 {
			sm.Problems = append(sm.Problems, fmt.Sprintf("%s: %d duplicate answers to fresh keys, %d conflicts", v.Workload, v.DuplicateOfFresh, v.Conflicts))
		}
	}
	if sm.Lost > 0 {
		sm.Problems = append([]string{fmt.Sprintf("%d acknowledged messages lost", sm.Lost)}, sm.Problems...)
	}
	if sm.Duplicated > 0 {
		sm.Problems = append(sm.Problems, fmt.Sprintf("%d true duplicates", sm.Duplicated))
	}
	injected := false
	for _, p := range rep.Phases {
		for _, f := range p.Faults {
			injected = true
			if f.Error != "" {
				sm.Problems = append(sm.Problems, fmt.Sprintf("%s: %s %s failed: %s", p.Name, f.Action, f.Target, f.Error))
			}
		}
	}
	if r.cfg.Fault != nil && !injected {
		sm.Problems = append(sm.Problems, fmt.Sprintf("the fault on %s was never injected (fault-at %s is past the phase)", r.cfg.Fault.Name(), r.cfg.FaultAt))
	}
	sm.Passed = len(sm.Problems) == 0
	replicas := 0
	if t := r.cfg.Topology; t != nil {
		for _, c := range t.Clusters {
			replicas = max(replicas, len(c.Replicas))
		}
	}
	rep.Capacity = capacity(rep, r.cfg.Capacity, replicas)
	// The headline rates: the router's (the baseline's when it ran alone).
	want := "router"
	if r.cfg.Scenario == ScenarioBaseline {
		want = "baseline"
	}
	for _, res := range rep.Results {
		if res.Target != want {
			continue
		}
		switch {
		case strings.Contains(res.Name, "produce") && sm.ProducedPerSec == 0:
			sm.ProducedPerSec = res.PerSecond
		case strings.Contains(res.Name, "consume") && sm.ConsumedPerSec == 0:
			sm.ConsumedPerSec = res.PerSecond
		}
	}
}

// SummaryLines are what a command prints last: the ratios of a
// benchmark, ending with the one its make target names, or the verdict
// line `lost: N, duplicated: N, produced/s: X, consumed/s: Y`.
func (rep *Report) SummaryLines() []string {
	var out []string
	sm := rep.Summary
	verdict := fmt.Sprintf("lost: %d, duplicated: %d, produced/s: %.0f, consumed/s: %.0f", sm.Lost, sm.Duplicated, sm.ProducedPerSec, sm.ConsumedPerSec)
	if rep.Servers != "" {
		out = append(out, "servers: "+rep.Servers)
	}
	for _, res := range rep.Results {
		out = append(out, fmt.Sprintf("%s %s: %.0f messages/s (%d in %.1f s)", res.Target, res.Name, res.PerSecond, res.Messages, res.Seconds))
	}
	switch rep.Scenario {
	case ScenarioBenchProduce:
		out = append(out, verdict)
		if v, ok := rep.Ratios["single_vs_batched_baseline"]; ok {
			out = append(out, fmt.Sprintf("single-message ratio router/batched baseline: %.2f", v))
		}
		if v, ok := rep.Ratios["client_single_vs_router_batched"]; ok {
			out = append(out, fmt.Sprintf("client single-message ratio: %.2f", v))
		}
		if v, ok := rep.Ratios["client_async_vs_router_batched"]; ok {
			out = append(out, fmt.Sprintf("client async ratio: %.2f", v))
		}
		out = append(out, fmt.Sprintf("produce ratio router/baseline: %.2f", rep.Ratios["produce"]))
	case ScenarioBenchConsume:
		out = append(out, verdict)
		if v, ok := rep.Ratios[sqsRatioID]; ok {
			out = append(out, fmt.Sprintf("sqs consume ratio sqs/native: %.2f", v))
		}
		out = append(out, fmt.Sprintf("consume ratio router/baseline: %.2f", rep.Ratios["consume"]))
	default:
		for _, k := range sortedKeys(rep.Ratios) {
			out = append(out, fmt.Sprintf("%s ratio router/baseline: %.2f", k, rep.Ratios[k]))
		}
		if st := rep.Settings; st.Routers > 1 || st.Workers > 0 {
			out = append(out, fmt.Sprintf("routers: %d, workers: %d", st.Routers, max(st.Workers, 1)))
		}
		out = append(out, verdict)
	}
	return out
}
