package client

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PublisherConfig tunes a Publisher. Zero values take the defaults.
type PublisherConfig struct {
	// Durability of every request: DurabilityPrimary or
	// DurabilityReplicated. Defaults to "" (the router's default, primary).
	Durability string
	// Linger is how long a message waits for others before its request
	// is sent (Kafka's linger.ms). A request leaves earlier when MaxBatch
	// messages or MaxBatchBytes are ready, and while Flush or Close waits.
	// Defaults to 5ms; negative sends at once (requests still gather what
	// queued while every slot was busy).
	Linger time.Duration
	// MaxBatch caps messages per request (the router takes up to 1000).
	// Defaults to 500, the router's group-commit batch.
	MaxBatch int
	// MaxBatchBytes caps the message bytes of one request (the router
	// takes bodies up to 16 MiB). A message larger than this goes alone.
	// Defaults to 4 MiB.
	MaxBatchBytes int
	// MaxInFlight caps produce requests running at once. Defaults to 4.
	MaxInFlight int
	// MaxPerKey caps the messages of one order key (the order key, else
	// the key) that one request carries. Defaults to 1: a key's next
	// message is sent only once the previous one is answered, so no
	// message can be stored before an earlier one of its key that is
	// retried. More raises one key's rate; the router commits one
	// request's messages of one key in one transaction, so they share one
	// fate — except when a transaction fails for another reason than its
	// cluster being unavailable and the router splits it to isolate a bad
	// message: then a later message can be stored while an earlier one is
	// retried (PublisherStats.Overtaken counts it).
	MaxPerKey int
	// MaxAttempts caps the sends of one message whose outcome stays open
	// (answered unavailable or unknown, refused with 503/429, or a request
	// that got no answer). Defaults to 10; 1 disables retries.
	MaxAttempts int
	// InitialBackoff, MaxBackoff: the wait before a message's retry n is
	// InitialBackoff·2^(n-1) capped at MaxBackoff, ±20 % jitter, and never
	// shorter than the answer's Retry-After. Default 50ms and 5s.
	InitialBackoff, MaxBackoff time.Duration
	// BufferMessages and BufferBytes bound what the publisher holds: the
	// messages published and not yet finally answered, and their bytes.
	// Past either, Publish waits for room (or, with ErrorWhenFull, answers
	// ErrBufferFull at once). Defaults to 10,000 messages and 32 MiB.
	BufferMessages int
	BufferBytes    int
	// ErrorWhenFull makes Publish answer ErrBufferFull instead of waiting
	// when the buffer is full.
	ErrorWhenFull bool
}

