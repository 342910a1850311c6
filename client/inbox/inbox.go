// Package inbox is the idempotent inbox of a service that consumes from
// shardmq (seed 001, DESIGN §9): a table in the consumer's own database
// remembers which messages it processed, so that a redelivery — after a
// crash between the business commit and the ack, a lost lease, or a
// publisher's duplicate with the same key — is acked without running the
// business change again.
//
// Handle claims the message in the inbox (status processing, a claim
// token and a lock expiry, attempts counted), runs the business change and
// marks the message processed in one transaction of the service's
// database — the mark checks the claim token in SQL, so a consumer whose
// lock expired and was taken over cannot commit — and then acks.
// Messages are the same when their topic, subscription and key are: give
// every business fact its own key (the outbox does).
package inbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/shardmq/shardmq/client"
)

// Migrate creates the inbox table in the consumer's database (idempotent).
func Migrate(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, sqlCreate); err != nil {
		return fmt.Errorf("creating %s: %w", Table, err)
	}
	return nil
}

// ErrCrash, returned by a FaultHooks function, makes Handle stop as a
// crashed consumer would: the delivery is abandoned (neither acked nor
// nacked; its lease lapses) and the inbox lock is left to expire.
var ErrCrash = errors.New("inbox: injected crash")

// ErrBusy is answered when another consumer holds the message's inbox
// lock (a redelivery raced the first delivery's handler). The delivery is
// nacked to come back once that lock expires.
var ErrBusy = errors.New("inbox: message being processed by another consumer")

// ErrLockLost is answered when the inbox lock expired and another
// consumer took the message over before this one committed: the business
// change was rolled back.
var ErrLockLost = errors.New("inbox: lock lost before commit; rolled back")

// FaultHooks lets tests stop Handle where a crash matters. Production code
// leaves them nil.
type FaultHooks struct {
	// AfterClaim runs after the inbox claim, before the business
	// transaction.
	AfterClaim func() error
	// AfterCommit runs after the business commit, before the ack.
	AfterCommit func() error
}

// Config tunes an Inbox.
type Config struct {
	// Name is the consumer's locked_by. Defaults to host-pid-random.
	Name string
	// Lock is how long a claim holds the message in the inbox; a consumer
	// that dies holding it leaves the message to the redelivery after it.
	// Keep it no longer than the subscription's lease. Defaults to 30s.
	Lock   time.Duration
	Logger *slog.Logger
	Faults FaultHooks
}

// Inbox runs handlers idempotently over one database.
type Inbox struct {
	db  *sql.DB
	cfg Config
}

// New makes an inbox over the consumer's database.
func New(db *sql.DB, cfg Config) *Inbox {
	if cfg.Name == "" {
		host, _ := os.Hostname()
		var b [3]byte
		rand.Read(b[:])
		cfg.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if len(cfg.Name) > 128 {
		cfg.Name = cfg.Name[:128]
	}
	if cfg.Lock <= 0 {
		cfg.Lock = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Inbox{db: db, cfg: cfg}
}

// Outcome says what Handle did.
type Outcome int

const (
	// Processed: the business change committed with the inbox mark.
	Processed Outcome = iota + 1
	// Duplicate: the message was processed before; acked, handler not run.
	Duplicate
	// Failed: the handler (or the commit) failed; nacked.
	Failed
	// Busy: another consumer holds it; nacked for after its lock.
	Busy
	// Crashed: a fault hook stopped Handle (tests only).
	Crashed
)

// Handle processes d once per (subscription, key): it claims the message
// in the inbox, runs fn in a transaction of the inbox's database and
// commits it together with the mark processed, then acks d. A message
// processed before is acked without running fn. When fn fails, the
// transaction is rolled back, the error is recorded (last_error), the lock
// freed and d nacked with the error's code (a *client.HandlerError's, else
// client.DefaultErrorCode); the error is returned.
//
// d is settled (acked or nacked) when Handle returns, so a client.Consumer
// whose handler calls Handle does not settle it again. An ack that fails
// after the commit is logged, not returned: the redelivery is a Duplicate.
func (in *Inbox) Handle(ctx context.Context, d *client.Delivery, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	sub := d.Topic + "/" + d.Subscription
	token, wait, claimed, processed, err := in.claim(ctx, sub, d)
	if err != nil {
		return in.fail(ctx, d, sub, 0, err, Failed)
	}
	// Acks run even when ctx ended meanwhile (a stopping consumer): what
	// is committed should be acked.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if processed {
		if err := d.Ack(actx); err != nil {
			in.cfg.Logger.Warn("inbox: ack of a duplicate failed; it will come again", "key", d.Key, "err", err)
		}
		return Duplicate, nil
	}
	if !claimed {
		retry := max(wait, 100*time.Millisecond)
		if _, err := d.Nack(ctx, "E_INBOX_BUSY", ErrBusy.Error(), &retry); err != nil {
			in.cfg.Logger.Warn("inbox: nack failed", "key", d.Key, "err", err)
		}
		return Busy, ErrBusy
	}
	if f := in.cfg.Faults.AfterClaim; f != nil {
		if err := f(); err != nil {
			d.Abandon()
			return Crashed, err
		}
	}
	if err := in.run(ctx, sub, d, token, fn); err != nil {
		return in.fail(ctx, d, sub, token, err, Failed)
	}
	if f := in.cfg.Faults.AfterCommit; f != nil {
		if err := f(); err != nil {
			d.Abandon()
			return Crashed, err
		}
	}
	if err := d.Ack(actx); err != nil {
		in.cfg.Logger.Warn("inbox: ack after commit failed; the redelivery will be acked as a duplicate", "key", d.Key, "err", err)
	}
	return Processed, nil
}

// Handler adapts fn to a client.Consumer: each delivery goes through
// Handle.
func (in *Inbox) Handler(fn func(ctx context.Context, d *client.Delivery, tx *sql.Tx) error) client.Handler {
	return func(ctx context.Context, d *client.Delivery) error {
		_, err := in.Handle(ctx, d, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, d, tx) })
		if errors.Is(err, ErrCrash) {
			return nil // abandoned: settled, nothing to do
		}
		return err
	}
}

