package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
)

// Handler processes one delivery. Returning nil acks it; returning an
// error nacks it (unless the handler settled it itself with d.Ack, d.Nack
// or d.Abandon), with the code and retry time of a *HandlerError when the
// error wraps one (else code DefaultErrorCode and the subscription's
// backoff). ctx ends when the consumer stops past its grace period or the
// lease was lost (another consumer may then hold the message).
type Handler func(ctx context.Context, d *Delivery) error

// HandlerError is how a Handler chooses the nack's error code (kept on
// the delivery and its dead letter) and, optionally, when to retry.
type HandlerError struct {
	Code string // e.g. "E_STOCK"; 64 bytes at most
	Err  error
	// RetryAfter, when not nil, replaces the subscription's backoff.
	RetryAfter *time.Duration
}

func (e *HandlerError) Error() string {
	if e.Err == nil {
		return e.Code
	}
	return e.Code + ": " + e.Err.Error()
}
func (e *HandlerError) Unwrap() error { return e.Err }

// DefaultErrorCode is the nack code of a handler error without a
// *HandlerError.
const DefaultErrorCode = "E_HANDLER"

// ReleaseErrorCode is the code of the nacks that hand back deliveries on
// Stop (retry at once).
const ReleaseErrorCode = "E_RELEASED"

// ConsumerConfig says what a Consumer consumes and how.
type ConsumerConfig struct {
	Topic, Subscription string
	// Name is the consumer's name in the trace. Defaults to the token's.
	Name string
	// Concurrency caps handlers running at once; the loop claims only as
	// many deliveries as there are free slots, so nothing waits leased
	// while no handler runs it. Defaults to 8.
	Concurrency int
	// MaxClaim caps one claim. Defaults to Concurrency.
	MaxClaim int
	// Visibility is the lease of a claim and of each extension. Defaults
	// to 30s.
	Visibility time.Duration
	// ExtendEvery is how often the leases of running handlers are
	// extended. Defaults to Visibility/3.
	ExtendEvery time.Duration
	// Wait long-polls each claim. Defaults to 10s (at most 20s).
	Wait time.Duration
}

func (c ConsumerConfig) withDefaults() (ConsumerConfig, error) {
	if c.Topic == "" || c.Subscription == "" {
		return c, errors.New("client: ConsumerConfig.Topic and Subscription are required")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.MaxClaim <= 0 || c.MaxClaim > c.Concurrency {
		c.MaxClaim = min(c.Concurrency, 1000)
	}
	if c.Visibility <= 0 {
		c.Visibility = 30 * time.Second
	}
	if c.ExtendEvery <= 0 {
		c.ExtendEvery = c.Visibility / 3
	}
	if c.Wait <= 0 {
		c.Wait = 10 * time.Second
	}
	if c.Wait > 20*time.Second {
		return c, fmt.Errorf("client: ConsumerConfig.Wait %s: the router waits at most 20s", c.Wait)
	}
	return c, nil
}

// Consumer claims deliveries of one subscription and runs a Handler for
// each, with at most Concurrency at once, extending the leases of those
// still running. Start it once; Stop it to finish.
type Consumer struct {
	c   *Client
	cfg ConsumerConfig
	h   Handler

	mu       sync.Mutex
	inflight map[string]*running // receipt → handler
	started  bool

	stopClaim  context.CancelFunc // ends the claim loop
	stopWork   context.CancelFunc // ends the handlers' contexts
	loopDone   chan struct{}
	handlers   sync.WaitGroup
	extendDone chan struct{}
	stopExtend chan struct{}
	slots      chan struct{}
	stopOnce   sync.Once
	stopErr    error
	stopped    chan struct{} // closed when Stop is done
}

type running struct {
	d      *Delivery
	cancel context.CancelFunc
}

// NewConsumer makes a consumer of cfg's subscription running h.
func (c *Client) NewConsumer(cfg ConsumerConfig, h Handler) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Consumer{c: c, cfg: cfg, h: h, inflight: map[string]*running{},
		loopDone: make(chan struct{}), extendDone: make(chan struct{}), stopExtend: make(chan struct{}), stopped: make(chan struct{}),
		slots: make(chan struct{}, cfg.Concurrency)}, nil
}

// Start runs the claim loop and the lease extender in the background
// until Stop (or ctx's end, which acts as Stop with no grace).
func (cn *Consumer) Start(ctx context.Context) error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.started {
		return errors.New("client: consumer already started")
	}
	cn.started = true
	claimCtx, stopClaim := context.WithCancel(ctx)
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	cn.stopClaim, cn.stopWork = stopClaim, stopWork
	go cn.extendLoop()
	go cn.claimLoop(claimCtx, workCtx)
	go func() {
		select {
		case <-ctx.Done():
			stopWork()
		case <-cn.stopped:
		}
	}()
	return nil
}

// Stop ends the claim loop at once (a claim waiting in the router is
// abandoned; the router releases what it was leasing for it), then waits
// for running handlers to finish — still extending their leases — until
// ctx ends. When ctx ends first, the handlers' contexts are cancelled and
// each delivery whose handler then returns an error is released: nacked
// with retry_after_ms 0 (code ReleaseErrorCode), so it is claimable again
// at once; the claim counted as an attempt. A handler that ignores its
// context keeps its delivery until it returns; its lease is no longer
// extended and lapses, after which the message is delivered again. Stop
// returns ctx's error in that case. Safe to call twice.
func (cn *Consumer) Stop(ctx context.Context) error {
	cn.stopOnce.Do(func() {
		cn.mu.Lock()
		started := cn.started
		cn.mu.Unlock()
		if !started {
			return
		}
		cn.stopClaim()
		<-cn.loopDone
		done := make(chan struct{})
		go func() { cn.handlers.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			cn.stopWork()
			cn.stopErr = fmt.Errorf("stopping consumer of %s/%s: handlers still running: %w", cn.cfg.Topic, cn.cfg.Subscription, ctx.Err())
		}
		close(cn.stopExtend)
		<-cn.extendDone
		cn.stopWork()
		close(cn.stopped)
	})
	return cn.stopErr
}