func (c PublisherConfig) withDefaults() (PublisherConfig, error) {
	switch c.Durability {
	case "", DurabilityPrimary, DurabilityReplicated:
	default:
		return c, fmt.Errorf("client: PublisherConfig.Durability %q: want primary or replicated", c.Durability)
	}
	if c.Linger == 0 {
		c.Linger = 5 * time.Millisecond
	}
	if c.Linger < 0 {
		c.Linger = 0
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 500
	}
	if c.MaxBatch > 1000 {
		return c, fmt.Errorf("client: PublisherConfig.MaxBatch %d: the router takes at most 1000", c.MaxBatch)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxBatchBytes, 4<<20)
	def(&c.MaxInFlight, 4)
	def(&c.MaxPerKey, 1)
	def(&c.MaxAttempts, 10)
	def(&c.BufferMessages, 10000)
	def(&c.BufferBytes, 32<<20)
	if c.InitialBackoff <= 0 {
		c.InitialBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return c, nil
}

// ErrBufferFull is what Publish answers, with ErrorWhenFull, when the
// publisher already holds BufferMessages messages or BufferBytes bytes;
// and, whatever the mode, for a message larger than BufferBytes.
var ErrBufferFull = errors.New("shardmq: publisher buffer full")

// ErrOrderKeyPaused is the outcome of a message not sent because an
// earlier message of its order key failed with its outcome open: sending
// it could store it before that one, if the caller publishes that one
// again. The publisher refuses the order key's messages until Resume.
var ErrOrderKeyPaused = errors.New("shardmq: not sent: an earlier message of its order key failed (see Publisher.Resume)")

// Publisher publishes messages asynchronously, as Kafka's and Pulsar's
// producers do: Publish hands a message over and returns at once; the
// publisher gathers messages into batched requests (Linger, MaxBatch),
// keeps MaxInFlight requests running, retries each message whose outcome
// is open with its own key (deduplication makes a retry safe), and answers
// each message's final outcome through its Publication or callback.
//
// Guarantees:
//   - Each message gets its own outcome: created or duplicate (stored;
//     the error is nil), conflict (ErrConflict), or failed with the error.
//   - Messages of one order key (the order key, else the key) published by
//     one goroutine are stored in publish order: with MaxPerKey 1 a key's
//     next message is sent only after the previous one was answered for
//     good, so a message being retried is never overtaken. When one fails
//     with its outcome open, the key's later messages fail with
//     ErrOrderKeyPaused until Resume.
//   - Memory is bounded by BufferMessages and BufferBytes.
//   - Flush and Close return once every message published before them has
//     its outcome.
//
// Everything queued lives in the process's memory: a crash loses the
// messages not yet answered. Services that must not lose a message write
// it to their own database first (client/outbox; docs/client.md).
//
// A Publisher is safe for concurrent use. The synchronous Producer.Send
// is the other way to produce; both may be used over one Client.
type Publisher struct {
	c   *Client
	cfg PublisherConfig
	// ctx bounds every request; Close cancels it when it gives up.
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // buffered 1: something for the dispatcher to look at
	done   chan struct{} // closed when the dispatcher returned

	mu       sync.Mutex
	chains   map[string]*chain // keyed chains with queued or unresolved messages, and paused ones
	topics   map[string]*topicQueue
	backoff  chainHeap // chains whose first messages wait to be sent again
	live     msgList   // every message without its outcome
	seq      uint64    // of the last message published
	bufBytes int
	space    chan struct{} // closed when room frees up (or on Close) while someone waits
	waiting  int           // Publish calls waiting for room
	inFlight int
	barriers []*barrier // Flush calls waiting
	unpassed int        // answered messages whose callbacks have not returned
	closed   bool
	gaveUp   bool // Close's ctx ended: everything was answered ErrClosed
	stats    PublisherStats
}

// PublisherStats counts what a Publisher did.
type PublisherStats struct {
	// Published counts messages taken by Publish; Stored those answered
	// created or duplicate, Duplicates the latter; Conflicts those whose
	// key is stored with another payload; Failed every other final error.
	Published, Stored, Duplicates, Conflicts, Failed int64
	// Requests counts produce requests; Resent the sends of a message
	// after its first.
	Requests, Resent int64
	// Overtaken counts messages stored while an earlier message of their
	// order key, in the same request, was to be sent again (only possible
	// with MaxPerKey above 1; see there).
	Overtaken int64
	// Buffered and BufferedBytes are held now; Waiting counts Publish
	// calls waiting for room.
	Buffered, BufferedBytes, Waiting int
}

// Publication is one published message's handle: Done is closed once its
// outcome is final, and Wait answers it.
type Publication struct {
	done     chan struct{}
	res      Result
	err      error
	attempts int
}

// Done is closed when the message's outcome is final.
func (p *Publication) Done() <-chan struct{} { return p.done }

// Wait returns the message's final outcome, or ctx's error if ctx ends
// first (the message keeps going). The result is created or duplicate
// (stored; ID names the stored message) with a nil error, or: conflict
// with ErrConflict; a message the router refused, its *Error; a message
// whose outcome stayed open after MaxAttempts, the last error (an *Error
// with code unavailable, or the transport's) — it may or may not be
// stored, publish it again with the same key and order key to know;
// ErrOrderKeyPaused; ErrClosed when Close gave up on it.
func (p *Publication) Wait(ctx context.Context) (Result, error) {
	select {
	case <-p.done:
		return p.res, p.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// Attempts is how many times the message was sent (0 when it never was).
// It waits for Done.
func (p *Publication) Attempts() int {
	<-p.done
	return p.attempts
}

// pubMsg is one message held by the publisher.
type pubMsg struct {
	topic      string
	m          Message
	size       int
	seq        uint64
	attempts   int
	alone      bool // send in a request of its own (isolating a refused request)
	resolved   bool
	pub        *Publication
	cb         func(Result, error)
	res        Result
	err        error
	prev, next *pubMsg // in Publisher.live
}

// chain is the messages of one order key (or key) in publish order: only
// the first ones are ever sent, so none overtakes an earlier one. A
// message with neither key nor order key has a chain of its own.
type chain struct {
	id      string // the chains map's key; "" when the chain is the message's own
	topic   string
	ordered bool // has an order key: an open failure pauses it
	queue   []*pubMsg
	state   chainState
	readyAt time.Time // when it became ready (lingering)
	due     time.Time // when its backoff ends
}

type chainState uint8

const (
	chainIdle    chainState = iota // nothing queued
	chainReady                     // in its topic's queue
	chainSending                   // its first messages are in a request
	chainBackoff                   // its first messages wait to be sent again
	chainPaused                    // an open failure: refuses messages until Resume
)

// topicQueue holds a topic's ready chains: urgent ones (retries, the next
// message of a key whose previous one was just answered) go out at once,
// fresh ones after Linger.
type topicQueue struct {
	name          string
	urgent, fresh fifo[*chain]
	heads, bytes  int // ready chains and their first messages' bytes
}

func (q *topicQueue) push(ch *chain, urgent bool, now time.Time) {
	ch.state, ch.readyAt = chainReady, now
	if urgent {
		q.urgent.push(ch)
	} else {
		q.fresh.push(ch)
	}
	q.heads++
	q.bytes += ch.queue[0].size
}

func (q *topicQueue) peek() *chain {
	if q.urgent.len() > 0 {
		return q.urgent.front()
	}
	return q.fresh.front()
}

func (q *topicQueue) pop() *chain {
	var ch *chain
	if q.urgent.len() > 0 {
		ch = q.urgent.pop()
	} else {
		ch = q.fresh.pop()
	}
	q.heads--
	q.bytes -= ch.queue[0].size
	return ch
}

// batch is one request: a run of first messages of each of its chains.
type batch struct {
	topic string
	parts []part
	wire  []Message // the request's messages, in order
}

type part struct {
	ch  *chain
	run []*pubMsg // ch.queue[:len(run)] when it was sent
}

type barrier struct {
	seq  uint64
	left int
	done chan struct{}
}

// NewPublisher starts a publisher over c. Close it to send what it holds
// and stop it.
func (c *Client) NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{c: c, cfg: cfg, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{}),
		chains: map[string]*chain{}, topics: map[string]*topicQueue{}, space: make(chan struct{})}
	go p.run()
	return p, nil
}

// Publish hands m over for topic and returns its handle at once. It waits
// only when the buffer is full (BufferMessages, BufferBytes), until room
// frees up or ctx ends — ctx bounds that wait and nothing else; with
// ErrorWhenFull it answers ErrBufferFull instead. An error means m was not
// taken: ErrClosed after Close, ErrBufferFull, ctx's error, or an *Error
// with code invalid_request for a message the router would refuse (no
// payload, both payloads, a payload that is not JSON).
//
// Messages one goroutine publishes with one order key (or, without one,
// one key) are stored in the order of its Publish calls (but see
// MaxPerKey).
func (p *Publisher) Publish(ctx context.Context, topic string, m Message) (*Publication, error) {
	pub := &Publication{done: make(chan struct{})}
	if err := p.publish(ctx, topic, m, pub, nil); err != nil {
		return nil, err
	}
	return pub, nil
}

// PublishFunc is Publish with a callback instead of a handle: fn gets the
// message's final outcome (as Publication.Wait answers it) exactly once,
// unless PublishFunc answers an error. fn runs on one of the publisher's
// goroutines (or on the caller's, before PublishFunc returns, when the
// outcome is known at once), possibly at the same time as other
// callbacks. Keep it short, and do not call Flush or Close from it: they
// wait for it to return.
func (p *Publisher) PublishFunc(ctx context.Context, topic string, m Message, fn func(Result, error)) error {
	return p.publish(ctx, topic, m, nil, fn)
}

func (p *Publisher) publish(ctx context.Context, topic string, m Message, pub *Publication, cb func(Result, error)) error {
	if err := checkMessage(m); err != nil {
		return err
	}
	msg := &pubMsg{topic: topic, m: m, size: messageSize(m), pub: pub, cb: cb}
	if msg.size > p.cfg.BufferBytes {
		return fmt.Errorf("publish %q to %s: the message's %d bytes exceed PublisherConfig.BufferBytes (%d): %w",
			m.Key, topic, msg.size, p.cfg.BufferBytes, ErrBufferFull)
	}
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		if p.live.n < p.cfg.BufferMessages && p.bufBytes+msg.size <= p.cfg.BufferBytes {
			break
		}
		if p.cfg.ErrorWhenFull {
			p.mu.Unlock()
			return fmt.Errorf("publish %q to %s: %w", m.Key, topic, ErrBufferFull)
		}
		space := p.space
		p.waiting++
		p.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			p.mu.Lock()
			p.waiting--
			p.mu.Unlock()
			return ctx.Err()
		}
		p.mu.Lock()
		p.waiting--
	}
	p.seq++
	msg.seq = p.seq
	p.live.add(msg)
	p.bufBytes += msg.size
	p.stats.Published++
	id, ordered := chainID(topic, m)
	var ch *chain
	if id != "" {
		ch = p.chains[id]
	}
	if ch != nil && ch.state == chainPaused {
		var fired []*pubMsg
		p.resolve(msg, Result{Key: m.Key}, fmt.Errorf("publish %q to %s: %w", m.Key, topic, ErrOrderKeyPaused), &fired)
		p.mu.Unlock()
		p.callBack(fired)
		return nil
	}
	if ch == nil {
		ch = &chain{id: id, topic: topic, ordered: ordered}
		if id != "" {
			p.chains[id] = ch
		}
	}
	ch.queue = append(ch.queue, msg)
	if ch.state == chainIdle {
		q := p.topic(topic)
		q.push(ch, false, time.Now())
		// The dispatcher needs to know when its topic has something to
		// linger for, or enough to send at once; in between, its timer
		// does.
		full := q.heads == p.cfg.MaxBatch || (q.bytes >= p.cfg.MaxBatchBytes && q.bytes-msg.size < p.cfg.MaxBatchBytes)
		if q.heads == 1 || full {
			p.signal()
		}
	}
	p.mu.Unlock()
	return nil
}

