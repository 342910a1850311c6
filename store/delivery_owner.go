package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// delivery_owner is each cluster's record of who holds the delivery state
// of each of its subscriptions (docs/consume.md, "Owners"): one row per
// (topic, subscription) naming the owning router instance, the address
// its router answers forwarded calls on, and an epoch that grows with
// every change of owner. The owner's lease on the unit and its horizon —
// no lease the owner of this epoch handed out lasts past it — are in
// delivery_lease, renewed every second. Times are the server's (NOW(6)),
// so routers with different clocks agree on who holds what.
//
// The epoch is the fence: every write an owner makes from its in-memory
// state (acks, nacks, expiries, parking) runs in a transaction that first
// reads its units' delivery_owner rows with a shared lock and checks the
// epoch, so a router that lost a unit can no longer write for it, and a
// takeover (an exclusive lock on the row) waits for the flushes under way.
// The lease lives in a table of its own so that the renewals, which
// rewrite it every second, never wait for those flushes (nor they for a
// renewal).
const createDeliveryOwner = `CREATE TABLE IF NOT EXISTS delivery_owner (
  topic VARBINARY(128) NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  owner VARBINARY(64) NOT NULL,
  addr VARBINARY(255) NOT NULL,
  epoch BIGINT UNSIGNED NOT NULL,
  lease_until DATETIME(6) NOT NULL,
  horizon DATETIME(6) NOT NULL,
  updated_at DATETIME(6) NOT NULL,
  PRIMARY KEY (topic, subscription),
  KEY idx_owner (owner)
) ENGINE=InnoDB`

// createDeliveryLease and the column drop move the owner's lease out of
// delivery_owner (migration 15).
const (
	createDeliveryLease = `CREATE TABLE IF NOT EXISTS delivery_lease (
  topic VARBINARY(128) NOT NULL,
  subscription VARBINARY(128) NOT NULL,
  owner VARBINARY(64) NOT NULL,
  lease_until DATETIME(6) NOT NULL,
  horizon DATETIME(6) NOT NULL,
  PRIMARY KEY (topic, subscription),
  KEY idx_owner (owner)
) ENGINE=InnoDB`
	copyOwnerLeases = `INSERT IGNORE INTO delivery_lease (topic, subscription, owner, lease_until, horizon)
SELECT topic, subscription, owner, lease_until, horizon FROM delivery_owner`
	dropOwnerLeaseColumns = `ALTER TABLE delivery_owner DROP COLUMN lease_until, DROP COLUMN horizon`
)

// router_member is each cluster's list of live routers: each writes its
// row every beat with the server's time. The owners of a cluster's units
// are spread over the routers seen here lately.
const createRouterMember = `CREATE TABLE IF NOT EXISTS router_member (
  router VARBINARY(64) NOT NULL,
  addr VARBINARY(255) NOT NULL,
  seen_at DATETIME(6) NOT NULL,
  PRIMARY KEY (router)
) ENGINE=InnoDB`

// addMemberSchemaVersion records which migrations each member knows
// (migration 21); a router of an older version does not write it, and its
// row reads 0.
const addMemberSchemaVersion = `ALTER TABLE router_member ADD COLUMN schema_version INT NOT NULL DEFAULT 0`

// OwnerRecord is one row of delivery_owner as a reader sees it.
type OwnerRecord struct {
	Topic, Subscription string
	Owner, Addr         string
	Epoch               uint64
	LeaseUntil, Horizon time.Time // the server's clock
	// Live: the lease has not run out by the server's clock.
	Live bool
}

// OwnerGrant is what a router that took a unit holds.
type OwnerGrant struct {
	Epoch uint64
	// WaitUntil is the previous owner's horizon (the server's clock): a
	// lease it handed out may last until then, so the new owner hands
	// nothing out before (its in-flight deliveries look ready in the
	// table). Never later than the previous horizon; the grant's time
	// when the unit had no owner.
	WaitUntil time.Time
	// ServerNow is the server's clock when the grant was made, to tell
	// its times in the router's clock.
	ServerNow  time.Time
	LeaseUntil time.Time
}

