package cluster

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/store"
)

// Caller is a call point to a cluster's primary: every Store call goes
// through Do, which carries what all of them share. In the router it is
// a Primary (the endpoint's breaker and the failover hand-over), observed
// by Observed; in tests, a fake. op names the operation (the Op
// constants) for metrics. fn must use the context it is given: the call
// point may bound or cancel it.
type Caller interface {
	Do(ctx context.Context, op string, fn func(ctx context.Context, s Store) error) error
}

var _ Caller = (*Primary)(nil)

// Config tunes a cluster's group commits. Zero fields take the defaults
// named.
type Config struct {
	// Commit tunes produce group commit (see CommitConfig).
	Commit CommitConfig
}

// Cluster is the router's view of one cluster: every operation the
// router runs there, on its primary's call point, with the requests that
// share a transaction batched — produce (group commit), claims of one
// subscription (coalesced claims) and acks of durable leases. It is safe
// for concurrent use.
type Cluster struct {
	name   string
	conn   Caller
	commit *committer
	ack    *acker
	claims *claimers
}

// New returns cluster name over the call point conn.
func New(name string, conn Caller, cfg Config) *Cluster {
	return &Cluster{name: name, conn: conn, commit: newCommitter(name, conn, cfg.Commit.WithDefaults()), ack: newAcker(conn),
		claims: newClaimers(conn)}
}

// Name is the cluster's name.
func (c *Cluster) Name() string { return c.name }

// Do runs fn on the primary through the call point (see Caller).
func (c *Cluster) Do(ctx context.Context, op string, fn func(ctx context.Context, s Store) error) error {
	return c.conn.Do(ctx, op, fn)
}

// Owners is the call point as the owners of delivery state use it.
func (c *Cluster) Owners() delivery.Cluster { return owners{c.conn} }

// owners adapts a call point to what owners need.
type owners struct{ c Caller }

func (o owners) Do(ctx context.Context, op string, fn func(ctx context.Context, s delivery.Store) error) error {
	return o.c.Do(ctx, op, func(ctx context.Context, s Store) error { return fn(ctx, s) })
}

// Produce commits items in a group commit shared with the other produce
// requests that reach the cluster meanwhile, and answers each item once
// its transaction committed. A caller whose ctx ends while waiting gets
// ctx's error (and Pending); its items may still commit (a retry with the
// same keys then answers duplicate).
func (c *Cluster) Produce(ctx context.Context, items []store.ProduceItem) Produced {
	return c.commit.submit(ctx, items)
}

// Claim leases deliveries for req in a claim transaction shared with the
// other claims of k that reach the cluster meanwhile. Once queued it runs
// to the end whatever becomes of ctx: the caller releases what it cannot
// deliver.
func (c *Cluster) Claim(ctx context.Context, k ClaimKey, req store.ClaimRequest) ([]store.Claimed, error) {
	return c.claims.claim(ctx, k, req)
}

// Ack acks durable leases in a transaction shared with the other acks
// that reach the cluster meanwhile, and waits for it whatever becomes of
// ctx (the ack may commit). ctx's fence and request id go with it.
func (c *Cluster) Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error) {
	return c.ack.ack(ctx, leases, now)
}

// StopClaims refuses new claims (ErrClaimsStopped) and waits for the
// queued and running ones to be answered. Safe to call twice.
func (c *Cluster) StopClaims() { c.claims.group.Stop() }

// Stop lets queued produce requests commit, then refuses new ones
// (ErrCommitterStopped). Claims and acks hold no goroutine while idle and
// are served as long as callers hold the cluster. Safe to call twice.
func (c *Cluster) Stop() { c.commit.Stop() }

// CommitStats returns the group committer's counters.
func (c *Cluster) CommitStats() CommitStats {
	runs, msgs := c.commit.batch.Stats()
	_, queued := c.commit.batch.Queued()
	return CommitStats{Transactions: runs, Messages: msgs, Splits: c.commit.splits.Load(), Busy: time.Duration(c.commit.busy.Load()),
		Queued: int64(queued)}
}

// ClaimStats reports the coalesced claim transactions run, and the claim
// keys with claims queued or running now (they fall back to zero once no
// claim is in flight, however many topic names were claimed).
func (c *Cluster) ClaimStats() (transactions int64, keys int) {
	return c.claims.group.Runs(), c.claims.group.Len()
}