// Resume lets the order key of topic take messages again after a failure
// paused it (ErrOrderKeyPaused). Publish the failed message again first,
// with the same key, then the ones after it: those already stored are
// answered duplicate.
func (p *Publisher) Resume(topic, orderKey string) {
	id, _ := chainID(topic, Message{OrderKey: orderKey})
	p.mu.Lock()
	if ch := p.chains[id]; ch != nil && ch.state == chainPaused {
		delete(p.chains, id)
	}
	p.mu.Unlock()
}

// Flush sends what is held without lingering and returns once every
// message published before it has its final outcome, or ctx's error.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	if p.live.n+p.unpassed == 0 {
		p.mu.Unlock()
		return nil
	}
	b := &barrier{seq: p.seq, left: p.live.n + p.unpassed, done: make(chan struct{})}
	p.barriers = append(p.barriers, b)
	p.signal()
	p.mu.Unlock()
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		for i, x := range p.barriers {
			if x == b {
				p.barriers = append(p.barriers[:i], p.barriers[i+1:]...)
				break
			}
		}
		p.mu.Unlock()
		return ctx.Err()
	}
}

// Close stops taking messages (Publish answers ErrClosed), sends what is
// held and returns once every message has its final outcome. If ctx ends
// first, it cancels the requests in flight and answers every message
// still open with ErrClosed — those in flight may or may not be stored —
// and returns ctx's error: either way every Publication is resolved and
// every callback called. Safe to call twice.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		if p.waiting > 0 {
			close(p.space) // waiting Publish calls answer ErrClosed
			p.space = make(chan struct{})
		}
	}
	p.mu.Unlock()
	err := p.Flush(ctx)
	if err != nil {
		p.giveUp(err)
	}
	p.signal()
	<-p.done
	p.cancel()
	if err != nil {
		return fmt.Errorf("closing the publisher: %w", err)
	}
	return nil
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Buffered, s.BufferedBytes, s.Waiting = p.live.n, p.bufBytes, p.waiting
	return s
}

