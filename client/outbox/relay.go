package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/internal/backoff"
	"github.com/shardmq/shardmq/internal/ctxwait"
)

// Message is what Enqueue stores and the relay sends.
type Message = client.Message

// Publisher is what a Relay needs of the client: *client.Producer.
type Publisher interface {
	SendMany(ctx context.Context, topic string, msgs []client.Message) []client.SendResult
}

var _ Publisher = (*client.Producer)(nil)

// ErrCrash, returned by a FaultHooks function, makes the relay abandon the
// rows of that step as a crashed process would: no further statement runs
// for them, and their lease expires.
var ErrCrash = errors.New("outbox: injected crash")

// FaultHooks lets tests stop a relay at the points where a crash matters.
// Production code leaves them nil.
type FaultHooks struct {
	// BeforePublish runs after the claim's commit, before the publish.
	BeforePublish func() error
	// BeforeMark runs after the router answered, before the rows are
	// marked published.
	BeforeMark func() error
}

// RelayConfig tunes a Relay. Zero values take the defaults.
type RelayConfig struct {
	// Name is the relay's locked_by. Defaults to host-pid-random.
	Name string
	// Batch caps rows per claim. Defaults to 100.
	Batch int
	// Lease is how long a claim holds its rows; a relay that dies holding
	// them leaves them to others after it. It must be longer than a
	// publish takes (the producer's retries included), or rows get
	// published twice — harmless, deduplicated by key. Defaults to 30s.
	Lease time.Duration
	// Idle is the pause after a claim found nothing due. Defaults to 100ms.
	Idle time.Duration
	// MaxAttempts: a row whose publish failed that many times becomes
	// dead. Defaults to 10.
	MaxAttempts int
	// InitialBackoff, MaxBackoff: failed attempt n is retried after
	// InitialBackoff·2^(n-1) capped at MaxBackoff, ±20 % jitter. Default
	// 1s and 5min.
	InitialBackoff, MaxBackoff time.Duration
	Logger                     *slog.Logger
	Faults                     FaultHooks
}