// ErrOwned: another router holds a live lease on the unit.
var ErrOwned = errors.New("held by another router")

// micros is d in whole microseconds, the unit of the INTERVALs below.
func micros(d time.Duration) int64 { return d.Microseconds() }

// AcquireOwner makes owner (at addr) the owner of topic/sub on this
// cluster with a new epoch and a lease of ttl, if the unit has no owner,
// its owner's lease ran out, or owner holds it already (a new epoch: what
// it held before is forgotten). Otherwise ErrOwned, with the record.
func (s *Store) AcquireOwner(ctx context.Context, topic, sub, owner, addr string, ttl time.Duration) (OwnerGrant, OwnerRecord, error) {
	var g OwnerGrant
	var rec OwnerRecord
	err := s.inTx(ctx, txAttempts, s.retryHook("acquire_owner"), func(tx *sql.Tx) error {
		var cur OwnerRecord
		var now time.Time
		err := tx.QueryRowContext(ctx, `SELECT o.owner, o.addr, o.epoch, l.lease_until, l.horizon, l.lease_until > NOW(6), NOW(6)
FROM delivery_owner o JOIN delivery_lease l ON l.topic = o.topic AND l.subscription = o.subscription
WHERE o.topic = ? AND o.subscription = ? FOR UPDATE`, topic, sub).
			Scan(&cur.Owner, &cur.Addr, &cur.Epoch, &cur.LeaseUntil, &cur.Horizon, &cur.Live, &now)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if err := tx.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&now); err != nil {
				return fmt.Errorf("read server time: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO delivery_owner (topic, subscription, owner, addr, epoch, updated_at)
VALUES (?, ?, ?, ?, 1, ?)`, topic, sub, owner, addr, now); err != nil {
				return fmt.Errorf("insert delivery_owner: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO delivery_lease (topic, subscription, owner, lease_until, horizon)
VALUES (?, ?, ?, ? + INTERVAL ? MICROSECOND, ?)`, topic, sub, owner, now, micros(ttl), now); err != nil {
				return fmt.Errorf("insert delivery_lease: %w", err)
			}
			g = OwnerGrant{Epoch: 1, WaitUntil: now, ServerNow: now, LeaseUntil: now.Add(ttl)}
			return nil
		case err != nil:
			return fmt.Errorf("lock delivery_owner: %w", err)
		}
		cur.Topic, cur.Subscription = topic, sub
		// A live record naming this caller's own address belongs to an
		// earlier process at that address, which cannot still serve it:
		// the address is the caller's now. It is taken like a lapsed one
		// (its horizon still holds back redelivery).
		if cur.Live && cur.Owner != owner && (addr == "" || cur.Addr != addr) {
			rec = cur
			return ErrOwned
		}
		if _, err := tx.ExecContext(ctx, `UPDATE delivery_owner SET owner = ?, addr = ?, epoch = epoch + 1, updated_at = ?
WHERE topic = ? AND subscription = ?`, owner, addr, now, topic, sub); err != nil {
			return fmt.Errorf("take delivery_owner: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE delivery_lease SET owner = ?, lease_until = ? + INTERVAL ? MICROSECOND
WHERE topic = ? AND subscription = ?`, owner, now, micros(ttl), topic, sub); err != nil {
			return fmt.Errorf("take delivery_lease: %w", err)
		}
		wait := cur.Horizon
		if wait.Before(now) {
			wait = now
		}
		g = OwnerGrant{Epoch: cur.Epoch + 1, WaitUntil: wait, ServerNow: now, LeaseUntil: now.Add(ttl)}
		return nil
	})
	if errors.Is(err, ErrOwned) {
		return OwnerGrant{}, rec, ErrOwned
	}
	if err != nil {
		return OwnerGrant{}, OwnerRecord{}, fmt.Errorf("acquire owner of %s/%s: %w", topic, sub, err)
	}
	return g, OwnerRecord{}, nil
}

// OwnedUnit is a unit its owner still holds after a renewal.
type OwnedUnit struct {
	Topic, Subscription string
	Epoch               uint64
}

// RenewOwners extends the lease of every unit owner holds on this cluster
// to ttl from now and its horizon to at least horizon from now, in one
// statement on delivery_lease (which no flush locks), and answers the
// units it still holds, with their epochs (one taken over meanwhile is
// not among them), and the server's time.
func (s *Store) RenewOwners(ctx context.Context, owner string, ttl, horizon time.Duration) ([]OwnedUnit, time.Time, error) {
	var out []OwnedUnit
	var now time.Time
	err := s.inTx(ctx, txAttempts, s.retryHook("renew_owner"), func(tx *sql.Tx) error {
		out = out[:0]
		if err := tx.QueryRowContext(ctx, "SELECT NOW(6)").Scan(&now); err != nil {
			return fmt.Errorf("read server time: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE delivery_lease SET lease_until = ? + INTERVAL ? MICROSECOND,
  horizon = GREATEST(horizon, ? + INTERVAL ? MICROSECOND)
WHERE owner = ?`, now, micros(ttl), now, micros(horizon), owner); err != nil {
			return fmt.Errorf("renew delivery_lease: %w", err)
		}
		var err error
		out, err = queryRows(ctx, tx, "read renewed delivery_owner", `SELECT o.topic, o.subscription, o.epoch
FROM delivery_owner o JOIN delivery_lease l ON l.topic = o.topic AND l.subscription = o.subscription
WHERE o.owner = ? AND l.owner = ?`,
			[]any{owner, owner}, func(rows *sql.Rows) (OwnedUnit, error) {
				var u OwnedUnit
				err := rows.Scan(&u.Topic, &u.Subscription, &u.Epoch)
				return u, err
			})
		return err
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("renew owners: %w", err)
	}
	return out, now, nil
}

// ReleaseOwner gives up owner's unit of epoch: its lease ends now and no
// longer names owner (so that the owner's next renewal, which renews every
// lease naming it, cannot bring it back to life), and so
// does its horizon when every lease it handed out is in the table
// (durable: they fence themselves), so the next owner starts at once.
// With leasesInTable false the horizon stays (a crash-like release).
func (s *Store) ReleaseOwner(ctx context.Context, topic, sub, owner string, epoch uint64, leasesInTable bool) error {
	q := `UPDATE delivery_lease l JOIN delivery_owner o ON o.topic = l.topic AND o.subscription = l.subscription
SET l.lease_until = NOW(6), l.owner = ''`
	if leasesInTable {
		q += `, l.horizon = NOW(6)`
	}
	q += ` WHERE l.topic = ? AND l.subscription = ? AND l.owner = ? AND o.owner = ? AND o.epoch = ?`
	if _, err := s.db.ExecContext(ctx, q, topic, sub, owner, owner, epoch); err != nil {
		return fmt.Errorf("release owner of %s/%s: %w", topic, sub, translate(err))
	}
	return nil
}

// Owners reads every unit's record on this cluster.
func (s *Store) Owners(ctx context.Context) ([]OwnerRecord, error) {
	out, err := queryRows(ctx, s.db, "read delivery_owner", `SELECT o.topic, o.subscription, o.owner, o.addr, o.epoch, l.lease_until, l.horizon,
  l.lease_until > NOW(6)
FROM delivery_owner o JOIN delivery_lease l ON l.topic = o.topic AND l.subscription = o.subscription`, nil,
		func(rows *sql.Rows) (OwnerRecord, error) {
			var r OwnerRecord
			err := rows.Scan(&r.Topic, &r.Subscription, &r.Owner, &r.Addr, &r.Epoch, &r.LeaseUntil, &r.Horizon, &r.Live)
			return r, err
		})
	return out, translate(err)
}

// ownerFence locks the delivery_owner rows of units with a shared lock
// and returns those whose epoch is not the one given (taken over, or
// gone): their writes must not happen. A takeover waits for the
// transaction that holds the lock.
func ownerFence(ctx context.Context, tx *sql.Tx, units []OwnedUnit) (map[OwnedUnit]bool, error) {
	if len(units) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 2*len(units))
	for _, u := range units {
		args = append(args, u.Topic, u.Subscription)
	}
	cur, err := queryMap(ctx, tx, "fence delivery_owner", "SELECT topic, subscription, epoch FROM delivery_owner WHERE "+
		pairsIn("topic", "subscription", len(units))+" LOCK IN SHARE MODE", args, func(rows *sql.Rows) ([2]string, uint64, error) {
		var k [2]string
		var e uint64
		err := rows.Scan(&k[0], &k[1], &e)
		return k, e, err
	})
	if err != nil {
		return nil, err
	}
	stale := map[OwnedUnit]bool{}
	for _, u := range units {
		if cur[[2]string{u.Topic, u.Subscription}] != u.Epoch {
			stale[u] = true
		}
	}
	return stale, nil
}

