package loadtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
)

// A fleet of generators shares one scenario: a coordinator (Config.Workers
// > 0) creates the topics and subscriptions, hands each worker its plan
// (its share of the producers' key space and of the rates, one schedule
// for all), keeps the only Verifier, and merges the workers' phase reports
// and HDR histograms into one report with one lost/duplicated proof.
// Workers (RunWorker) stream every answer that matters to the books as
// fixed 32-byte records over HTTP; a worker consumes whatever the
// subscriptions give it, including other workers' keys, and decides what
// to do with a delivery from the key alone (ConsumerPolicy), so no books
// are needed where the traffic is made. The coordinator tells the workers
// when every expected delivery of the fleet is settled, which ends their
// drains. The workers may run on other machines: everything they need is
// in the plan, over plain HTTP.
//
// Routes of the coordinator, under a random path that its URL carries:
// GET /v1/plan (blocks until every worker has
// joined), POST /v1/events?worker=N&done=0|1 (records; answers whether the
// fleet is settled), POST /v1/result?worker=N (the worker's phase report).

// Plan is what a worker is told to do.
type Plan struct {
	Worker  int       `json:"worker"`
	Workers int       `json:"workers"`
	Run     string    `json:"run"`
	Start   time.Time `json:"start"`
	Routers []string  `json:"routers"`
	Routing string    `json:"routing"`
	// Token is set only when the coordinator made the routers' token for
	// this run (routers it started); otherwise workers bring their own.
	Token          string        `json:"token,omitempty"`
	Topics         []string      `json:"topics"`
	Subs           []string      `json:"subscriptions"`
	Scenario       string        `json:"scenario"`
	Producers      int           `json:"producers"`
	Consumers      int           `json:"consumers"`
	Batch          int           `json:"batch"`
	ClaimMax       int           `json:"claim_max"`
	ProduceRate    float64       `json:"produce_rate"` // this worker's share
	ConsumeRate    float64       `json:"consume_rate"`
	Duration       time.Duration `json:"duration"`
	Warmup         time.Duration `json:"warmup"`
	Drain          time.Duration `json:"drain"`
	Visibility     time.Duration `json:"visibility"`
	Wait           time.Duration `json:"wait"`
	NackRetryAfter time.Duration `json:"nack_retry_after"`
	Payload        Dist          `json:"payload"`
	Keys           KeyDist       `json:"keys"`
	DupShare       float64       `json:"dup_share"`
	NackShare      float64       `json:"nack_share"`
	RetryShare     float64       `json:"retry_share"`
	DropShare      float64       `json:"drop_share"`
	Durability     string        `json:"durability,omitempty"`
}

// WorkerResult is a worker's end of the phase: its report, its latency
// histograms to merge, and its traffic per vshard.
type WorkerResult struct {
	Worker   int                               `json:"worker"`
	CPUs     int                               `json:"cpus"`
	Phase    PhaseReport                       `json:"phase"`
	Hist     map[string]*hdrhistogram.Snapshot `json:"histograms"`
	Produced []int64                           `json:"produced_per_vshard"`
	Consumed []int64                           `json:"consumed_per_vshard"`
	// LatencySeconds are the phase's per-second latency histograms by
	// series (produce, claim, e2e), for the merged timeline's curves.
	LatencySeconds map[string][][][2]uint32 `json:"latency_seconds,omitempty"`
}

// Records of the stream, 32 bytes each: kind, status, pair (or topic),
// attempt, key id, message id, time received (deliveries).
const recLen = 32

const (
	recSent = iota + 1
	recCreated
	recStoredDup
	recDupFresh
	recConflict
	recReceived
	recCorrupt
	recUnexpected
	recAcked
	recNacked
)

// statusNames are the ack and nack answers a record carries; 0 is an
// unknown outcome.
var statusNames = []string{"unavailable", "ok", "lease_lost", "not_found", "retry_scheduled", "dead"}

func statusCode(s string) uint8 {
	for i, n := range statusNames {
		if n == s {
			return uint8(i)
		}
	}
	return 0
}

type record struct {
	kind, status uint8
	pair         uint16
	attempt      uint32
	k            keyID
	id           uint64
	at           int64 // deliveries: when received (unix ns)
}