func (c RelayConfig) withDefaults() RelayConfig {
	if c.Name == "" {
		host, _ := os.Hostname()
		var b [3]byte
		rand.Read(b[:])
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if len(c.Name) > 128 {
		c.Name = c.Name[:128]
	}
	if c.Batch <= 0 {
		c.Batch = 100
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Idle <= 0 {
		c.Idle = 100 * time.Millisecond
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 10
	}
	if c.InitialBackoff <= 0 {
		c.InitialBackoff = time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Relay publishes the outbox's rows. Start runs it in the background;
// RunOnce is one claim → publish → mark cycle, for callers that schedule
// it themselves.
type Relay struct {
	db  *sql.DB
	pub Publisher
	cfg RelayConfig

	mu       sync.Mutex
	stopping chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// NewRelay makes a relay over the service's database and a publisher
// (a *client.Producer; its MaxAttempts retries happen within one attempt
// of the relay, so keep them shorter than Lease).
func NewRelay(db *sql.DB, pub Publisher, cfg RelayConfig) *Relay {
	return &Relay{db: db, pub: pub, cfg: cfg.withDefaults()}
}

// row is one claimed outbox row.
type row struct {
	id       uint64
	topic    string
	key      string
	msg      Message
	attempts int
}

// RunOnce claims up to Batch due rows, publishes them and marks each
// one by its answer. It answers how many rows it claimed.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	token, rows, err := r.claim(ctx)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	if f := r.cfg.Faults.BeforePublish; f != nil {
		if err := f(); err != nil {
			return len(rows), err
		}
	}
	byTopic := map[string][]*row{}
	var topics []string
	for _, rw := range rows {
		if _, ok := byTopic[rw.topic]; !ok {
			topics = append(topics, rw.topic)
		}
		byTopic[rw.topic] = append(byTopic[rw.topic], rw)
	}
	var answers []answer
	for _, topic := range topics {
		batch := byTopic[topic]
		msgs := make([]client.Message, len(batch))
		for i, rw := range batch {
			msgs[i] = rw.msg
		}
		// The publish runs under the lease: past it, another relay may
		// publish the same rows (harmless) and our marks would be refused.
		pctx, cancel := context.WithTimeout(ctx, r.cfg.Lease)
		out := r.pub.SendMany(pctx, topic, msgs)
		cancel()
		for i, rw := range batch {
			answers = append(answers, answer{rw, out[i]})
		}
	}
	if f := r.cfg.Faults.BeforeMark; f != nil {
		if err := f(); err != nil {
			return len(rows), err
		}
	}
	if err := r.markAll(ctx, token, answers); err != nil {
		return len(rows), err
	}
	return len(rows), nil
}

// claim leases a batch, again when the lease transaction met a deadlock
// or a lock wait timeout with another relay (both roll the whole
// transaction back, and two relays' claims can cross on the same rows):
// up to five tries, a few milliseconds apart.
func (r *Relay) claim(ctx context.Context) (uint64, []*row, error) {
	for try := 1; ; try++ {
		token, rows, err := r.claimOnce(ctx)
		var me *mysql.MySQLError
		if try >= 5 || !errors.As(err, &me) || (me.Number != 1213 && me.Number != 1205) {
			return token, rows, err
		}
		if ctxwait.Sleep(ctx, time.Duration(try)*5*time.Millisecond) != nil {
			return 0, nil, err
		}
	}
}

func (r *Relay) claimOnce(ctx context.Context) (uint64, []*row, error) {
	var tb [8]byte
	if _, err := rand.Read(tb[:]); err != nil {
		return 0, nil, err
	}
	token := binary.BigEndian.Uint64(tb[:]) | 1 // never 0
	tx, err := beginReadCommitted(ctx, r.db)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox claim: %w", err)
	}
	defer tx.Rollback()
	q, err := tx.QueryContext(ctx, sqlClaimSelect, r.cfg.Batch)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox claim: %w", err)
	}
	var ids []any
	for q.Next() {
		var id uint64
		if err := q.Scan(&id); err != nil {
			q.Close()
			return 0, nil, fmt.Errorf("outbox claim: %w", err)
		}
		ids = append(ids, id)
	}
	q.Close()
	if err := q.Err(); err != nil {
		return 0, nil, fmt.Errorf("outbox claim: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil, nil
	}
	args := append([]any{r.cfg.Name, token, r.cfg.Lease.Microseconds()}, ids...)
	stmt := sqlClaimUpdate + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")"
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return 0, nil, fmt.Errorf("outbox claim: leasing %d rows: %w", len(ids), err)
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("outbox claim: commit: %w", err)
	}
	q, err = r.db.QueryContext(ctx, sqlClaimed, token)
	if err != nil {
		return 0, nil, fmt.Errorf("outbox claim: reading the leased rows: %w", err)
	}
	defer q.Close()
	var rows []*row
	for q.Next() {
		rw := &row{}
		var data []byte
		if err := q.Scan(&rw.id, &rw.topic, &rw.key, &data, &rw.attempts); err != nil {
			return 0, nil, fmt.Errorf("outbox claim: %w", err)
		}
		if err := json.Unmarshal(data, &rw.msg); err != nil {
			return 0, nil, fmt.Errorf("outbox row %d: decoding its message: %w", rw.id, err)
		}
		rw.msg.Key = rw.key // the row's identity is the key, whatever the JSON says
		rows = append(rows, rw)
	}
	return token, rows, q.Err()
}

// answer is the router's answer for one claimed row.
type answer struct {
	rw  *row
	res client.SendResult
}

// markAll records every row's answer, under its lease, in one
// transaction (read committed, as every relay statement: see
// beginReadCommitted). A failure leaves the rows leased; they are
// published again after the lease, which the router deduplicates.
func (r *Relay) markAll(ctx context.Context, token uint64, answers []answer) error {
	tx, err := beginReadCommitted(ctx, r.db)
	if err != nil {
		return fmt.Errorf("outbox: marking %d rows: %w", len(answers), err)
	}
	defer tx.Rollback()
	for _, a := range answers {
		if err := r.mark(ctx, tx, token, a.rw, a.res); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("outbox: marking %d rows: commit: %w", len(answers), err)
	}
	return nil
}

// mark records one row's answer, under its lease.
func (r *Relay) mark(ctx context.Context, tx *sql.Tx, token uint64, rw *row, res client.SendResult) error {
	var err error
	var what string
	switch {
	case res.Err == nil:
		what = "published"
		_, err = tx.ExecContext(ctx, sqlPublished, res.ID, rw.id, token)
	case errors.Is(res.Err, client.ErrConflict):
		what = "dead (conflict)"
		_, err = tx.ExecContext(ctx, sqlDead, truncate(res.Err.Error(), 2048), rw.id, token)
	default:
		what = "failed"
		wait := r.backoff(rw.attempts + 1)
		_, err = tx.ExecContext(ctx, sqlFailed, r.cfg.MaxAttempts, truncate(res.Err.Error(), 2048), wait.Microseconds(), rw.id, token)
		r.cfg.Logger.Warn("outbox: publish failed", "key", rw.key, "topic", rw.topic, "attempt", rw.attempts+1, "retry_in", wait, "err", res.Err)
	}
	if err != nil {
		return fmt.Errorf("outbox: marking row %d %s: %w", rw.id, what, err)
	}
	return nil
}

func (r *Relay) backoff(attempt int) time.Duration {
	return backoff.Policy{Initial: r.cfg.InitialBackoff, Max: r.cfg.MaxBackoff, Jitter: 0.2}.Wait(attempt)
}

// UnlockExpired clears the leases of relays that died holding them,
// answering how many rows it released.
func (r *Relay) UnlockExpired(ctx context.Context) (int64, error) {
	n, err := execReadCommitted(ctx, r.db, sqlUnlockExpired)
	if err != nil {
		return 0, fmt.Errorf("outbox: unlocking expired leases: %w", err)
	}
	return n, nil
}

// Start runs the relay in the background until Stop or ctx's end: cycles
// back to back while rows are due, a pause of Idle when none is, expired
// leases unlocked every Lease. The end of ctx stops it at once, as a
// killed process stops: rows of a cycle in progress stay leased until
// their lease expires; Stop lets that cycle finish.
func (r *Relay) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done != nil {
		return
	}
	r.stopping = make(chan struct{})
	r.done = make(chan struct{})
	go r.loop(ctx)
}