// giveUp answers every open message ErrClosed and stops the requests.
func (p *Publisher) giveUp(cause error) {
	p.mu.Lock()
	p.gaveUp = true
	p.cancel()
	var fired []*pubMsg
	for m := p.live.head; m != nil; {
		next := m.next
		err := fmt.Errorf("publish %q to %s: %w before its outcome was known (%v); it may be stored: publish it again with the same key to know",
			m.m.Key, m.topic, ErrClosed, cause)
		p.resolve(m, Result{Key: m.m.Key}, err, &fired)
		m = next
	}
	clear(p.chains)
	clear(p.topics)
	p.backoff = nil
	p.mu.Unlock()
	p.callBack(fired)
}

func (p *Publisher) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *Publisher) topic(name string) *topicQueue {
	q := p.topics[name]
	if q == nil {
		q = &topicQueue{name: name}
		p.topics[name] = q
	}
	return q
}

// run is the dispatcher: it moves chains whose backoff ended to their
// topic's queue and starts a request whenever a slot is free and a topic
// has a full batch, a message that lingered long enough, or a retry due.
func (p *Publisher) run() {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		p.mu.Lock()
		if p.gaveUp || (p.closed && p.live.n == 0) {
			p.mu.Unlock()
			return
		}
		now := time.Now()
		for len(p.backoff) > 0 && !p.backoff[0].due.After(now) {
			ch := heap.Pop(&p.backoff).(*chain)
			p.topic(ch.topic).push(ch, true, now)
		}
		var b *batch
		var next time.Time
		if p.inFlight < p.cfg.MaxInFlight {
			b, next = p.take(now)
		}
		if len(p.backoff) > 0 && (next.IsZero() || p.backoff[0].due.Before(next)) {
			next = p.backoff[0].due
		}
		p.mu.Unlock()
		if b != nil {
			go p.send(b)
			continue
		}
		var tick <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			tick = timer.C
		}
		select {
		case <-p.wake:
		case <-tick:
		}
		timer.Stop()
	}
}