func (r record) append(b []byte) []byte {
	b = append(b, r.kind, r.status)
	b = binary.LittleEndian.AppendUint16(b, r.pair)
	b = binary.LittleEndian.AppendUint32(b, r.attempt)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.k))
	b = binary.LittleEndian.AppendUint64(b, r.id)
	return binary.LittleEndian.AppendUint64(b, uint64(r.at))
}

func parseRecord(b []byte) record {
	return record{kind: b[0], status: b[1], pair: binary.LittleEndian.Uint16(b[2:]), attempt: binary.LittleEndian.Uint32(b[4:]),
		k: keyID(binary.LittleEndian.Uint64(b[8:])), id: binary.LittleEndian.Uint64(b[16:]), at: int64(binary.LittleEndian.Uint64(b[24:]))}
}

// consumed reports whether the record is a consumer's (a delivery, an
// ack or a nack of a key): those of one key are applied in order, after
// the key's Sent record, which comes from the worker that produced it.
func (r record) consumed() bool {
	switch r.kind {
	case recReceived, recAcked, recNacked:
		return true
	}
	return false
}

// remoteBooks are a worker's books: records buffered for the coordinator.
type remoteBooks struct {
	policy  ConsumerPolicy
	mu      sync.Mutex
	buf     []byte
	settled atomic.Bool
}

var _ books = (*remoteBooks)(nil)

func (b *remoteBooks) add(r record) {
	b.mu.Lock()
	b.buf = r.append(b.buf)
	b.mu.Unlock()
}

func (b *remoteBooks) take() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.buf
	b.buf = nil
	return out
}

func (b *remoteBooks) Sent(k keyID, topic int) {
	b.add(record{kind: recSent, pair: uint16(topic), k: k})
}
func (b *remoteBooks) Created(k keyID, id uint64) { b.add(record{kind: recCreated, k: k, id: id}) }
func (b *remoteBooks) StoredByDuplicate(k keyID, id uint64) {
	b.add(record{kind: recStoredDup, k: k, id: id})
}
func (b *remoteBooks) DuplicateOfFresh() { b.add(record{kind: recDupFresh}) }
func (b *remoteBooks) Conflict()         { b.add(record{kind: recConflict}) }
func (b *remoteBooks) Corrupt()          { b.add(record{kind: recCorrupt}) }
func (b *remoteBooks) Unexpected()       { b.add(record{kind: recUnexpected}) }

func (b *remoteBooks) Received(pair int, k keyID, id uint64, attempt int, at time.Time) Action {
	b.add(record{kind: recReceived, pair: uint16(pair), attempt: uint32(max(attempt, 0)), k: k, id: id, at: at.UnixNano()})
	return b.policy.action(k, attempt)
}

func (b *remoteBooks) Acked(pair int, k keyID, status string) {
	b.add(record{kind: recAcked, status: statusCode(status), pair: uint16(pair), k: k})
}

func (b *remoteBooks) Nacked(pair int, k keyID, status string) {
	b.add(record{kind: recNacked, status: statusCode(status), pair: uint16(pair), k: k})
}

// Outstanding is 0 once the coordinator said the fleet is settled, 1
// before (a worker cannot count the fleet's deliveries).
func (b *remoteBooks) Outstanding() int64 {
	if b.settled.Load() {
		return 0
	}
	return 1
}

// coordinator is the coordinator's side of a fleet run.
type coordinator struct {
	n    int
	v    *Verifier
	plan Plan

	mu      sync.Mutex
	joined  int
	all     chan struct{} // closed when every worker has joined
	done    []bool        // the worker's producers are done and it resends nothing
	limbo   map[keyID][]record
	records int64
	results []*WorkerResult
	got     int
	in      chan struct{} // closed when every result is in
}

// apply applies records in order. A delivery of a key whose Sent record
// has not arrived yet (another worker produced it and has not streamed it)
// waits in limbo with the key's later consumer records until it has; the
// producer's records are applied as they come.
func (c *coordinator) apply(data []byte) {
	for len(data) >= recLen {
		r := parseRecord(data[:recLen])
		data = data[recLen:]
		c.records++
		if r.consumed() {
			if _, parked := c.limbo[r.k]; parked {
				c.limbo[r.k] = append(c.limbo[r.k], r)
				continue
			}
			if r.kind == recReceived && !c.v.known(r.k) {
				c.limbo[r.k] = []record{r}
				continue
			}
		}
		c.applyOne(r)
	}
	for k, rs := range c.limbo {
		if c.v.known(k) {
			for _, r := range rs {
				c.applyOne(r)
			}
			delete(c.limbo, k)
		}
	}
}

