package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
)

// workload is a set of topics that one target writes and reads, with the
// keys made for them and their books. Phases share it: a consume phase
// drains what a preload phase wrote; the rounds of a benchmark add to it.
type workload struct {
	target Target
	ks     *keyspace
	topics []string
	subs   []string
	v      books
	seqs   []uint64 // next sequence number per producer worker
	lookup lookupFunc
}

func (w *workload) pairs() int { return len(w.topics) * len(w.subs) }

// books is what a phase records its answers in: the Verifier itself, or
// (a worker of a fleet of generators) a stream of records to the
// coordinator's Verifier.
type books interface {
	Sent(k keyID, topic int)
	Created(k keyID, id uint64)
	StoredByDuplicate(k keyID, id uint64)
	DuplicateOfFresh()
	Conflict()
	Received(pair int, k keyID, id uint64, attempt int, at time.Time) Action
	Corrupt()
	Unexpected()
	Acked(pair int, k keyID, status string)
	Nacked(pair int, k keyID, status string)
	// Outstanding is the expected deliveries not settled yet (of the
	// whole fleet, for a worker).
	Outstanding() int64
}

var _ books = (*Verifier)(nil)

// phaseSpec is one measured stretch of a run.
type phaseSpec struct {
	Name string
	// Kind: "produce" (producers only), "consume" (consumers drain what
	// is there) or "mixed" (both at once, then a drain).
	Kind                     string
	Producers, Consumers     int
	Batch, ClaimMax          int
	ProduceRate, ConsumeRate float64 // 0: closed loop
	Duration, Warmup, Drain  time.Duration
	// Count stops the producers after this many new keys (preloads).
	Count    int64
	DupShare float64
	// Fault, when set, is killed FaultAt into the phase and restarted
	// FaultDown later.
	Fault              Fault
	FaultAt, FaultDown time.Duration
	// Preload marks a phase that only prepares data (reported apart).
	Preload bool
	// Async replaces the producers with one goroutine that publishes
	// Count fresh keys, one Publish call each, through the workload's
	// AsyncTarget (the Go client's asynchronous publisher).
	Async bool
	// KeyBase is added to the producer worker numbers in the keys: a
	// generator of a fleet writes its own share of the key space.
	KeyBase int
	// Start, when set, is when the phase starts (every generator of a
	// fleet follows one schedule); it waits until then.
	Start time.Time
}

// phase is a running phaseSpec.
type phase struct {
	spec  phaseSpec
	cfg   *Config
	wl    *workload
	smap  *routing.Map // nil: no per-cluster distribution
	clIdx map[string]int
	cls   []string

	start, measureFrom, end time.Time
	prodPacer, consPacer    *Pacer

	produceLat, claimLat, ackLat, e2eLat *Latency

	mProduced, mCreated, mConsumed, mRequests atomic.Int64 // in the measured window
	produced, consumed                        atomic.Int64 // whole phase
	offered                                   atomic.Int64 // new keys sent
	clProduced, clConsumed                    []atomic.Int64
	vshards                                   vshardCounts // produced
	vshardsC                                  vshardCounts // consumed
	errs, statuses                            Counts
	timeline                                  *Timeline
	retry                                     retryQueue
	remaining                                 atomic.Int64 // Count mode
	lastProduce                               atomic.Int64 // unix ns of the last answer that stored one
	producersDone                             atomic.Bool
	firstAck, lastAck                         atomic.Int64 // unix ns, consume phases
	faultMu                                   sync.Mutex
	faults                                    []FaultEvent
}

func newPhase(spec phaseSpec, cfg *Config, wl *workload, smap *routing.Map) *phase {
	p := &phase{spec: spec, cfg: cfg, wl: wl, smap: smap,
		produceLat: NewLatency(), claimLat: NewLatency(), ackLat: NewLatency(), e2eLat: NewLatency()}
	if smap != nil {
		p.cls = smap.Clusters()
		p.clIdx = map[string]int{}
		for i, c := range p.cls {
			p.clIdx[c] = i
		}
		p.clProduced = make([]atomic.Int64, len(p.cls))
		p.clConsumed = make([]atomic.Int64, len(p.cls))
	}
	return p
}

func (p *phase) cluster(v int) int {
	if p.smap == nil || v < 0 || v >= shard.Count {
		return -1
	}
	name, _ := p.smap.Lookup(shard.ID(v))
	return p.clIdx[name]
}

// inWindow reports whether t falls in the measured window.
func (p *phase) inWindow(t time.Time) bool { return !t.Before(p.measureFrom) && !t.After(p.end) }