// take builds the next request if a topic is due, else answers when the
// first one will be (zero: none is waiting).
func (p *Publisher) take(now time.Time) (*batch, time.Time) {
	var next time.Time
	flushing := len(p.barriers) > 0
	for _, q := range p.topics {
		if q.heads == 0 {
			continue
		}
		if !flushing && q.urgent.len() == 0 && q.heads < p.cfg.MaxBatch && q.bytes < p.cfg.MaxBatchBytes {
			if due := q.fresh.front().readyAt.Add(p.cfg.Linger); due.After(now) {
				if next.IsZero() || due.Before(next) {
					next = due
				}
				continue
			}
		}
		return p.build(q), time.Time{}
	}
	return nil, next
}

// build takes ready chains of q, in order, into one request: up to
// MaxPerKey first messages of each, within MaxBatch and MaxBatchBytes.
func (p *Publisher) build(q *topicQueue) *batch {
	b := &batch{topic: q.name}
	bytes := 0
	for q.heads > 0 && len(b.wire) < p.cfg.MaxBatch {
		ch := q.peek()
		head := ch.queue[0]
		if len(b.wire) > 0 && (head.alone || bytes+head.size > p.cfg.MaxBatchBytes) {
			break
		}
		q.pop()
		n := 1
		bytes += head.size
		for !head.alone && n < len(ch.queue) && n < p.cfg.MaxPerKey && len(b.wire)+n < p.cfg.MaxBatch {
			m := ch.queue[n]
			if m.alone || bytes+m.size > p.cfg.MaxBatchBytes {
				break
			}
			bytes += m.size
			n++
		}
		run := ch.queue[:n:n]
		for _, m := range run {
			m.attempts++
			if m.attempts > 1 {
				p.stats.Resent++
			}
			b.wire = append(b.wire, m.m)
		}
		ch.state = chainSending
		b.parts = append(b.parts, part{ch: ch, run: run})
		if head.alone {
			break
		}
	}
	p.inFlight++
	p.stats.Requests++
	return b
}

// send runs one request and settles its messages.
func (p *Publisher) send(b *batch) {
	res, retryAfter, err := p.c.produce(p.ctx, b.topic, p.cfg.Durability, b.wire)
	var fired []*pubMsg
	p.mu.Lock()
	p.inFlight--
	if !p.gaveUp {
		p.settle(b, res, retryAfter, err, &fired)
	}
	p.mu.Unlock()
	p.signal()
	p.callBack(fired)
}