func (r *Relay) loop(ctx context.Context) {
	defer close(r.done)
	lastUnlock := time.Now()
	failures := 0
	for ctx.Err() == nil {
		select {
		case <-r.stopping:
			return
		default:
		}
		n, err := r.RunOnce(ctx)
		if time.Since(lastUnlock) > r.cfg.Lease {
			if _, uerr := r.UnlockExpired(ctx); uerr != nil && ctx.Err() == nil {
				r.cfg.Logger.Warn("outbox relay", "err", uerr)
			}
			lastUnlock = time.Now()
		}
		pause := time.Duration(0)
		switch {
		case errors.Is(err, ErrCrash):
			pause = r.cfg.Idle
		case err != nil && ctx.Err() == nil:
			failures++
			pause = min(time.Duration(failures)*r.cfg.Idle, 5*time.Second)
			r.cfg.Logger.Warn("outbox relay", "err", err, "retry_in", pause)
		case n == 0:
			failures = 0
			pause = r.cfg.Idle
		default:
			failures = 0
		}
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
			case <-r.stopping:
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// Stop ends the background loop after the cycle in progress (its rows
// are published and marked) and waits for it. Safe to call twice, and
// without Start.
func (r *Relay) Stop() {
	r.mu.Lock()
	stopping, done := r.stopping, r.done
	r.mu.Unlock()
	if done == nil {
		return
	}
	r.stopOnce.Do(func() { close(stopping) })
	<-done
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n]
}