// flushLimbo applies what is left in limbo: keys nobody sent.
func (c *coordinator) flushLimbo() {
	for k, rs := range c.limbo {
		for _, r := range rs {
			c.applyOne(r)
		}
		delete(c.limbo, k)
	}
}

func (c *coordinator) applyOne(r record) {
	v := c.v
	switch r.kind {
	case recSent:
		v.Sent(r.k, int(r.pair))
	case recCreated:
		v.Created(r.k, r.id)
	case recStoredDup:
		v.StoredByDuplicate(r.k, r.id)
	case recDupFresh:
		v.DuplicateOfFresh()
	case recConflict:
		v.Conflict()
	case recReceived:
		v.Received(int(r.pair), r.k, r.id, int(r.attempt), time.Unix(0, r.at))
	case recCorrupt:
		v.Corrupt()
	case recUnexpected:
		v.Unexpected()
	case recAcked:
		v.Acked(int(r.pair), r.k, statusNames[min(int(r.status), len(statusNames)-1)])
	case recNacked:
		v.Nacked(int(r.pair), r.k, statusNames[min(int(r.status), len(statusNames)-1)])
	}
}

func (c *coordinator) settledLocked() bool {
	for _, d := range c.done {
		if !d {
			return false
		}
	}
	return len(c.limbo) == 0 && c.v.Outstanding() <= 0
}

func workerParam(r *http.Request, n int) (int, error) {
	w, err := strconv.Atoi(r.URL.Query().Get("worker"))
	if err != nil || w < 0 || w >= n {
		return 0, fmt.Errorf("worker %q is not one of 0..%d", r.URL.Query().Get("worker"), n-1)
	}
	return w, nil
}

