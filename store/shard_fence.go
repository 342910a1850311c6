package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The shard fence (docs/resharding.md, "Fencing"). Each cluster is the
// authority on which writers may still write to it: shard_fence holds one
// row, the oldest shard-map version a writer may route with. A resharding
// job raises it on the source cluster once the frozen map is out (every
// live router applied it), before the final copy, and records the owners
// of the map it raises to in vshard_owner in the same transaction. Every
// write transaction a router runs carries the version of the map it
// routed with (WithFence) and reads the row first, with a shared lock:
// a writer whose map is older is refused (FenceError, unavailable: retry)
// without writing anything, and the raise — an exclusive lock on the
// same row — waits for the writers already past the check to commit,
// so none of them can land after the final copy. The cost per write
// transaction is one primary-key read of a one-row table; the fast
// produce path folds it into its one round trip.
const createShardFence = `CREATE TABLE IF NOT EXISTS shard_fence (
  id TINYINT UNSIGNED NOT NULL,
  map_version BIGINT NOT NULL,
  raised_by VARBINARY(128) NOT NULL,
  raised_at DATETIME(6) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB`

// seedShardFence gives the table its one row, fencing nothing.
const seedShardFence = `INSERT IGNORE INTO shard_fence (id, map_version, raised_by, raised_at) VALUES (1, 0, '', UTC_TIMESTAMP(6))`

// Fence is what a write carries to be checked against its cluster's
// fence: the version of the shard map it was routed with.
type Fence struct {
	MapVersion int64
}

type fenceKey struct{}

// WithFence returns ctx carrying f: every write transaction run with it
// reads the cluster's fence first and is refused when f.MapVersion is
// older. A zero version carries no fence. Of two fences, the older map
// wins (a batch of writes routed with different maps is as old as its
// oldest).
func WithFence(ctx context.Context, f Fence) context.Context {
	if f.MapVersion <= 0 {
		return ctx
	}
	if old, ok := FenceFrom(ctx); ok && old.MapVersion <= f.MapVersion {
		return ctx
	}
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceFrom is the fence ctx carries, if any.
func FenceFrom(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}

// ErrFenced is matched by a FenceError. A FenceError also matches
// ErrUnavailable: the write may be retried once the writer holds a map at
// least as new as the fence.
var ErrFenced = errors.New("shard map older than the cluster's fence")

// FenceError is a write refused by its cluster's fence: nothing of it was
// written.
type FenceError struct {
	Have int64 // the map version the write was routed with
	Need int64 // the cluster's fence
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("%v: routed with shard map version %d, the cluster requires %d or newer; re-read the map and retry", ErrFenced, e.Have, e.Need)
}

// Is makes a FenceError match ErrFenced and ErrUnavailable.
func (e *FenceError) Is(target error) bool { return target == ErrFenced || target == ErrUnavailable }

// selectFenceShared is the writers' side of the fence, the first
// statement of every fenced transaction.
const selectFenceShared = `SELECT map_version FROM shard_fence WHERE id = 1 LOCK IN SHARE MODE`

// checkFence reads the fence in tx (shared lock, held to commit) when ctx
// carries one, and refuses an older map.
func checkFence(ctx context.Context, tx *sql.Tx) error {
	f, ok := FenceFrom(ctx)
	if !ok {
		return nil
	}
	var need int64
	err := tx.QueryRowContext(ctx, selectFenceShared).Scan(&need)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // never raised (the row comes with the migration)
	}
	if err != nil {
		return fmt.Errorf("read shard fence: %w", err)
	}
	if f.MapVersion < need {
		return &FenceError{Have: f.MapVersion, Need: need}
	}
	return nil
}

// fenceProbeSQL is checkFence for a multi-statement that has no round
// trip to spare (the fast produce path): the statement takes the same
// shared lock and fails when the fence is newer than the argument, by an
// arithmetic overflow the server raises only then (error 1690 on both
// MariaDB and MySQL; nothing else in that multi-statement computes), so
// that nothing after it runs. It returns no result set.
const fenceProbeSQL = `SELECT 1 INTO @shardmq_fence FROM shard_fence WHERE id = 1 AND 9223372036854775807 + (map_version > ?) > 0 LOCK IN SHARE MODE`

// errFenceProbe is the server's error for a failed fenceProbeSQL, and for
// the probes built like it (ownerProbeSQL).
const errFenceProbe = 1690

// probeFailed reports err as the failure of fenceProbeSQL or of a probe
// built like it.
func probeFailed(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errFenceProbe
}