// run runs the phase to its end and returns its report.
func (p *phase) run(ctx context.Context, progress *progress) PhaseReport {
	s := p.spec
	if !s.Start.IsZero() {
		ctxwait.Sleep(ctx, time.Until(s.Start))
	}
	p.start = time.Now()
	if !s.Start.IsZero() && p.start.Sub(s.Start) < time.Second {
		p.start = s.Start
	}
	p.measureFrom = p.start.Add(s.Warmup)
	p.end = p.start.Add(s.Duration)
	hardEnd := p.end.Add(s.Drain).Add(30 * time.Second)
	ctx, cancel := context.WithDeadline(ctx, hardEnd)
	defer cancel()
	p.timeline = newTimeline(p.start, hardEnd.Sub(p.start))
	p.prodPacer = NewPacer(s.ProduceRate/float64(max(s.Batch, 1)), p.start, p.end)
	p.consPacer = NewPacer(s.ConsumeRate/float64(max(s.ClaimMax, 1)), p.start, p.end)
	p.remaining.Store(s.Count)

	cpu := newCPUTracker(p.cfg.CPU)
	cpu.start()
	stopCPU := make(chan struct{})
	go cpu.run(time.Second, stopCPU)
	if s.Kind == "mixed" {
		go cpu.markAt(p.end, stopCPU)
	}
	var prod, cons, aux sync.WaitGroup
	if s.Kind != "consume" {
		switch {
		case s.Async:
			prod.Go(func() { p.publisher(ctx) })
		default:
			for w := range s.Producers {
				prod.Go(func() { p.producer(ctx, w) })
			}
		}
		for range max(2, s.Producers/2) {
			aux.Add(1)
			go func() { defer aux.Done(); p.retrier(ctx) }()
		}
	} else {
		p.producersDone.Store(true)
	}
	if s.Kind != "produce" {
		for i := range s.Consumers {
			cons.Add(1)
			go func() { defer cons.Done(); p.consumer(ctx, i) }()
		}
	}
	stopFault := make(chan struct{})
	if s.Fault != nil {
		aux.Add(1)
		go func() { defer aux.Done(); p.injectFault(ctx, stopFault) }()
	}
	stopProg, progDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(progDone); progress.follow(ctx, p, stopProg) }()

	prod.Wait()
	p.producersDone.Store(true)
	cons.Wait()
	close(stopFault)
	aux.Wait()
	close(stopProg)
	<-progDone
	close(stopCPU)
	rep := p.report()
	rep.CPU = cpu.finish(p.produced.Load() + p.consumed.Load())
	rep.CPUTimeline = cpu.timeline()
	return rep
}

// producer is worker w: it takes a slot of the schedule, sends one batch
// of fresh keys (some deliberate repeats in the dedup share) and books the
// answers.
func (p *phase) producer(ctx context.Context, w int) {
	wl, s := p.wl, p.spec
	topic := w % len(wl.topics)
	rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for {
		intended, ok := p.prodPacer.Next(ctx)
		if !ok {
			return
		}
		if !p.roomToProduce(ctx) {
			return
		}
		n := s.Batch
		if s.Count > 0 {
			left := p.remaining.Add(-int64(n))
			if left+int64(n) <= 0 {
				return
			}
			if left < 0 {
				n += int(left)
			}
		}
		msgs := make([]Message, 0, n)
		for range n {
			seq := wl.seqs[w]
			if seq > 0 && s.DupShare > 0 && rnd.Float64() < s.DupShare {
				// Repeat one of this worker's recent keys.
				back := min(seq, 10000)
				k := newKeyID(s.KeyBase+w, seq-1-rnd.Uint64N(back))
				msgs = append(msgs, p.message(k, topic, true))
				continue
			}
			wl.seqs[w]++
			k := newKeyID(s.KeyBase+w, seq)
			wl.v.Sent(k, topic)
			msgs = append(msgs, p.message(k, topic, false))
		}
		p.offered.Add(int64(n))
		res, err := wl.target.Produce(ctx, wl.topics[topic], msgs)
		done := time.Now()
		// Latency runs from the intended time; whether it counts goes by
		// when the answer came, so that a run far behind its schedule
		// still measures the requests it sent in the window.
		p.produceLat.Record(done.Sub(intended), p.inWindow(done))
		p.timeline.latency(latProduce, done, done.Sub(intended))
		if p.inWindow(done) {
			p.mRequests.Add(1)
		}
		p.booksProduce(topic, msgs, res, err, done)
	}
}

