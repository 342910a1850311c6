// Package cluster is the router's view of one cluster: the call point to
// its primary (the endpoint's breaker, the hand-over to a successor on
// failover, the per-cluster latency observation) and the group commits
// that share its transactions among concurrent requests (produce, claims,
// acks). The broker routes requests to clusters; what happens on a
// cluster, and how its requests are batched, happens here.
package cluster

import (
	"context"
	"time"

	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/store"
)

// Store is what the router runs on one cluster's primary: the store
// operations, always through the cluster's call point (Primary.Do).
type Store interface {
	Produce(ctx context.Context, items []store.ProduceItem) ([]store.ProduceResult, error)
	ClaimMany(ctx context.Context, reqs []store.ClaimRequest) ([][]store.Claimed, error)
	// PeekClaimable reads, without locks, the claim order of what a claim
	// would take now (claims that span clusters merge these).
	PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]store.ClaimHead, error)
	Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error)
	// AckMany acks several requests' leases together (the acker's
	// coalesced transaction), a result per group.
	AckMany(ctx context.Context, groups []store.AckGroup, now time.Time) []store.AckResult
	Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error)
	Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error)
	// Release gives back leases a claim took but could not hand over.
	Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error)

	// Dead letters and subscription upkeep: rarer, per cluster.
	ListDead(ctx context.Context, topic, sub, errorCode string, before uint64, limit, maxBytes int, now time.Time) ([]store.DeadLetter, map[uint64]*store.Message, bool, error)
	Redrive(ctx context.Context, req store.RedriveRequest) (int64, error)
	PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error)
	DeleteDead(ctx context.Context, topic, sub string, ids []uint64) (int64, error)
	CountDead(ctx context.Context, topic, sub string) (int64, error)
	DeadByCode(ctx context.Context, req store.RedriveRequest) (map[string]int64, error)
	ArchiveDead(ctx context.Context, topic, sub string, cutoff, now time.Time) (int64, error)
	DropSubscription(ctx context.Context, topic, sub string, now time.Time) (int64, error)
	Unpark(ctx context.Context, topic, sub string, now time.Time) (int64, error)
	Stats(ctx context.Context, now time.Time) ([]store.QueueStats, error)
	// AppendEvents writes trace events on their own, exactly once per
	// event id (the recent-keys cache's duplicate and conflict answers).
	AppendEvents(ctx context.Context, evs []store.Event) error

	// What the owners of units need (delivery.Store).
	delivery.Store
}

var _ Store = (*store.Store)(nil)

// The operations a call point is told about (metrics), one per Store
// method.
const (
	OpProduce          = "produce"
	OpClaim            = "claim"
	OpPeekClaim        = "peek_claim"
	OpAck              = "ack"
	OpNack             = "nack"
	OpExtend           = "extend"
	OpRelease          = "release"
	OpListDead         = "list_dead"
	OpRedrive          = "redrive"
	OpPurgeDead        = "purge_dead"
	OpDeleteDead       = "delete_dead"
	OpLeaseHolders     = "lease_holders"
	OpCountDead        = "count_dead"
	OpDeadByCode       = "dead_by_code"
	OpArchiveDead      = "archive_dead"
	OpDropSubscription = "drop_subscription"
	OpUnpark           = "unpark"
	OpStats            = "stats"
	OpAppendEvents     = "append_events"
)