func (in *Inbox) claim(ctx context.Context, sub string, d *client.Delivery) (token uint64, wait time.Duration, claimed, processed bool, err error) {
	var tb [8]byte
	if _, err := rand.Read(tb[:]); err != nil {
		return 0, 0, false, false, err
	}
	token = binary.BigEndian.Uint64(tb[:]) | 1
	lock := in.cfg.Lock.Microseconds()
	res, err := in.db.ExecContext(ctx, sqlClaimNew, sub, d.Key, d.ID, in.cfg.Name, token, lock)
	if err != nil {
		return 0, 0, false, false, fmt.Errorf("inbox claim of %q: %w", d.Key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return token, 0, true, false, nil
	}
	res, err = in.db.ExecContext(ctx, sqlClaimAgain, in.cfg.Name, token, lock, d.ID, sub, d.Key)
	if err != nil {
		return 0, 0, false, false, fmt.Errorf("inbox claim of %q: %w", d.Key, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return token, 0, true, false, nil
	}
	var status string
	var us int64
	if err := in.db.QueryRowContext(ctx, sqlState, sub, d.Key).Scan(&status, &us); err != nil {
		return 0, 0, false, false, fmt.Errorf("inbox state of %q: %w", d.Key, err)
	}
	return 0, time.Duration(us) * time.Microsecond, false, status == "processed", nil
}

func (in *Inbox) run(ctx context.Context, sub string, d *client.Delivery, token uint64, fn func(context.Context, *sql.Tx) error) error {
	tx, err := in.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, sqlProcessed, sub, d.Key, token)
	if err != nil {
		return fmt.Errorf("inbox: marking %q processed: %w", d.Key, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return ErrLockLost
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("inbox: commit of %q: %w", d.Key, err)
	}
	return nil
}

// fail records err, frees the inbox lock (token 0: none held) and nacks d.
func (in *Inbox) fail(ctx context.Context, d *client.Delivery, sub string, token uint64, err error, o Outcome) (Outcome, error) {
	if token != 0 {
		msg := err.Error()
		if len(msg) > 2048 {
			msg = msg[:2048]
		}
		if _, uerr := in.db.ExecContext(context.WithoutCancel(ctx), sqlFailed, msg, sub, d.Key, token); uerr != nil {
			in.cfg.Logger.Warn("inbox: recording a failure", "key", d.Key, "err", uerr)
		}
	}
	code := client.DefaultErrorCode
	var retry *time.Duration
	var he *client.HandlerError
	if errors.As(err, &he) {
		code, retry = he.Code, he.RetryAfter
	}
	if _, nerr := d.Nack(context.WithoutCancel(ctx), code, err.Error(), retry); nerr != nil {
		in.cfg.Logger.Warn("inbox: nack failed; the lease will lapse", "key", d.Key, "err", nerr)
	}
	return o, err
}

// Purge deletes up to limit processed rows processed more than age ago,
// answering how many. Keep rows longer than any redelivery can come (the
// subscription's retries, and the router's dedup window for re-publishes).
func Purge(ctx context.Context, db *sql.DB, age time.Duration, limit int) (int64, error) {
	res, err := db.ExecContext(ctx, sqlPurge, age.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("purging %s: %w", Table, err)
	}
	return res.RowsAffected()
}