// publisher is the one goroutine of an Async phase: it publishes Count
// fresh keys one Publish call at a time through the target's
// client.Publisher, each answer booked by its callback, then flushes.
// A message the publisher gave up on goes to the retry queue, as a
// producer's would.
func (p *phase) publisher(ctx context.Context) {
	wl, s := p.wl, p.spec
	pub := wl.target.(*AsyncTarget).Publisher()
	requests := pub.Stats().Requests // the publisher serves every round
	const topic = 0
	for range s.Count {
		seq := wl.seqs[0]
		wl.seqs[0]++
		k := newKeyID(s.KeyBase, seq)
		wl.v.Sent(k, topic)
		m := p.message(k, topic, false)
		p.offered.Add(1)
		sent := time.Now()
		book := func(res client.Result, err error) {
			done := time.Now()
			p.produceLat.Record(done.Sub(sent), p.inWindow(done))
			pr, re := fromClient(res, err)
			if re != nil {
				p.booksProduce(topic, []Message{m}, nil, re, done)
				return
			}
			p.booksProduce(topic, []Message{m}, []ProduceResult{pr}, nil, done)
		}
		if err := pub.PublishFunc(ctx, wl.topics[topic], clientMessage(m), book); err != nil {
			book(client.Result{}, err) // not taken (the run is ending): the retriers send it
			if ctx.Err() != nil {
				return
			}
		}
	}
	pub.Flush(ctx)
	p.mRequests.Store(pub.Stats().Requests - requests)
}

func (p *phase) message(k keyID, topic int, repeat bool) Message {
	key := p.wl.ks.key(k)
	return Message{ID: k, Key: key, OrderKey: p.wl.ks.orderKey(k), Payload: p.wl.ks.payloadJSON(key, k), Repeat: repeat, topic: topic}
}

// booksProduce records a produce request's answers; items whose outcome is
// unknown go to the retry queue (deliberate repeats are dropped: their
// original was answered already).
func (p *phase) booksProduce(topic int, msgs []Message, res []ProduceResult, err error, done time.Time) {
	v := p.wl.v
	sec := p.timeline.at(done)
	if err != nil {
		p.errs.Add(errorCode(err), int64(len(msgs)))
		sec.errors.Add(int64(len(msgs)))
		var retry []Message
		for _, m := range msgs {
			if !m.Repeat {
				m.Retry = true
				retry = append(retry, m)
			}
		}
		var re *RequestError
		if errors.As(err, &re) && re.Status >= 400 && re.Status < 500 {
			return // refused as invalid: resending will not help
		}
		p.retry.add(topic, retry)
		return
	}
	var ok int64
	var retry []Message
	for i, r := range res {
		m := msgs[i]
		p.statuses.Add(r.Status, 1)
		switch r.Status {
		case "created":
			v.Created(m.ID, r.ID)
		case "duplicate":
			switch {
			case m.Repeat:
			case m.Retry:
				v.StoredByDuplicate(m.ID, r.ID)
			default:
				v.DuplicateOfFresh()
			}
		case "conflict":
			v.Conflict()
			p.errs.Add("conflict", 1)
			sec.errors.Add(1)
			continue
		default: // unavailable
			code := r.Code
			if code == "" {
				code = r.Status
			}
			p.errs.Add("item_"+code, 1)
			sec.errors.Add(1)
			if !m.Repeat {
				m.Retry = true
				retry = append(retry, m)
			}
			continue
		}
		ok++
		if r.VShard >= 0 && r.VShard < shard.Count {
			p.vshards[r.VShard].Add(1)
		}
		if c := p.cluster(r.VShard); c >= 0 {
			p.clProduced[c].Add(1)
		}
		if p.inWindow(done) {
			p.mProduced.Add(1)
			if r.Status == "created" {
				p.mCreated.Add(1)
			}
		}
	}
	p.produced.Add(ok)
	sec.produced.Add(ok)
	if ok > 0 {
		p.lastProduce.Store(done.UnixNano())
	}
	p.retry.add(topic, retry)
}

// roomToProduce waits while the retry queue holds Config.RetryBuffer
// items or more (the slot's intended time stays, so the wait shows as
// latency and as the schedule falling behind); false when the run's
// production ended meanwhile.
func (p *phase) roomToProduce(ctx context.Context) bool {
	limit := p.cfg.RetryBuffer
	for limit > 0 && p.retry.len() >= limit {
		if time.Now().After(p.end) || ctxwait.Sleep(ctx, 20*time.Millisecond) != nil {
			return false
		}
	}
	return true
}

