// Package broker carries out message operations over all clusters: it
// resolves each item's vshard to a cluster through the shard map, runs one
// store call per cluster concurrently, and merges per-item results back in
// request order. It knows nothing of HTTP.
package broker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/store"
)

// Cluster is what the broker needs of one cluster: the operations it
// routes there, with their batching and the primary's breaker behind
// them. In the router it is a *cluster.Cluster; in tests, one over an
// in-memory store (cluster/clustertest).
type Cluster interface {
	// Produce group-commits items.
	Produce(ctx context.Context, items []store.ProduceItem) cluster.Produced
	// Claim leases deliveries in a coalesced claim of k.
	Claim(ctx context.Context, k cluster.ClaimKey, req store.ClaimRequest) ([]store.Claimed, error)
	PeekClaimable(ctx context.Context, topic, sub string, now time.Time, max int, dead bool, errorCode string, exclude []uint16) ([]store.ClaimHead, error)
	AnyClaimable(ctx context.Context, topic, sub string, now time.Time, exclude []uint16) (bool, error)
	// Ack acks durable leases in a coalesced ack.
	Ack(ctx context.Context, leases []store.Lease, now time.Time) ([]store.LeaseStatus, error)
	Nack(ctx context.Context, items []store.NackItem, policy func(topic, sub string) store.RetryPolicy, rnd func() float64, now time.Time) ([]store.NackResult, error)
	Extend(ctx context.Context, leases []store.Lease, lease time.Duration, now time.Time) ([]store.LeaseStatus, time.Time, error)
	Release(ctx context.Context, leases []store.Lease, countAttempt bool, now time.Time) (int64, error)
	LeaseHolders(ctx context.Context, topic, sub string, now time.Time, limit int) ([]store.LeaseHolder, error)

	// Dead letters and subscription upkeep.
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
	AppendEvents(ctx context.Context, evs []store.Event) error

	// Owners is the call point the owners of delivery state use.
	Owners() delivery.Cluster
	CommitStats() cluster.CommitStats
	ClaimStats() (transactions int64, keys int)
	// StopClaims refuses new claims and waits for the running ones.
	StopClaims()
	// Stop commits the queued produce requests and refuses new ones.
	Stop()
}

var _ Cluster = (*cluster.Cluster)(nil)

// Errors callers match with errors.Is.
var (
	// ErrUnavailable: the cluster (or every cluster) that would serve the
	// request is down or frozen beyond the wait; try again later. It is
	// domain's, the one value every layer wraps, so a store outage and a
	// broker refusal match the same errors.Is.
	ErrUnavailable = domain.ErrUnavailable
	// ErrUnknownSubscription: no such subscription on the topic.
	ErrUnknownSubscription = errors.New("unknown subscription")
)

// ReplicaWaiter is what replicated durability needs: a wait until at least
// one replica of a cluster has applied a GTID position.
type ReplicaWaiter interface {
	WaitReplicated(ctx context.Context, cluster, gtid string, timeout time.Duration) error
}

// Config tunes the broker. Zero fields take the defaults named.
type Config struct {
	// ReplicatedTimeout bounds the wait for a replica under replicated
	// durability; past it the items are answered unavailable (they are
	// committed on the primary; a replicated retry answers duplicate once
	// a replica has applied them, unavailable again until then). Defaults
	// to 5s.
	ReplicatedTimeout time.Duration
	// RecentKeys is the size of the recent-keys cache that answers known
	// duplicates and conflicts without a round trip. It never decides that
	// a key is new. Defaults to 100,000 entries (about 20 MB); -1 disables.
	RecentKeys int
	// RecentKeysTTL bounds how long a key stays in that cache: at least
	// half of it (unless half the size of newer keys came after it), never
	// longer. Defaults to 1h.
	RecentKeysTTL time.Duration
	// FrozenWait bounds how long a request for a frozen vshard (resharding
	// cut-over) is held before it is answered unavailable. Defaults to 2s.
	FrozenWait time.Duration
	// FrozenMaxHeld caps the requests held on frozen vshards at once;
	// more are answered unavailable at once. Defaults to 10,000.
	FrozenMaxHeld int
	// PollMin and PollMax bound the long-poll claim's re-poll interval,
	// which doubles while claims come back empty. Default 20ms and 500ms.
	PollMin, PollMax time.Duration
	// Owners tunes the owners of delivery state (see delivery.Config).
	Owners delivery.Config
	// BodyCacheBytes bounds the messages this router keeps after
	// producing them, so that its owners hand them out without reading
	// them back (delivery.Bodies). Defaults to 64 MiB; -1 disables.
	BodyCacheBytes int
	// Peer forwards operations on units another router owns; nil: this
	// router serves alone (Owners.Addr empty).
	Peer Peer
	// Receipts signs the receipts this router hands out and checks those
	// it is given; every router of a fleet needs the same key. Defaults
	// to a random key of this router's own (it then serves alone).
	Receipts *Receipts
}