// ownerProbeSQL is ownerFence for a multi-statement that cannot look at
// the epochs before its writes (the fast ack flush, owned_fast.go): it
// reads and locks the same rows, by the same key, with the same shared
// locks, and fails — by fenceProbeSQL's overflow, error 1690, so that
// nothing after it runs — unless every one of units (distinct) has its row
// with its epoch. Its arguments are appended to args; it returns no
// result set.
func ownerProbeSQL(args []any, units []OwnedUnit) (string, []any) {
	args = append(args, len(units))
	for _, u := range units {
		args = append(args, u.Topic, u.Subscription)
	}
	for _, u := range units {
		args = append(args, u.Topic, u.Subscription, u.Epoch)
	}
	return "SELECT 9223372036854775807 + (COUNT(*) <> ?) INTO @shardmq_owners FROM delivery_owner WHERE " + pairsIn("topic", "subscription", len(units)) +
		" AND (topic, subscription, epoch) IN (" + placeholders(len(units), 3) + ") LOCK IN SHARE MODE", args
}

// Member is a router seen on a cluster.
type Member struct {
	Router, Addr string
	SeenAt       time.Time
	// SchemaVersion is the newest migration the router knows (its
	// SchemaVersion); 0 for a router of a version before it was recorded
	// (migration 21).
	SchemaVersion int
}