// retryQueue holds items whose produce outcome is unknown, per topic.
type retryQueue struct {
	mu    sync.Mutex
	items map[int][]Message
	n     int
}

func (q *retryQueue) add(topic int, msgs []Message) {
	if len(msgs) == 0 {
		return
	}
	q.mu.Lock()
	if q.items == nil {
		q.items = map[int][]Message{}
	}
	q.items[topic] = append(q.items[topic], msgs...)
	q.n += len(msgs)
	q.mu.Unlock()
}

func (q *retryQueue) take(max int) (int, []Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for t, list := range q.items {
		n := min(max, len(list))
		out := append([]Message(nil), list[:n]...)
		if n == len(list) {
			delete(q.items, t)
		} else {
			q.items[t] = list[n:]
		}
		q.n -= n
		return t, out
	}
	return 0, nil
}

func (q *retryQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// retrier (one of a few) resends items of unknown outcome with the same
// keys, a batch at a time with a pause between rounds, until the producers are done and
// the queue is empty, or the drain is over. A resent item answered
// duplicate proves the first attempt was stored.
func (p *phase) retrier(ctx context.Context) {
	deadline := p.end.Add(max(p.spec.Drain, 10*time.Second))
	pause := 200 * time.Millisecond
	for {
		if p.producersDone.Load() && p.retry.len() == 0 {
			return
		}
		if time.Now().After(deadline) || ctxwait.Sleep(ctx, pause) != nil {
			return
		}
		// Resend while it works; back off (up to the 1 s Retry-After the
		// router gives) while it does not.
		pause = 200 * time.Millisecond
		for {
			topic, msgs := p.retry.take(max(p.spec.Batch, 100))
			if len(msgs) == 0 {
				break
			}
			res, err := p.wl.target.Produce(ctx, p.wl.topics[topic], msgs)
			p.booksProduce(topic, msgs, res, err, time.Now())
			failed := err != nil
			for _, r := range res {
				failed = failed || r.Status == "unavailable" || r.Status == "unknown"
			}
			if failed || time.Now().After(deadline) {
				pause = time.Second
				break
			}
		}
	}
}

// consumersStop reports whether the consumers are done.
func (p *phase) consumersStop(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	now := time.Now()
	settled := p.producersDone.Load() && p.retry.len() == 0 && p.wl.v.Outstanding() <= 0
	switch p.spec.Kind {
	case "consume":
		return settled || now.After(p.end)
	default:
		if now.Before(p.end) {
			return false
		}
		return p.spec.Drain == 0 || settled || now.After(p.end.Add(p.spec.Drain))
	}
}

// consumer i serves one (topic, subscription) pair: claim, check each
// delivery against the books, then ack (or nack, or drop, as the consumer
// policy says for the key) in one request each.
func (p *phase) consumer(ctx context.Context, i int) {
	wl, s := p.wl, p.spec
	pair := i % wl.pairs()
	topic, sub := wl.topics[pair/len(wl.subs)], wl.subs[pair%len(wl.subs)]
	name := "lt-" + wl.ks.run + "-c" + strconv.Itoa(s.KeyBase+i)
	paced := s.ConsumeRate > 0 && s.Kind == "mixed"
	for !p.consumersStop(ctx) {
		intended := time.Now()
		if paced && intended.Before(p.end) {
			var ok bool
			if intended, ok = p.consPacer.Next(ctx); !ok {
				// The schedule is over: wait for its end, then drain unpaced.
				ctxwait.Sleep(ctx, time.Until(p.end))
				continue
			}
		}
		wait := p.cfg.Wait
		if !intended.Before(p.end) {
			wait = min(wait, 500*time.Millisecond)
		}
		ds, err := wl.target.Claim(ctx, ClaimRequest{Topic: topic, Subscription: sub, Consumer: name, Max: s.ClaimMax, Lease: p.cfg.Visibility, Wait: wait})
		done := time.Now()
		if err != nil {
			p.errs.Add("claim_"+errorCode(err), 1)
			p.timeline.at(done).errors.Add(1)
			ctxwait.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		if len(ds) > 0 {
			p.claimLat.Record(done.Sub(intended), p.inWindow(done))
			p.timeline.latency(latClaim, done, done.Sub(intended))
		}
		p.settle(ctx, pair, ds, done)
	}
}

// settle books a claim's deliveries and acks or nacks them.
func (p *phase) settle(ctx context.Context, pair int, ds []Delivery, claimed time.Time) {
	wl := p.wl
	var acks, nacks []Receipt
	var ackKeys, nackKeys []keyID
	var ackVS []int
	for _, d := range ds {
		k, err := wl.ks.parse(d.Key)
		if err != nil {
			wl.v.Unexpected()
			acks, ackKeys, ackVS = append(acks, d.Receipt), append(ackKeys, foreignKey), append(ackVS, d.VShard)
			continue
		}
		if !bytes.Equal(d.Payload, wl.ks.payloadJSON(d.Key, k)) {
			wl.v.Corrupt()
		}
		if d.Attempt <= 1 && !d.ProducedAt.IsZero() {
			p.e2eLat.Record(claimed.Sub(d.ProducedAt), p.inWindow(claimed))
			p.timeline.latency(latE2E, claimed, claimed.Sub(d.ProducedAt))
		}
		switch wl.v.Received(pair, k, d.ID, d.Attempt, claimed) {
		case ActAck:
			acks, ackKeys, ackVS = append(acks, d.Receipt), append(ackKeys, k), append(ackVS, d.VShard)
		case ActNack:
			nacks, nackKeys = append(nacks, d.Receipt), append(nackKeys, k)
		}
	}
	if len(acks) > 0 {
		t0 := time.Now()
		st, err := wl.target.Ack(ctx, acks)
		done := time.Now()
		p.ackLat.Record(done.Sub(t0), p.inWindow(done))
		if err != nil {
			p.errs.Add("ack_"+errorCode(err), int64(len(acks)))
			p.timeline.at(done).errors.Add(int64(len(acks)))
		}
		var ok int64
		for j, k := range ackKeys {
			status := "unavailable"
			if err == nil {
				status = st[j]
			}
			if k != foreignKey {
				wl.v.Acked(pair, k, status)
			}
			if status != "ok" {
				if err == nil {
					p.errs.Add("ack_"+status, 1)
				}
				continue
			}
			ok++
			if v := ackVS[j]; v >= 0 && v < shard.Count {
				p.vshardsC[v].Add(1)
			}
			if c := p.cluster(ackVS[j]); c >= 0 {
				p.clConsumed[c].Add(1)
			}
		}
		p.consumed.Add(ok)
		p.timeline.at(done).consumed.Add(ok)
		if p.inWindow(done) {
			p.mConsumed.Add(ok)
		}
		if ok > 0 {
			p.firstAck.CompareAndSwap(0, done.UnixNano())
			p.lastAck.Store(done.UnixNano())
		}
	}
	if len(nacks) > 0 {
		items := make([]NackItem, len(nacks))
		for j, r := range nacks {
			items[j] = NackItem{Receipt: r, Code: "E_LOADTEST", RetryAfter: p.cfg.NackRetryAfter}
		}
		st, err := wl.target.Nack(ctx, items)
		if err != nil {
			p.errs.Add("nack_"+errorCode(err), int64(len(nacks)))
		}
		for j, k := range nackKeys {
			status := "unavailable"
			if err == nil {
				status = st[j]
			}
			wl.v.Nacked(pair, k, status)
			p.statuses.Add("nack_"+status, 1)
		}
	}
}

// injectFault kills the fault's target FaultAt into the phase and
// restarts it FaultDown later.
func (p *phase) injectFault(ctx context.Context, stop <-chan struct{}) {
	f, s := p.spec.Fault, p.spec
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-stop:
			return false
		case <-ctx.Done():
			return false
		}
	}
	if !wait(time.Until(p.start.Add(s.FaultAt))) {
		return
	}
	ev := FaultEvent{Target: f.Name(), Action: "kill -9", At: time.Since(p.start).Seconds()}
	if err := f.Kill(ctx); err != nil {
		ev.Error = err.Error()
		p.addFault(ev)
		return
	}
	p.addFault(ev)
	// The restart runs even if the phase ends first: nothing is left dead.
	t := time.NewTimer(s.FaultDown)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	ev = FaultEvent{Target: f.Name(), Action: "restart", At: time.Since(p.start).Seconds()}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	err := f.Restart(rctx)
	ev.Took = time.Since(p.start).Seconds() - ev.At
	if err != nil {
		ev.Error = err.Error()
	}
	p.addFault(ev)
}

func (p *phase) addFault(ev FaultEvent) {
	p.faultMu.Lock()
	p.faults = append(p.faults, ev)
	p.faultMu.Unlock()
	fmt.Fprintf(p.cfg.Progress, "\n%s: %s %s at %.1fs%s\n", p.spec.Name, ev.Action, ev.Target, ev.At, errSuffix(ev.Error))
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " failed: " + e
}