// ShardFence reads the cluster's fence: the oldest map version a writer
// may route with (0: never raised, or a cluster that predates the table).
func (s *Store) ShardFence(ctx context.Context) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, "SELECT map_version FROM shard_fence WHERE id = 1").Scan(&v)
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == errNoSuchTable:
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read shard fence: %w", translate(err))
	}
	return v, nil
}

// raiseShardFence moves the fence up, never down.
const raiseShardFence = `INSERT INTO shard_fence (id, map_version, raised_by, raised_at) VALUES (1, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  raised_by = IF(VALUES(map_version) > map_version, VALUES(raised_by), raised_by),
  raised_at = IF(VALUES(map_version) > map_version, VALUES(raised_at), raised_at),
  map_version = GREATEST(map_version, VALUES(map_version))`

// RaiseFence raises the cluster's fence to version (never lowers it) and
// records owners (the map of that version) in vshard_owner, in one
// transaction. It waits for the fenced writes in flight to commit (their
// shared locks); from its commit on, a write routed with an older map is
// refused here. by names who raised it (a resharding job) for operators.
func (s *Store) RaiseFence(ctx context.Context, version int64, owners []VShardOwner, by string, at time.Time) error {
	err := s.inTx(ctx, txAttempts, s.retryHook("raise_fence"), func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, raiseShardFence, version, by, at.UTC()); err != nil {
			return fmt.Errorf("raise shard fence to %d: %w", version, err)
		}
		if len(owners) == 0 {
			return nil
		}
		args := make([]any, 0, 5*len(owners))
		for _, o := range owners {
			args = append(args, o.VShard, o.Cluster, o.MapVersion, o.Frozen, at.UTC())
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(recordVShardOwners, placeholders(len(owners), 5)), args...); err != nil {
			return fmt.Errorf("record vshard owners of version %d: %w", version, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("raise shard fence: %w", err)
	}
	return nil
}

// OwnerCheck is what a resharding job's cleanup carries on its deletes:
// the source's own record (vshard_owner) must give every one of VShards
// to Cluster at MinVersion or later, read with a shared lock in the
// delete's transaction. A demoted job runner that stalled past its check
// therefore cannot delete rows of vshards that a later map gave back
// (recording that map takes the rows' exclusive locks).
type OwnerCheck struct {
	Cluster    string
	MinVersion int64
	VShards    []uint16
}

type ownerCheckKey struct{}

// WithOwnerCheck returns ctx carrying c for the write transactions run
// with it.
func WithOwnerCheck(ctx context.Context, c OwnerCheck) context.Context {
	return context.WithValue(ctx, ownerCheckKey{}, c)
}

// OwnerCheckFrom returns the OwnerCheck ctx carries, if any (for a fake
// Mover to honour it as the store does).
func OwnerCheckFrom(ctx context.Context) (OwnerCheck, bool) {
	c, ok := ctx.Value(ownerCheckKey{}).(OwnerCheck)
	return c, ok
}

// ErrNotOwnerRecord: a write carrying an OwnerCheck found the cluster's
// record giving a vshard elsewhere (or at an older version); nothing was
// written.
var ErrNotOwnerRecord = errors.New("the cluster's owner record does not allow it")

// checkOwnerRecord runs ctx's OwnerCheck in tx, if any.
func checkOwnerRecord(ctx context.Context, tx *sql.Tx) error {
	c, ok := OwnerCheckFrom(ctx)
	if !ok || len(c.VShards) == 0 {
		return nil
	}
	args := make([]any, 0, len(c.VShards))
	for _, v := range c.VShards {
		args = append(args, v)
	}
	rows, err := tx.QueryContext(ctx, "SELECT vshard, cluster, map_version FROM vshard_owner WHERE vshard IN ("+inList(len(c.VShards))+") LOCK IN SHARE MODE", args...)
	if err != nil {
		return fmt.Errorf("read vshard owners: %w", err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var v int
		var cluster string
		var version int64
		if err := rows.Scan(&v, &cluster, &version); err != nil {
			return fmt.Errorf("read vshard owners: %w", err)
		}
		if cluster != c.Cluster || version < c.MinVersion {
			return fmt.Errorf("%w: vshard %d is recorded as %s's at map %d, not %s's at %d or later", ErrNotOwnerRecord, v, cluster, version, c.Cluster, c.MinVersion)
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read vshard owners: %w", err)
	}
	if seen < len(c.VShards) {
		return fmt.Errorf("%w: %d of %d vshards have no record", ErrNotOwnerRecord, len(c.VShards)-seen, len(c.VShards))
	}
	return nil
}