// settle applies a request's answer to each of its chains: the messages
// with a final outcome are answered; those whose outcome is open stay
// first in their chain, in order, and the chain waits out a backoff
// before they are sent again, so nothing later of the key goes first.
func (p *Publisher) settle(b *batch, results []Result, retryAfter time.Duration, err error, fired *[]*pubMsg) {
	now := time.Now()
	reqRetry, isolate := requestVerdict(err)
	isolate = isolate && len(b.wire) > 1
	i := 0
	for _, pt := range b.parts {
		ch := pt.ch
		var keep []*pubMsg
		var wait time.Duration
		var pause error
		for _, m := range pt.run {
			var res Result
			var ierr error
			var retry bool
			ra := retryAfter
			switch {
			case err == nil:
				res = results[i]
				ierr, retry = itemOutcome(res, ra)
			case isolate:
				// Refused as a whole for what one message holds: send each
				// alone to learn which (nothing was written).
				m.alone = true
				m.attempts--
				keep = append(keep, m)
				i++
				continue
			default:
				res, ierr, retry, ra = Result{Key: m.m.Key}, err, reqRetry, retryAfterOf(err)
			}
			i++
			if retry && m.attempts < p.cfg.MaxAttempts {
				keep = append(keep, m)
				wait = max(wait, retryWait(p.cfg.InitialBackoff, p.cfg.MaxBackoff, m.attempts, ra))
				continue
			}
			switch {
			case ierr == nil:
				if len(keep) > 0 {
					p.stats.Overtaken++
				}
			case retry:
				ierr = fmt.Errorf("publish %q to %s: %d attempts: %w", m.m.Key, m.topic, m.attempts, ierr)
				if ch.ordered {
					pause = ierr
				}
			default:
				ierr = fmt.Errorf("publish %q to %s: %w", m.m.Key, m.topic, ierr)
			}
			p.resolve(m, res, ierr, fired)
		}
		// The chain is keep, then what was queued behind the run: keep
		// takes the run's last places, so nothing behind is copied.
		n := len(pt.run)
		clear(ch.queue[:n-len(keep)])
		copy(ch.queue[n-len(keep):n], keep)
		ch.queue = ch.queue[n-len(keep):]
		switch {
		case pause != nil:
			for _, m := range ch.queue {
				err := fmt.Errorf("publish %q to %s: %w", m.m.Key, m.topic, ErrOrderKeyPaused)
				if m.attempts > 0 {
					err = fmt.Errorf("publish %q to %s: %w; it was sent %d times and may be stored", m.m.Key, m.topic, ErrOrderKeyPaused, m.attempts)
				}
				p.resolve(m, Result{Key: m.m.Key}, err, fired)
			}
			ch.queue, ch.state = nil, chainPaused
		case len(keep) > 0 && !isolate:
			ch.state, ch.due = chainBackoff, now.Add(wait)
			heap.Push(&p.backoff, ch)
		case len(ch.queue) > 0:
			p.topic(ch.topic).push(ch, true, now)
		default:
			ch.state = chainIdle
			if ch.id != "" {
				delete(p.chains, ch.id)
			}
		}
	}
}

// resolve answers m for good and frees its room.
func (p *Publisher) resolve(m *pubMsg, res Result, err error, fired *[]*pubMsg) {
	if m.resolved {
		return
	}
	m.resolved = true
	p.live.remove(m)
	p.bufBytes -= m.size
	if p.waiting > 0 {
		close(p.space)
		p.space = make(chan struct{})
	}
	switch {
	case err == nil:
		p.stats.Stored++
		if res.Status == StatusDuplicate {
			p.stats.Duplicates++
		}
	case errors.Is(err, ErrConflict):
		p.stats.Conflicts++
	default:
		p.stats.Failed++
	}
	if m.pub != nil {
		m.pub.res, m.pub.err, m.pub.attempts = res, err, m.attempts
		close(m.pub.done)
	}
	if m.cb != nil {
		// Flush passes it once its callback ran (callBack).
		m.res, m.err = res, err
		*fired = append(*fired, m)
		p.unpassed++
		return
	}
	p.passed(m)
}