func (c *coordinator) handler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/plan", func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		if c.joined >= c.n {
			c.mu.Unlock()
			http.Error(w, "every worker has joined", http.StatusConflict)
			return
		}
		share := c.joined
		c.joined++
		if c.joined == c.n {
			// One schedule for all: far enough ahead for every worker to
			// have its answer and its connections.
			c.plan.Start = time.Now().Add(2 * time.Second)
			close(c.all)
		}
		c.mu.Unlock()
		select {
		case <-c.all:
		case <-ctx.Done():
			http.Error(w, "coordinator stopped", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			return
		}
		c.mu.Lock()
		p := c.plan
		c.mu.Unlock()
		p.Worker = share
		json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("POST /v1/events", func(w http.ResponseWriter, r *http.Request) {
		wk, err := workerParam(r, c.n)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		data, err := io.ReadAll(r.Body)
		if err != nil || len(data)%recLen != 0 {
			http.Error(w, "records: truncated body", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.apply(data)
		c.done[wk] = r.URL.Query().Get("done") == "1"
		settled := c.settledLocked()
		c.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]bool{"settled": settled})
	})
	mux.HandleFunc("POST /v1/result", func(w http.ResponseWriter, r *http.Request) {
		wk, err := workerParam(r, c.n)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var res WorkerResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
			http.Error(w, "result: "+err.Error(), http.StatusBadRequest)
			return
		}
		res.Worker = wk
		c.mu.Lock()
		if c.results[wk] == nil {
			c.results[wk] = &res
			c.got++
			if c.got == c.n {
				close(c.in)
			}
		}
		c.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// coordinate runs the mixed scenarios as the coordinator of cfg.Workers
// generators.
func (r *runner) coordinate(ctx context.Context) error {
	cfg := r.cfg
	wl, err := r.workload(ctx, "r", r.router)
	if err != nil {
		return err
	}
	n := cfg.Workers
	c := &coordinator{n: n, v: wl.v.(*Verifier), all: make(chan struct{}), in: make(chan struct{}),
		done: make([]bool, n), limbo: map[keyID][]record{}, results: make([]*WorkerResult, n)}
	c.plan = Plan{Workers: n, Run: r.run, Routers: cfg.Routers, Routing: r.router.mode, Topics: wl.topics, Subs: wl.subs,
		Scenario: cfg.Scenario, Producers: cfg.Producers, Consumers: cfg.Consumers, Batch: cfg.Batch, ClaimMax: cfg.ClaimMax,
		ProduceRate: cfg.ProduceRate / float64(n), ConsumeRate: cfg.ConsumeRate / float64(n),
		Duration: cfg.Duration, Warmup: cfg.Warmup, Drain: cfg.Drain, Visibility: cfg.Visibility, Wait: cfg.Wait,
		NackRetryAfter: cfg.NackRetryAfter, Payload: cfg.Payload, Keys: cfg.Keys,
		DupShare: cfg.DupShare, NackShare: cfg.NackShare, RetryShare: cfg.RetryShare, DropShare: cfg.DropShare, Durability: cfg.Durability}
	if cfg.ShareToken {
		c.plan.Token = cfg.Token
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("coordinator: listen: %w", err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	// The coordinator's routes live under a random path: only whoever was
	// given the URL joins (the plan may carry the run's token).
	var secret [12]byte
	rand.Read(secret[:])
	prefix := "/" + hex.EncodeToString(secret[:])
	url := "http://" + ln.Addr().String() + prefix
	srv := &http.Server{Handler: http.StripPrefix(prefix, c.handler(sctx)), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	fmt.Fprintf(cfg.Progress, "== coordinator %s: waiting for %d workers (loadtest -worker %s)\n", url, n, url)
	if cfg.OnCoordinator != nil {
		if err := cfg.OnCoordinator(url); err != nil {
			return err
		}
	}
	select {
	case <-c.all:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Minute):
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("coordinator: %d of %d workers joined in 5 minutes", c.joined, n)
	}
	c.mu.Lock()
	start := c.plan.Start
	c.mu.Unlock()
	ctxwait.Sleep(ctx, time.Until(start))
	// The workers report their own CPU as "loadtest"; this process is
	// the coordinator.
	sources := append([]CPUSource(nil), cfg.CPU...)
	for i := range sources {
		if sources[i].Name == "loadtest" {
			sources[i].Name = "coordinator"
		}
	}
	cpu := newCPUTracker(sources)
	cpu.start()
	stopCPU := make(chan struct{})
	go cpu.run(time.Second, stopCPU)
	go cpu.markAt(start.Add(cfg.Duration), stopCPU)
	name := "router " + cfg.Scenario
	// The fault is the coordinator's: it runs the routers and knows the
	// sandbox; it strikes on the workers' common schedule.
	var faults *phase
	stopFault, faultDone := make(chan struct{}), make(chan struct{})
	endFault := sync.OnceFunc(func() { close(stopFault) })
	defer endFault()
	if cfg.Fault != nil {
		faults = &phase{spec: phaseSpec{Name: name, Fault: cfg.Fault, FaultAt: cfg.FaultAt, FaultDown: cfg.FaultDown}, cfg: cfg, start: start}
		r.faulted = true
		go func() { defer close(faultDone); faults.injectFault(ctx, stopFault) }()
	} else {
		close(faultDone)
	}
	fmt.Fprintf(cfg.Progress, "== %s (%d routers, %d workers, mixed)\n", name, len(cfg.Routers), n)
	limit := time.NewTimer(cfg.Duration + cfg.Drain + 2*time.Minute)
	defer limit.Stop()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-c.in:
			break wait
		case <-ctx.Done():
			close(stopCPU)
			return ctx.Err()
		case <-limit.C:
			close(stopCPU)
			c.mu.Lock()
			defer c.mu.Unlock()
			return fmt.Errorf("coordinator: %d of %d workers sent no result by the end of the drain", n-c.got, n)
		case <-tick.C:
			c.mu.Lock()
			fmt.Fprintf(cfg.Progress, "fleet %3.0fs | acknowledged %s, consumed %s, outstanding %s | %s records\n", time.Since(start).Seconds(),
				human(float64(c.v.c.created.Load()+c.v.c.storedDup.Load())), human(float64(c.v.c.acked.Load())), human(float64(c.v.Outstanding())), human(float64(c.records)))
			c.mu.Unlock()
		}
	}
	close(stopCPU)
	endFault()
	<-faultDone
	c.mu.Lock()
	c.flushLimbo()
	results := c.results
	c.mu.Unlock()
	rep := mergePhase(name, results, r.smap())
	if faults != nil {
		faults.faultMu.Lock()
		rep.Faults = append([]FaultEvent(nil), faults.faults...)
		faults.faultMu.Unlock()
		rep.Recovery = recovery(rep.Timeline, rep.Faults, cfg.Warmup.Seconds(), "mixed")
	}
	var moved int64
	for _, res := range results {
		moved += res.Phase.moved()
	}
	rep.CPU = mergeCPU(cpu.finish(moved), results, moved)
	rep.CPUTimeline = cpu.timeline() // the coordinator's machine: its routers and servers
	r.report.Phases = append(r.report.Phases, rep)
	r.report.Settings.Workers = n
	r.result(fmt.Sprintf("%s produce batch %d, %d producers × %d workers", cfg.Scenario, cfg.Batch, cfg.Producers, n), "router", rep.Produce.Messages, rep.WindowS)
	r.result(fmt.Sprintf("%s consume claim %d + ack, %d consumers × %d workers", cfg.Scenario, cfg.ClaimMax, cfg.Consumers, n), "router", rep.Consume.Messages, rep.WindowS)
	r.verify(ctx, wl, "router", true)
	return nil
}

// moved is what a worker's phase produced and consumed in all (its CPU
// per message is over that).
func (p PhaseReport) moved() int64 {
	var n int64
	for _, pt := range p.Timeline {
		n += pt.Produced + pt.Consumed
	}
	return n
}

// mergePhase adds the workers' phases up into one: counts summed, rates
// over the common window, latencies from the merged histograms.
func mergePhase(name string, results []*WorkerResult, smap *routing.Map) PhaseReport {
	out := PhaseReport{Name: name, Target: "router", Kind: "mixed", Errors: map[string]int64{}, Statuses: map[string]int64{}}
	prod := &Flow{}
	cons := &Flow{}
	snaps := map[string][]*hdrhistogram.Snapshot{}
	var vsP, vsC vshardCounts
	for _, res := range results {
		p := res.Phase
		out.Producers += p.Producers
		out.Consumers += p.Consumers
		out.Batch, out.ClaimMax = p.Batch, p.ClaimMax
		out.ElapsedS = max(out.ElapsedS, p.ElapsedS)
		out.WindowS = max(out.WindowS, p.WindowS)
		out.Offered += p.Offered
		out.Behind += p.Behind
		out.Unresolved += p.Unresolved
		for k, n := range p.Errors {
			out.Errors[k] += n
		}
		for k, n := range p.Statuses {
			out.Statuses[k] += n
		}
		if p.Produce != nil {
			prod.Messages += p.Produce.Messages
			prod.Requests += p.Produce.Requests
			prod.Target += p.Produce.Target
		}
		if p.Consume != nil {
			cons.Messages += p.Consume.Messages
			cons.Target += p.Consume.Target
		}
		for i, pt := range p.Timeline {
			for len(out.Timeline) <= i {
				out.Timeline = append(out.Timeline, Point{Second: len(out.Timeline)})
			}
			out.Timeline[i].Produced += pt.Produced
			out.Timeline[i].Consumed += pt.Consumed
			out.Timeline[i].Errors += pt.Errors
		}
		g := GeneratorUse{Worker: res.Worker, CPUs: res.CPUs}
		for _, u := range p.CPU {
			switch u.Name {
			case "loadtest":
				g.Cores = u.Cores
			case "machine":
				g.MachineCores = u.Cores
			}
		}
		out.Generators = append(out.Generators, g)
		for k, s := range res.Hist {
			snaps[k] = append(snaps[k], s)
		}
		for i := 0; i < shard.Count && i < len(res.Produced); i++ {
			vsP[i].Add(res.Produced[i])
		}
		for i := 0; i < shard.Count && i < len(res.Consumed); i++ {
			vsC[i].Add(res.Consumed[i])
		}
	}
	// The workers' phases started together: their seconds line up.
	merged := &Timeline{}
	for i, name := range latNames {
		merged.lat[i] = newLatencySeries(len(out.Timeline))
		for _, res := range results {
			merged.lat[i].merge(res.LatencySeconds[name])
		}
	}
	merged.fillLatency(out.Timeline)
	if out.WindowS > 0 {
		prod.PerSecond = float64(prod.Messages) / out.WindowS
		cons.PerSecond = float64(cons.Messages) / out.WindowS
	}
	prod.Latency = mergeLatency(snaps["produce"])
	cons.Latency = mergeLatency(snaps["claim"])
	ack, e2e := mergeLatency(snaps["ack"]), mergeLatency(snaps["e2e"])
	cons.AckLatency, cons.EndToEnd = &ack, &e2e
	out.Produce, out.Consume = prod, cons
	out.HotVShards, out.VShardsUsed = vsP.top(5)
	if smap != nil {
		idx := map[string]int{}
		for _, name := range smap.Clusters() {
			idx[name] = len(out.Clusters)
			out.Clusters = append(out.Clusters, ClusterShare{Cluster: name})
		}
		var total int64
		for v := range shard.Count {
			name, _ := smap.Lookup(shard.ID(v))
			i, ok := idx[name]
			if !ok {
				continue
			}
			out.Clusters[i].Produced += vsP[v].Load()
			out.Clusters[i].Consumed += vsC[v].Load()
			total += vsP[v].Load()
		}
		for i := range out.Clusters {
			if total > 0 {
				out.Clusters[i].Share = float64(out.Clusters[i].Produced) / float64(total)
			}
		}
	}
	return out
}

// mergeCPU is the coordinator's own view (the machine, routers and
// servers it watches, and itself) plus the workers' own processes as
// "loadtest".
func mergeCPU(own []CPUUse, results []*WorkerResult, moved int64) []CPUUse {
	var secs, wall float64
	for _, res := range results {
		wall = max(wall, res.Phase.ElapsedS)
		for _, u := range res.Phase.CPU {
			if u.Name == "loadtest" {
				secs += u.Seconds
			}
		}
	}
	out := own
	var mix float64
	for _, res := range results {
		for _, u := range res.Phase.CPU {
			if u.Name == "loadtest" {
				mix += u.MixSeconds
			}
		}
	}
	if secs > 0 && wall > 0 {
		u := CPUUse{Name: "loadtest", Seconds: secs, Cores: secs / wall, MixSeconds: mix}
		if moved > 0 {
			u.PerMessageUS = secs * 1e6 / float64(moved)
		}
		out = append(out, u)
	}
	return out
}

// WorkerOptions are a worker's own settings (the rest is the plan).
type WorkerOptions struct {
	// Token for the routers, unless the plan carries one.
	Token string
	// Progress receives the worker's own progress line.
	Progress io.Writer
	// CPU lists the processes the worker's phase reports (its own).
	CPU []CPUSource
	// Wrap, when set, wraps the worker's target (tests inject faults
	// with it).
	Wrap func(worker int, t Target) Target
}

// RunWorker joins the coordinator at url, runs its share of the plan and
// sends its books and its result. It returns the result it sent.
func RunWorker(ctx context.Context, url string, opts WorkerOptions) (*WorkerResult, error) {
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	hc := &http.Client{}
	var plan Plan
	pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	err := httpJSON(pctx, hc, http.MethodGet, url+"/v1/plan", nil, &plan)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("worker: plan: %w", err)
	}
	cfg, err := Config{Scenario: plan.Scenario, Routers: plan.Routers, Routing: plan.Routing, Producers: plan.Producers, Consumers: plan.Consumers,
		Batch: plan.Batch, ClaimMax: plan.ClaimMax, ProduceRate: plan.ProduceRate, ConsumeRate: plan.ConsumeRate,
		Duration: plan.Duration, Warmup: plan.Warmup, Drain: plan.Drain, Visibility: plan.Visibility, Wait: plan.Wait,
		NackRetryAfter: plan.NackRetryAfter, Payload: plan.Payload, Keys: plan.Keys, Topics: len(plan.Topics), Subscriptions: len(plan.Subs),
		DupShare: plan.DupShare, NackShare: plan.NackShare, RetryShare: plan.RetryShare, DropShare: plan.DropShare,
		Durability: plan.Durability, CPU: opts.CPU, Progress: opts.Progress}.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("worker: plan: %w", err)
	}
	token := plan.Token
	if token == "" {
		token = opts.Token
	}
	var rs []*Router
	for _, u := range plan.Routers {
		rt := NewRouter(u, cfg.Producers+cfg.Consumers+8, cfg.Durability)
		rt.SetToken(token)
		rs = append(rs, rt)
	}
	fleet, err := NewFleet(rs, plan.Routing)
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	var target Target = fleet
	if opts.Wrap != nil {
		target = opts.Wrap(plan.Worker, fleet)
	}
	rb := &remoteBooks{policy: ConsumerPolicy{NackShare: cfg.NackShare, RetryShare: cfg.RetryShare, DropShare: cfg.DropShare}}
	wl := &workload{target: target, ks: newKeyspace(plan.Run, cfg.Payload, cfg.Keys), topics: plan.Topics, subs: plan.Subs, v: rb,
		seqs: make([]uint64, cfg.Producers)}
	spec := phaseSpec{Name: fmt.Sprintf("worker %d %s", plan.Worker, cfg.Scenario), Kind: "mixed", Producers: cfg.Producers, Consumers: cfg.Consumers,
		Batch: cfg.Batch, ClaimMax: cfg.ClaimMax, ProduceRate: cfg.ProduceRate, ConsumeRate: cfg.ConsumeRate, Duration: cfg.Duration,
		Warmup: cfg.Warmup, Drain: cfg.Drain, DupShare: cfg.DupShare, KeyBase: plan.Worker * cfg.Producers, Start: plan.Start}
	p := newPhase(spec, &cfg, wl, nil)

	send := func(ctx context.Context, data []byte, done bool) error {
		d := "0"
		if done {
			d = "1"
		}
		var out struct {
			Settled bool `json:"settled"`
		}
		u := fmt.Sprintf("%s/v1/events?worker=%d&done=%s", url, plan.Worker, d)
		// A batch is resent until it is taken (the proof needs every
		// record), for up to a minute: a coordinator that long gone has
		// given up on the run.
		giveUp := time.Now().Add(time.Minute)
		for {
			err := httpJSON(ctx, hc, http.MethodPost, u, data, &out)
			if err == nil {
				rb.settled.Store(out.Settled)
				return nil
			}
			if time.Now().After(giveUp) || ctxwait.Sleep(ctx, 200*time.Millisecond) != nil {
				return fmt.Errorf("worker: stream records: %w", err)
			}
		}
	}
	localDone := func() bool { return p.producersDone.Load() && p.retry.len() == 0 }
	stream, streamed := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stream:
				streamed <- nil
				return
			case <-tick.C:
			}
			done := localDone()
			if err := send(ctx, rb.take(), done); err != nil {
				streamed <- err
				return
			}
		}
	}()
	rep := p.run(ctx, &progress{w: opts.Progress})
	close(stream)
	if err := <-streamed; err != nil {
		return nil, err
	}
	if err := send(ctx, rb.take(), true); err != nil {
		return nil, err
	}
	res := &WorkerResult{Worker: plan.Worker, CPUs: runtime.NumCPU(), Phase: rep, Produced: p.vshards.list(), Consumed: p.vshardsC.list(),
		Hist:           map[string]*hdrhistogram.Snapshot{"produce": p.produceLat.export(), "claim": p.claimLat.export(), "ack": p.ackLat.export(), "e2e": p.e2eLat.export()},
		LatencySeconds: map[string][][][2]uint32{}}
	for i, name := range latNames {
		res.LatencySeconds[name] = p.timeline.lat[i].export()
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := httpJSON(rctx, hc, http.MethodPost, fmt.Sprintf("%s/v1/result?worker=%d", url, plan.Worker), body, nil); err != nil {
		return nil, fmt.Errorf("worker: send result: %w", err)
	}
	return res, nil
}

// httpJSON sends body (nil: no body) and decodes a 2xx answer into out.
func httpJSON(ctx context.Context, hc *http.Client, method, url string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return errors.Join(fmt.Errorf("%s %s: bad answer", method, url), err)
	}
	return nil
}