func (cn *Consumer) claimLoop(ctx, workCtx context.Context) {
	defer close(cn.loopDone)
	failures := 0
	for ctx.Err() == nil {
		// Wait for one free slot, then take every free one.
		select {
		case cn.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		free := 1
	take:
		for free < cn.cfg.MaxClaim {
			select {
			case cn.slots <- struct{}{}:
				free++
			default:
				break take
			}
		}
		ds, err := cn.c.Claim(ctx, ClaimRequest{Topic: cn.cfg.Topic, Subscription: cn.cfg.Subscription, Max: free,
			Visibility: cn.cfg.Visibility, Wait: cn.cfg.Wait, Consumer: cn.cfg.Name})
		for range free - len(ds) {
			<-cn.slots
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			d := min(time.Duration(failures)*100*time.Millisecond, 5*time.Second)
			d = max(d, retryAfterOf(err))
			cn.c.log.Warn("shardmq consumer: claim failed", "topic", cn.cfg.Topic, "subscription", cn.cfg.Subscription, "err", err, "retry_in", d)
			if ctxwait.Sleep(ctx, d) != nil {
				return
			}
			continue
		}
		failures = 0
		for _, d := range ds {
			hctx, cancel := context.WithCancel(workCtx)
			r := &running{d: d, cancel: cancel}
			cn.mu.Lock()
			cn.inflight[d.Receipt] = r
			cn.mu.Unlock()
			cn.handlers.Go(func() {
				defer func() { <-cn.slots }()
				cn.run(hctx, r)
			})
		}
	}
}

// run runs the handler for one delivery and settles it.
func (cn *Consumer) run(ctx context.Context, r *running) {
	defer r.cancel()
	err := cn.safeHandle(ctx, r.d)
	cn.mu.Lock()
	delete(cn.inflight, r.d.Receipt)
	cn.mu.Unlock()
	// Settling uses a context of its own: a stopping consumer still acks
	// what its handlers finished.
	if r.d.Settled() {
		return // the handler acked, nacked or abandoned it itself
	}
	sctx, cancel := context.WithTimeout(context.Background(), cn.c.cfg.Timeout)
	defer cancel()
	if err == nil {
		if _, err := cn.c.AckOne(sctx, r.d.Receipt); err != nil && !errors.Is(err, ErrReceiptNotFound) {
			cn.c.log.Warn("shardmq consumer: ack failed; the message will be delivered again", "key", r.d.Key, "err", err)
		}
		return
	}
	item := NackItem{Receipt: r.d.Receipt, ErrorCode: DefaultErrorCode, Error: err.Error()}
	var he *HandlerError
	if errors.As(err, &he) {
		item.ErrorCode = he.Code
		if he.RetryAfter != nil {
			ms := he.RetryAfter.Milliseconds()
			item.RetryAfterMS = &ms
		}
	}
	if ctx.Err() != nil && item.RetryAfterMS == nil {
		zero := int64(0)
		item.ErrorCode, item.RetryAfterMS = ReleaseErrorCode, &zero
	}
	res, nerr := cn.c.Nack(sctx, item)
	if nerr == nil {
		nerr = res[0].Err()
	}
	if nerr != nil {
		cn.c.log.Warn("shardmq consumer: nack failed; the lease will lapse", "key", r.d.Key, "err", nerr)
	}
}

func (cn *Consumer) safeHandle(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &HandlerError{Code: "E_PANIC", Err: fmt.Errorf("handler panicked: %v", v)}
		}
	}()
	return cn.h(ctx, d)
}

// extendLoop extends the leases of running handlers every ExtendEvery,
// in one request, and cancels a handler whose lease was lost.
func (cn *Consumer) extendLoop() {
	defer close(cn.extendDone)
	t := time.NewTicker(cn.cfg.ExtendEvery)
	defer t.Stop()
	for {
		select {
		case <-cn.stopExtend:
			return
		case <-t.C:
		}
		cn.mu.Lock()
		receipts := make([]string, 0, len(cn.inflight))
		for rc := range cn.inflight {
			receipts = append(receipts, rc)
		}
		cn.mu.Unlock()
		for len(receipts) > 0 {
			chunk := receipts[:min(len(receipts), 1000)]
			receipts = receipts[len(chunk):]
			// An extension is useful until the lease ends (one that arrives
			// later still holds if nobody claimed the delivery meanwhile).
			ctx, cancel := context.WithTimeout(context.Background(), min(cn.c.cfg.Timeout, cn.cfg.Visibility))
			res, err := cn.c.Extend(ctx, cn.cfg.Visibility, chunk...)
			cancel()
			if err != nil {
				cn.c.log.Warn("shardmq consumer: extending leases failed", "n", len(chunk), "err", err)
				continue
			}
			for i, r := range res {
				if r.Status == StatusLeaseLost || r.Status == StatusNotFound {
					cn.mu.Lock()
					if run, ok := cn.inflight[chunk[i]]; ok {
						run.cancel()
					}
					cn.mu.Unlock()
				}
			}
		}
	}
}

// AckOne acks one receipt and answers its result as an error: nil for ok,
// ErrLeaseLost, ErrReceiptNotFound, or the request's error.
func (c *Client) AckOne(ctx context.Context, receipt string) (LeaseResult, error) {
	res, err := c.Ack(ctx, receipt)
	if err != nil {
		return LeaseResult{Receipt: receipt}, err
	}
	return res[0], res[0].Err()
}