func (c Config) withDefaults() Config {
	if c.ReplicatedTimeout <= 0 {
		c.ReplicatedTimeout = 5 * time.Second
	}
	if c.Receipts == nil {
		c.Receipts = RandomReceipts()
	}
	if c.RecentKeys == 0 {
		c.RecentKeys = 100000
	}
	if c.RecentKeysTTL <= 0 {
		c.RecentKeysTTL = time.Hour
	}
	if c.FrozenWait <= 0 {
		c.FrozenWait = 2 * time.Second
	}
	if c.FrozenMaxHeld <= 0 {
		c.FrozenMaxHeld = 10000
	}
	if c.BodyCacheBytes == 0 {
		c.BodyCacheBytes = 64 << 20
	}
	if c.PollMin <= 0 {
		c.PollMin = 20 * time.Millisecond
	}
	if c.PollMax <= 0 {
		c.PollMax = 500 * time.Millisecond
	}
	return c
}

// Broker is safe for concurrent use.
type Broker struct {
	cfg      Config
	table    *routing.Table
	clusters atomic.Pointer[map[string]*clusterConn]
	subs     Subscriptions
	replicas ReplicaWaiter
	ids      *idgen.Gen
	now      func() time.Time
	log      *slog.Logger
	wake     *notifier
	rr       atomic.Uint64
	recent   *recentKeys
	setMu    sync.Mutex
	// claimsStopped refuses claims once Close began.
	claimsStopped atomic.Bool
	polls         *pollGate // shared long-poll re-polls (longpoll.go)
	rejected      *rejectedTrace
	closed        bool // set by Close under setMu: SetClusters does nothing after it
	// draining is closed by Drain: long-polls answer at once.
	draining  chan struct{}
	drainOnce sync.Once
	pins      *pins // operations in flight by map version (frozen.go)
	// selfFenced refuses writes and claims (SetSelfFenced).
	selfFenced atomic.Bool
	frozen     frozenCounters // requests held on frozen vshards (frozen.go)
	owners     *delivery.Manager
	peer       Peer
}

// clusterConn is a cluster as the broker holds it.
type clusterConn struct {
	conn Cluster
}

// recentKey is what the recent-keys cache remembers of a registered key.
type recentKey struct {
	id     uint64
	vshard uint16 // the holder's: where its trace lives
	hash   [16]byte
}

// New returns a broker routing by table to clusters (cluster name → its primary).
// replicas may be nil: replicated durability then answers unavailable.
func New(cfg Config, table *routing.Table, clusters map[string]Cluster, subs Subscriptions, replicas ReplicaWaiter, ids *idgen.Gen, now func() time.Time, log *slog.Logger) *Broker {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Broker{cfg: cfg.withDefaults(), table: table, subs: subs, replicas: replicas, ids: ids, now: now, log: log, wake: newNotifier(),
		draining: make(chan struct{}), pins: newPins(), polls: newPollGate(), peer: cfg.Peer}
	ocfg := b.cfg.Owners
	ocfg.MapVersion = func() int64 { return table.Load().Version() }
	ocfg.Bodies = delivery.NewBodies(b.cfg.BodyCacheBytes)
	b.owners = delivery.New(ocfg, now, log)
	if b.cfg.RecentKeys > 0 {
		b.recent = newRecentKeys(b.cfg.RecentKeys, b.cfg.RecentKeysTTL, now)
		b.rejected = newRejectedTrace(b)
	}
	empty := map[string]*clusterConn{}
	b.clusters.Store(&empty)
	b.SetClusters(clusters)
	b.owners.Start(context.Background())
	return b
}