// Beat records router (answering at addr) as live now on this cluster and
// answers the routers seen within the last within, itself included, and
// the server's time.
func (s *Store) Beat(ctx context.Context, router, addr string, within time.Duration) ([]Member, time.Time, error) {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO router_member (router, addr, seen_at, schema_version) VALUES (?, ?, NOW(6), ?)
ON DUPLICATE KEY UPDATE addr = VALUES(addr), seen_at = VALUES(seen_at), schema_version = VALUES(schema_version)`, router, addr, SchemaVersion()); err != nil {
		return nil, time.Time{}, fmt.Errorf("beat router_member: %w", translate(err))
	}
	var now time.Time
	members, err := queryRows(ctx, s.db, "read router_member", `SELECT router, addr, seen_at, schema_version, NOW(6) FROM router_member
WHERE seen_at > NOW(6) - INTERVAL ? MICROSECOND ORDER BY router`, []any{micros(within)}, func(rows *sql.Rows) (Member, error) {
		var m Member
		err := rows.Scan(&m.Router, &m.Addr, &m.SeenAt, &m.SchemaVersion, &now)
		return m, err
	})
	if err != nil {
		return nil, time.Time{}, translate(err)
	}
	s.SetAckSlots(AckSlotsReadBy(members))
	s.dropOrderIndexSoon(members)
	return members, now, nil
}

// AckSlotsReadBy says whether every one of members reads the final ack's
// slot (a router of a version before AckSlotsSince does not).
func AckSlotsReadBy(members []Member) bool {
	for _, m := range members {
		if m.SchemaVersion < AckSlotsSince {
			return false
		}
	}
	return true
}

// LeaveMembers removes router's row (a router shutting down), and rows
// not seen for older (routers gone).
func (s *Store) LeaveMembers(ctx context.Context, router string, older time.Duration) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM router_member WHERE router = ? OR seen_at < NOW(6) - INTERVAL ? MICROSECOND", router, micros(older)); err != nil {
		return fmt.Errorf("leave router_member: %w", translate(err))
	}
	return nil
}
