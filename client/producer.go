package client

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/internal/backoff"
	"github.com/shardmq/shardmq/internal/ctxwait"
)

// ProducerConfig tunes a Producer. Zero values take the defaults.
type ProducerConfig struct {
	// Durability of every request: DurabilityPrimary or
	// DurabilityReplicated. Defaults to "" (the router's default, primary).
	Durability string
	// Linger is how long the first message of a batch waits for others
	// before its request is sent (Kafka's linger.ms). A message never
	// waits longer than Linger plus the time a request slot takes to free.
	// The wait ends early when no request is in flight and the batch
	// holds as many messages as were answered since the previous request
	// was sent: callers that send one message at a time are back, and
	// waiting longer would only delay them. Defaults to 1ms; negative sends at once (requests still gather
	// what queued while all slots were busy).
	Linger time.Duration
	// MaxBatch caps messages per request (the router takes up to 1000).
	// Defaults to 500.
	MaxBatch int
	// MaxInFlight caps produce requests running at once. Defaults to 2:
	// a commit costs the database far more than a message in it, so fewer,
	// larger requests carry more messages per transaction (measured in
	// docs/performance.md), while a second request in flight keeps one
	// slow cluster from holding every message back.
	MaxInFlight int
	// MaxAttempts caps the sends of one message that keeps being answered
	// unavailable (or whose request fails in transit, or is refused with
	// 503/429). Defaults to 10; 1 disables retries.
	MaxAttempts int
	// InitialBackoff, MaxBackoff: the wait before retry n is
	// InitialBackoff·2^(n-1) capped at MaxBackoff, ±20 % jitter, and never
	// shorter than the answer's Retry-After. Default 50ms and 5s.
	InitialBackoff, MaxBackoff time.Duration
}

func (c ProducerConfig) withDefaults() (ProducerConfig, error) {
	switch c.Durability {
	case "", DurabilityPrimary, DurabilityReplicated:
	default:
		return c, fmt.Errorf("client: ProducerConfig.Durability %q: want primary or replicated", c.Durability)
	}
	if c.Linger == 0 {
		c.Linger = time.Millisecond
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 500
	}
	if c.MaxBatch > 1000 {
		return c, fmt.Errorf("client: ProducerConfig.MaxBatch %d: the router takes at most 1000", c.MaxBatch)
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 2
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 10
	}
	if c.InitialBackoff <= 0 {
		c.InitialBackoff = 50 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return c, nil
}

// Producer sends messages, gathering the Send calls of many goroutines
// into batched requests. It is safe for concurrent use. Close it to send
// what is queued and stop its goroutine.
type Producer struct {
	c   *Client
	cfg ProducerConfig
	in  chan *pending
	sem chan struct{}
	// answered counts messages whose answers are handed to their
	// callers; the collector compares it with its value when the previous
	// request was sent to know how many callers are on their way back.
	answered atomic.Int64
	// inFlight counts requests sent and not yet answered.
	inFlight atomic.Int64

	mu     sync.RWMutex // held for reading while enqueueing, for writing by Close
	closed bool
	done   chan struct{} // closed when the collector and every request ended
	sends  sync.WaitGroup
}

// pending is one message waiting for its answer.
type pending struct {
	topic string
	msg   Message
	out   chan outcome // buffered 1
}

type outcome struct {
	res        Result
	err        error // the request failed as a whole
	retryAfter time.Duration
}

// NewProducer starts a producer over c.
func (c *Client) NewProducer(cfg ProducerConfig) (*Producer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Producer{c: c, cfg: cfg, in: make(chan *pending, cfg.MaxBatch*cfg.MaxInFlight),
		sem: make(chan struct{}, cfg.MaxInFlight), done: make(chan struct{})}
	go p.collect()
	return p, nil
}

// SendResult is one message's outcome in SendMany.
type SendResult struct {
	Result
	Err error
}

// Send produces one message to topic and waits for its own answer. It
// shares a request with the messages other goroutines send meanwhile.
// The result is created or duplicate (the key was stored before; ID names
// the original) with a nil error. A conflict answers ErrConflict; an item
// still unavailable after MaxAttempts answers an *Error with code
// unavailable; a request the router refused answers its *Error.
//
// If ctx ends first, Send returns ctx's error and the message may or may
// not be stored: send it again with the same key (and order key) to know.
func (p *Producer) Send(ctx context.Context, topic string, m Message) (Result, error) {
	var wait time.Duration
	var lastErr error
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if err := ctxwait.Sleep(ctx, wait); err != nil {
				return Result{Key: m.Key}, fmt.Errorf("send %q to %s after %d attempts (last: %v): %w", m.Key, topic, attempt-1, lastErr, err)
			}
		}
		o, err := p.once(ctx, topic, m)
		if err != nil {
			return Result{Key: m.Key}, err
		}
		switch {
		case o.err == nil:
			ierr, retry := itemOutcome(o.res, o.retryAfter)
			switch {
			case ierr == nil:
				return o.res, nil
			case !retry:
				return o.res, fmt.Errorf("send %q to %s: %w", m.Key, topic, ierr)
			}
			lastErr = ierr
		case retryable(o.err):
			lastErr = o.err
		default:
			return Result{Key: m.Key}, fmt.Errorf("send %q to %s: %w", m.Key, topic, o.err)
		}
		if attempt >= p.cfg.MaxAttempts {
			return o.res, fmt.Errorf("send %q to %s: %d attempts: %w", m.Key, topic, attempt, lastErr)
		}
		wait = retryWait(p.cfg.InitialBackoff, p.cfg.MaxBackoff, attempt, max(o.retryAfter, retryAfterOf(lastErr)))
	}
}