// DecodeReceipt reads a receipt this router or another of its fleet made,
// and refuses one whose signature does not hold (Receipts).
func (b *Broker) DecodeReceipt(s string) (Receipt, error) { return b.cfg.Receipts.Decode(s) }

// SetClusters swaps the clusters (after a topology change). A cluster
// that is unchanged stays as it is; replaced ones finish the produce
// requests they have queued and stop (Cluster.Stop).
func (b *Broker) SetClusters(clusters map[string]Cluster) {
	b.setMu.Lock()
	defer b.setMu.Unlock()
	if b.closed {
		return // a topology applied during shutdown hands over no cluster that nobody stops
	}
	old := *b.clusters.Load()
	m := make(map[string]*clusterConn, len(clusters))
	for name, s := range clusters {
		if cs, ok := old[name]; ok && cs.conn == s {
			m[name] = cs
			continue
		}
		m[name] = &clusterConn{conn: s}
	}
	b.clusters.Store(&m)
	for name, cs := range old {
		if m[name] != cs {
			go cs.conn.Stop()
		}
	}
	oc := make(map[string]delivery.Cluster, len(clusters))
	for name, s := range clusters {
		oc[name] = s.Owners()
	}
	b.owners.SetClusters(oc)
}

// Drain answers every waiting long-poll claim now (with what it has,
// usually nothing) and makes later claims poll once without waiting, so
// that a server shutting down is not held by idle consumers. Safe to call
// twice.
func (b *Broker) Drain() {
	b.drainOnce.Do(func() { close(b.draining) })
}

// CommitStats returns each cluster's group-commit counters.
func (b *Broker) CommitStats() map[string]cluster.CommitStats {
	out := map[string]cluster.CommitStats{}
	for name, cs := range *b.clusters.Load() {
		out[name] = cs.conn.CommitStats()
	}
	return out
}

// ClaimTransactions is how many claim transactions (one per cluster,
// coalesced) the broker ran on the clusters in use: what waiting claims
// cost the databases.
func (b *Broker) ClaimTransactions() int64 {
	var n int64
	for _, cs := range *b.clusters.Load() {
		runs, _ := cs.conn.ClaimStats()
		n += runs
	}
	return n
}

// Waiting reports what long-polls and claims hold right now: the topics
// with a waiting claim and the claim workers. Both fall back to zero once
// no claim is in flight, however many topic names were claimed.
func (b *Broker) Waiting() (topics, workers int) {
	for _, cs := range *b.clusters.Load() {
		_, keys := cs.conn.ClaimStats()
		workers += keys
	}
	return b.wake.size(), workers
}

// Close shuts the broker down without dropping anything silently: it
// drains long-polls, waits for running claims to be answered and refuses
// new ones (unavailable), then stops the group committers after they
// commit what is queued (a produce submitted later is answered
// unavailable, so its caller retries with the same key). Safe to call
// twice.
func (b *Broker) Close() {
	b.Drain()
	b.claimsStopped.Store(true)
	for _, cs := range *b.clusters.Load() {
		cs.conn.StopClaims()
	}
	// Owners hand their units over: leases in memory go to the table, so
	// the next owner (this router restarted, or another) starts at once.
	b.owners.Stop()
	if b.rejected != nil {
		b.rejected.Stop()
	}
	b.setMu.Lock()
	defer b.setMu.Unlock()
	b.closed = true
	for _, cs := range *b.clusters.Load() {
		cs.conn.Stop()
	}
}