// passed counts m as answered for the Flush calls waiting for it.
func (p *Publisher) passed(m *pubMsg) {
	for j := 0; j < len(p.barriers); j++ {
		if b := p.barriers[j]; m.seq <= b.seq {
			if b.left--; b.left == 0 {
				close(b.done)
				p.barriers = append(p.barriers[:j], p.barriers[j+1:]...)
				j--
			}
		}
	}
}

// callBack runs the callbacks of messages just answered, then lets the
// Flush calls waiting for them pass: Flush and Close return only after
// the callbacks of what they waited for have returned.
func (p *Publisher) callBack(ms []*pubMsg) {
	if len(ms) == 0 {
		return
	}
	for _, m := range ms {
		m.cb(m.res, m.err)
	}
	p.mu.Lock()
	for _, m := range ms {
		p.passed(m)
	}
	p.unpassed -= len(ms)
	p.mu.Unlock()
}

// chainID names the chain a message joins: its topic and order key, else
// its key; "" (a chain of its own) for a message with neither.
func chainID(topic string, m Message) (id string, ordered bool) {
	switch {
	case m.OrderKey != "":
		return topic + "\x00o" + m.OrderKey, true
	case m.Key != "":
		return topic + "\x00k" + m.Key, false
	}
	return "", false
}

// checkMessage refuses what the router would refuse for the message alone
// and the client can tell without knowing the router's limits.
func checkMessage(m Message) error {
	hasJSON := len(m.Payload) > 0
	switch {
	case hasJSON && m.PayloadBytes != nil:
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("message %q: give Payload or PayloadBytes, not both", m.Key)}
	case !hasJSON && m.PayloadBytes == nil:
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("message %q: Payload or PayloadBytes is required", m.Key)}
	case hasJSON && !json.Valid(m.Payload):
		return &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("message %q: Payload is not valid JSON", m.Key)}
	}
	return nil
}

// messageSize is what a message holds in memory and on the wire, about.
func messageSize(m Message) int {
	n := 64 + len(m.Key) + len(m.OrderKey) + len(m.TransactionID) + len(m.DeliverAt) + len(m.Payload) + (len(m.PayloadBytes)+2)/3*4
	for k, v := range m.Headers {
		n += len(k) + len(v) + 6
	}
	return n
}

// requestVerdict says what a request's failure means for its messages:
// retry (the outcome is open: no answer, or a temporary refusal), isolate
// (refused whole for what some message holds: nothing was written), or
// neither (refused for good, e.g. forbidden).
func requestVerdict(err error) (retry, isolate bool) {
	if err == nil {
		return false, false
	}
	var e *Error
	if !errors.As(err, &e) {
		return true, false
	}
	if e.Temporary() {
		return true, false
	}
	switch e.Code {
	case CodeInvalidRequest, CodeInvalidJSON, CodePayloadTooLarge, CodeRequestTooLarge, CodeBatchTooLarge:
		return false, true
	}
	return false, false
}

// msgList is an intrusive list of the messages without an outcome.
type msgList struct {
	head, tail *pubMsg
	n          int
}

func (l *msgList) add(m *pubMsg) {
	m.prev, m.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = m
	} else {
		l.head = m
	}
	l.tail = m
	l.n++
}

func (l *msgList) remove(m *pubMsg) {
	if m.prev != nil {
		m.prev.next = m.next
	} else {
		l.head = m.next
	}
	if m.next != nil {
		m.next.prev = m.prev
	} else {
		l.tail = m.prev
	}
	m.prev, m.next = nil, nil
	l.n--
}

// fifo is a queue over a slice.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }
func (q *fifo[T]) len() int { return len(q.items) - q.head }
func (q *fifo[T]) front() T { return q.items[q.head] }
func (q *fifo[T]) pop() T {
	v := q.items[q.head]
	var zero T
	q.items[q.head] = zero
	q.head++
	switch {
	case q.head == len(q.items):
		q.items, q.head = q.items[:0], 0
	case q.head >= 1024 && q.head*2 >= len(q.items):
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return v
}

// chainHeap orders chains in backoff by when it ends.
type chainHeap []*chain

func (h chainHeap) Len() int           { return len(h) }
func (h chainHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h chainHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *chainHeap) Push(x any)        { *h = append(*h, x.(*chain)) }
func (h *chainHeap) Pop() any {
	old := *h
	ch := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return ch
}