// itemOutcome is what one produced item's answer means: nil for created and
// duplicate (stored), ErrConflict, and otherwise an *Error with the item's
// code — retry says whether its outcome is open and a send with the same
// key may succeed (unavailable; unknown, a commit whose outcome the router
// could not learn) or not (rejected: the database refused a value).
func itemOutcome(r Result, retryAfter time.Duration) (err error, retry bool) {
	switch r.Status {
	case StatusCreated, StatusDuplicate:
		return nil, false
	case StatusConflict:
		return ErrConflict, false
	}
	e := &Error{Code: CodeUnavailable, Message: "item answered " + r.Status, RetryAfter: retryAfter}
	if r.Error != nil {
		e.Code, e.Message = r.Error.Code, r.Error.Message
	}
	return e, r.Status == StatusUnavailable || r.Status == StatusUnknown
}

// SendMany sends msgs to topic and answers each one's outcome, in order,
// as Send would (each message is retried on its own, so one unavailable
// cluster delays only its own messages).
func (p *Producer) SendMany(ctx context.Context, topic string, msgs []Message) []SendResult {
	out := make([]SendResult, len(msgs))
	var wg sync.WaitGroup
	for i := range msgs {
		wg.Go(func() {
			res, err := p.Send(ctx, topic, msgs[i])
			out[i] = SendResult{Result: res, Err: err}
		})
	}
	wg.Wait()
	return out
}

// once queues m and waits for the answer of the request that carried it.
func (p *Producer) once(ctx context.Context, topic string, m Message) (outcome, error) {
	pd := &pending{topic: topic, msg: m, out: make(chan outcome, 1)}
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return outcome{}, ErrClosed
	}
	select {
	case p.in <- pd:
		p.mu.RUnlock()
	case <-ctx.Done():
		p.mu.RUnlock()
		return outcome{}, ctx.Err()
	}
	select {
	case o := <-pd.out:
		return o, nil
	case <-ctx.Done():
		return outcome{}, ctx.Err()
	}
}

// retryWait is the wait before retry number attempt: initial·2^(attempt-1)
// capped at most, ±20 % jitter, never shorter than retryAfter.
func retryWait(initial, most time.Duration, attempt int, retryAfter time.Duration) time.Duration {
	return max(backoff.Policy{Initial: initial, Max: most, Jitter: 0.2}.Wait(attempt), retryAfter)
}

// collect gathers queued messages into batches: it takes the first, waits
// for a request slot, then keeps taking until Linger has passed since the
// first arrived or MaxBatch is reached, and sends one request per topic.
func (p *Producer) collect() {
	defer func() {
		p.sends.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var answeredAtSend int64
	for {
		first, ok := <-p.in
		if !ok {
			return
		}
		start := time.Now()
		byTopic := map[string][]*pending{first.topic: {first}}
		order := []string{first.topic}
		n := 1
		add := func(pd *pending) {
			if _, ok := byTopic[pd.topic]; !ok {
				order = append(order, pd.topic)
			}
			byTopic[pd.topic] = append(byTopic[pd.topic], pd)
			n++
		}
		p.sem <- struct{}{} // a request slot; messages queue meanwhile
		closed := false
	drain:
		for n < p.cfg.MaxBatch {
			select {
			case pd, ok := <-p.in:
				if !ok {
					closed = true
					break drain
				}
				add(pd)
				continue
			default:
			}
			// With no request in flight, the callers answered since the
			// last request went out are all anyone can expect: once they
			// are back, lingering only delays them. (While a request is in
			// flight the linger runs out, so that its callers, answered
			// meanwhile, can join this batch.)
			if back := p.answered.Load() - answeredAtSend; back > 0 && int64(n) >= back && p.inFlight.Load() == 0 {
				break
			}
			wait := p.cfg.Linger - time.Since(start)
			if wait <= 0 {
				break
			}
			timer.Reset(wait)
			select {
			case pd, ok := <-p.in:
				timer.Stop()
				if !ok {
					closed = true
					break drain
				}
				add(pd)
			case <-timer.C:
				break drain
			}
		}
		answeredAtSend = p.answered.Load()
		for i, topic := range order {
			if i > 0 {
				p.sem <- struct{}{}
			}
			batch := byTopic[topic]
			p.inFlight.Add(1)
			p.sends.Go(func() {
				defer func() { <-p.sem }()
				p.send(topic, batch)
			})
		}
		if closed {
			return
		}
	}
}

// send runs one produce request and answers each message of it.
func (p *Producer) send(topic string, batch []*pending) {
	msgs := make([]Message, len(batch))
	for i, pd := range batch {
		msgs[i] = pd.msg
	}
	// The request is not bound to any one caller's context: it carries
	// messages of many callers. Config.Timeout bounds it.
	res, retryAfter, err := p.c.produce(context.Background(), topic, p.cfg.Durability, msgs)
	// Counted before the answers are handed over, so a caller that is back
	// already finds itself counted.
	p.answered.Add(int64(len(batch)))
	p.inFlight.Add(-1)
	for i, pd := range batch {
		if err != nil {
			pd.out <- outcome{err: err, retryAfter: retryAfterOf(err)}
			continue
		}
		pd.out <- outcome{res: res[i], retryAfter: retryAfter}
	}
}

// Close stops taking messages, sends what is queued, and returns once
// every request is answered or ctx ends. Sends after Close answer
// ErrClosed. Safe to call twice.
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.in)
	}
	p.mu.Unlock()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("closing the producer: %w", ctx.Err())
	}
}
