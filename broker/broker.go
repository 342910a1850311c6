// Package broker carries out message operations over all clusters: it
// resolves each item's vshard to a cluster through the shard map, runs one
// store call per cluster concurrently, and merges per-item results back in
// request order. It knows nothing of HTTP.
package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/shardmq/shardmq/cluster"
	"github.com/shardmq/shardmq/delivery"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/reqid"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/subscription"
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
	// RecentKeysTTL is how long a key stays in that cache. Defaults to 1h.
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
	recent   *expirable.LRU[string, recentKey]
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
		b.recent = expirable.NewLRU[string, recentKey](b.cfg.RecentKeys, nil, b.cfg.RecentKeysTTL)
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

// SetClusters swaps the cluster connections (after a topology change). A
// cluster whose connection is unchanged keeps its committer; the committers
// of replaced connections finish what they have queued and stop.
func (b *Broker) SetClusters(clusters map[string]Cluster) {
	b.setMu.Lock()
	defer b.setMu.Unlock()
	if b.closed {
		return // a topology applied during shutdown starts no committer that nobody stops
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

// Message is one message to produce, validated by the caller.
type Message struct {
	Key           string // empty: a fingerprint key is derived
	OrderKey      string
	TransactionID string
	Priority      int
	Headers       []byte // JSON object or nil
	Payload       []byte
	PayloadJSON   bool
	Delay         time.Duration // or DeliverAt
	DeliverAt     time.Time
}

// ProduceResult is one item's outcome.
type ProduceResult struct {
	Key    string
	ID     uint64
	VShard shard.ID
	Status domain.ProduceStatus
	Err    error // why unavailable or rejected
}

// PayloadHash is what tells a duplicate (same key, same payload) from a
// conflict (same key, other payload): the first 16 bytes of SHA-256.
func PayloadHash(payload []byte) []byte {
	h := sha256.Sum256(payload)
	return h[:16]
}

// FingerprintKey is the key of a message produced without one: derived
// from its topic, transaction id and payload hash, so that a producer
// resending the same message gets it deduplicated.
func FingerprintKey(topic, transactionID string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write([]byte(transactionID))
	h.Write([]byte{0})
	h.Write(PayloadHash(payload))
	return "fp-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Durability says when a produce is answered.
type Durability int

const (
	// DurabilityPrimary answers after the commit on the primary.
	DurabilityPrimary Durability = iota
	// DurabilityReplicated also waits until one replica has applied it.
	DurabilityReplicated
)

// Produce stores msgs on topic. Items are group-committed per cluster (one
// transaction holds this request's items of that cluster together with
// other requests'), clusters run concurrently, and each item is answered
// only after its transaction committed — and, with replicated durability,
// after a replica applied it. A cluster that fails makes only its own items
// unavailable.
func (b *Broker) Produce(ctx context.Context, topic string, msgs []Message, dur Durability) ([]ProduceResult, error) {
	subs, err := b.subs.ForProduce(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list subscriptions of %s: %w", topic, err)
	}
	now := b.now().UTC()
	results := make([]ProduceResult, len(msgs))
	items := make([]store.ProduceItem, len(msgs))
	vs := make([]shard.ID, len(msgs))
	skip := make([]bool, len(msgs))
	// A key repeated in one request with another order_key goes where its
	// first occurrence goes, so that the database there answers it
	// duplicate or conflict instead of another cluster storing it again.
	// (Only keys given with an order_key can land elsewhere.)
	var placed map[string]shard.ID
	for i, m := range msgs {
		key := m.Key
		if key == "" {
			key = FingerprintKey(topic, m.TransactionID, m.Payload)
		}
		v := shard.Of(shard.Key(m.OrderKey, key))
		if m.OrderKey != "" || placed != nil {
			if placed == nil {
				placed = make(map[string]shard.ID, len(msgs))
				for j := range i { // the earlier items, all without order_key
					if _, ok := placed[results[j].Key]; !ok {
						placed[results[j].Key] = vs[j]
					}
				}
			}
			if first, ok := placed[key]; ok {
				v = first
			} else {
				placed[key] = v
			}
		}
		results[i] = ProduceResult{Key: key, VShard: v}
		vs[i] = v
		hash := PayloadHash(m.Payload)
		if dur == DurabilityPrimary && b.recent != nil {
			if rk, ok := b.recent.Get(topic + "\x00" + key); ok {
				results[i].ID = rk.id
				results[i].VShard = shard.ID(rk.vshard) // where the holder lives (and its trace)
				status := store.Conflict
				if string(rk.hash[:]) == string(hash) {
					status = store.Duplicate
				}
				results[i].Status = status
				b.rejected.add(b.ids.Next(), status, rk, hash)
				skip[i] = true
				continue
			}
		}
		id := b.ids.Next()
		avail := now
		switch {
		case !m.DeliverAt.IsZero():
			avail = m.DeliverAt.UTC()
		case m.Delay > 0:
			avail = now.Add(m.Delay)
		}
		items[i] = store.ProduceItem{
			Msg: &store.Message{ID: id, VShard: uint16(v), Topic: topic, Key: key, OrderKey: m.OrderKey,
				TransactionID: m.TransactionID, Priority: m.Priority, Headers: m.Headers, PayloadJSON: m.PayloadJSON,
				Payload: m.Payload, CreatedAt: idgen.Time(id)},
			Hash:          hash,
			AvailableAt:   avail,
			Subscriptions: subs,
			WantGTID:      dur == DurabilityReplicated,
		}
	}
	// Replicated durability waits for a replica after dispatch, so that
	// the wait holds no pin of the shard map (it writes nothing).
	type replicaWait struct {
		name string
		idx  []int
		gtid string
	}
	var mu sync.Mutex
	var waits []replicaWait
	errs := b.dispatch(ctx, vs, skip, func(ctx context.Context, name string, cs *clusterConn, idx []int, keep func() func()) {
		gtid := b.produceOn(ctx, cs, topic, idx, items, results, keep)
		if dur == DurabilityReplicated {
			mu.Lock()
			waits = append(waits, replicaWait{name, idx, gtid})
			mu.Unlock()
		}
	})
	for i, err := range errs {
		if err != nil {
			results[i].Status, results[i].Err = domain.ProduceUnavailable, err
		}
	}
	var wg sync.WaitGroup
	for _, w := range waits {
		wg.Go(func() { b.confirmReplicated(ctx, w.name, w.gtid, w.idx, results) })
	}
	wg.Wait()
	b.wake.signal(topic)
	return results, nil
}

// produceOn commits one cluster's share of a request, fills its results
// and returns the GTID to wait for under replicated durability.
func (b *Broker) produceOn(ctx context.Context, cs *clusterConn, topic string, idx []int, items []store.ProduceItem, results []ProduceResult, keep func() func()) string {
	fence, _ := store.FenceFrom(ctx) // dispatch's: the map idx was routed with
	batch := make([]store.ProduceItem, len(idx))
	for j, i := range idx {
		batch[j] = items[i]
		batch[j].MapVersion = fence.MapVersion
	}
	resp := cs.conn.Produce(ctx, batch)
	if resp.Pending != nil {
		// Given up while queued: the batch may still commit on this
		// cluster, so the map it was routed with stays pinned until it
		// did (the resharding barrier must not pass before).
		release := keep()
		go func() {
			<-resp.Pending
			release()
		}()
	}
	var gtid string
	var created []*store.Message
	defer func() { b.owners.Remember(created) }()
	for j, i := range idx {
		if err := resp.Errs[j]; err != nil {
			results[i].Status, results[i].Err = domain.ProduceUnavailable, err
			switch {
			case errors.Is(err, store.ErrInvalidData):
				results[i].Status = domain.ProduceRejected // deterministic: a retry cannot succeed
			case resp.Pending != nil || errors.Is(err, store.ErrOutcomeUnknown):
				// Queued or committing when the wait ended: it may be
				// stored (or be stored yet). A retry with the key tells.
				results[i].Status = domain.ProduceUnknown
			}
			continue
		}
		r := resp.Results[j]
		results[i].ID = r.ID
		results[i].Status = r.Status
		if r.Status == store.Created {
			created = append(created, items[i].Msg)
		}
		if r.Status == store.Duplicate || r.Status == store.Conflict {
			results[i].VShard = shard.ID(r.VShard) // the holder's, with its id
		}
		if r.GTID != "" {
			gtid = r.GTID
		}
		if b.recent != nil {
			var h [16]byte
			if r.Status == store.Conflict {
				continue // the holder's hash is not ours; let the database answer again
			}
			copy(h[:], items[i].Hash)
			v := items[i].Msg.VShard
			if r.Status == store.Duplicate {
				v = r.VShard
			}
			b.recent.Add(topic+"\x00"+results[i].Key, recentKey{id: r.ID, vshard: v, hash: h})
		}
	}
	return gtid
}

// confirmReplicated waits until a replica of cluster name has applied
// gtid; the items idx that were stored become unknown when none does:
// they are on the primary, not confirmed at the durability asked for (a
// retry with the same key tells, and never stores them twice).
func (b *Broker) confirmReplicated(ctx context.Context, name, gtid string, idx []int, results []ProduceResult) {
	err := errors.New("no replica can confirm it")
	if b.replicas != nil && gtid != "" {
		err = b.replicas.WaitReplicated(ctx, name, gtid, b.cfg.ReplicatedTimeout)
	}
	if err == nil {
		return
	}
	for _, i := range idx {
		if results[i].Status == domain.ProduceCreated || results[i].Status == domain.ProduceDuplicate {
			results[i].Err = &NotReplicatedError{Cluster: name, Err: err}
			results[i].Status = domain.ProduceUnknown
		}
	}
}

// NotReplicatedError is an item's error under replicated durability when
// the message is committed on the primary but no replica confirmed it in
// time. Its Public text carries no address or driver detail, so the API
// may answer it as it is: it tells the client what a retry will answer.
type NotReplicatedError struct {
	Cluster string
	Err     error
}

func (e *NotReplicatedError) Error() string {
	return notReplicatedText(e.Cluster) + ": " + e.Err.Error()
}

func (e *NotReplicatedError) Unwrap() error { return e.Err }

// Public is the text a client may see.
func (e *NotReplicatedError) Public() string { return notReplicatedText(e.Cluster) }

// notReplicatedText is what an item answered unknown under replicated
// durability says about its state and about a retry. A duplicate answer
// under replicated durability claims, like created, that a replica has
// the message, so a retry waits for a replica again: it answers duplicate
// once one has applied the message, and unknown until then. It never
// stores the message twice.
func notReplicatedText(cluster string) string {
	return "committed on the primary of cluster " + cluster + " but no replica confirmed it in time; " +
		"a retry with the same key and order_key never stores it twice: it answers duplicate once a replica has applied it, " +
		"unknown until then"
}

// ClaimRequest asks for up to Max deliveries of topic/sub.
type ClaimRequest struct {
	Topic, Subscription, Consumer string
	Max                           int
	// MaxBytes caps the message bytes (payload, headers and keys) of one
	// answer; 0: no cap. The first message is always delivered, even when
	// it alone exceeds the cap, so that a big message cannot get stuck.
	MaxBytes int
	Lease    time.Duration
	Wait     time.Duration
	// Dead claims from the dead-letter channel (only ErrorCode's when set).
	Dead      bool
	ErrorCode string
}

// Delivery is a leased message.
type Delivery struct {
	store.Claimed
	Receipt string
}

// Claim leases up to Max deliveries from all clusters, starting at a
// rotating cluster so that none starves. When none is ready it long-polls
// up to Wait: it wakes at once when this router produces to the topic and
// otherwise re-polls with a backoff from PollMin to PollMax. If every
// cluster failed it returns ErrUnavailable rather than an empty answer.
//
// A claim on the implicit default subscription of a topic that has no
// stored subscription (nothing was ever produced to it, or only through
// another router within the last subscription refresh) reads the
// databases once; while it waits it re-polls them only once this router
// produces to the topic or the topic's default subscription appears in
// the registry. Claims on made-up topic names thus cost no database
// round trips while they wait, and still see a topic produced later.
//
// If ctx ends while deliveries are being leased, they are released at
// once (ready again, the attempt not counted) instead of waiting for
// their lease to expire.
func (b *Broker) Claim(ctx context.Context, req ClaimRequest) ([]Delivery, error) {
	sub, ok, err := b.subs.Get(ctx, req.Topic, req.Subscription)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrUnknownSubscription
	}
	implicit := sub.Implicit()
	deadline := time.Now().Add(req.Wait)
	poll := b.cfg.PollMin
	pk := pollKey{topic: req.Topic, sub: req.Subscription, dead: req.Dead, errorCode: req.ErrorCode}
	// A claim that may wait skips its first poll when another found the
	// subscription empty within PollMin (longpoll.go).
	// Implicit subscriptions (made-up topic names) are not remembered:
	// they never re-poll on a timer, and their names must leave nothing.
	readDB := req.Wait <= 0 || implicit || !b.polls.fresh(pk, time.Now(), b.cfg.PollMin)
	for {
		woken, release := b.wake.wait(req.Topic)
		var out []Delivery
		if readDB {
			if req.Dead {
				out, err = b.claimOnce(ctx, req, sub)
			} else {
				out, err = b.claimOwned(ctx, req, sub)
			}
			if err == nil && !implicit {
				b.polls.polled(pk, time.Now(), len(out) > 0, b.cfg.PollMax)
			}
		}
		if len(out) > 0 && ctx.Err() != nil {
			release()
			b.release(req, out)
			return nil, ctx.Err()
		}
		left := time.Until(deadline)
		if len(out) > 0 || err != nil || left <= 0 {
			release()
			if err != nil {
				return nil, err
			}
			if out == nil {
				out = []Delivery{}
			}
			return out, nil
		}
		timer := time.NewTimer(min(poll, left))
		select {
		case <-ctx.Done():
			timer.Stop()
			release()
			return []Delivery{}, nil
		case <-b.draining:
			timer.Stop()
			release()
			return []Delivery{}, nil
		case <-woken:
			timer.Stop()
			poll = b.cfg.PollMin
			readDB = true
		case <-timer.C:
			// Another waiting claim's poll within this interval stands
			// for this one's.
			readDB = !implicit && !b.polls.fresh(pk, time.Now(), poll)
			poll = min(2*poll, b.cfg.PollMax)
		}
		release()
		if implicit {
			// A produce stores the topic's default subscription first:
			// once it is there, deliveries may be too.
			if s, ok, err := b.subs.Get(ctx, req.Topic, req.Subscription); err == nil && ok && !s.Implicit() {
				sub, implicit, readDB = s, false, true
			}
		}
	}
}

// release gives back deliveries a claim leased but cannot hand over.
func (b *Broker) release(req ClaimRequest, out []Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	receipts := make([]Receipt, 0, len(out))
	for _, d := range out {
		r, err := b.cfg.Receipts.Decode(d.Receipt)
		if err == nil {
			receipts = append(receipts, r)
		}
	}
	if !req.Dead {
		receipts = b.releaseOwned(ctx, req, receipts)
	}
	b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		leases := make([]store.Lease, len(idx))
		for j, i := range idx {
			leases[j] = receipts[i].Lease
		}
		_, err := cs.conn.Release(ctx, leases, !req.Dead, b.now().UTC())
		if err != nil {
			b.log.Warn("leases of an abandoned claim not released; they become claimable when they expire",
				"cluster", name, "topic", req.Topic, "subscription", req.Subscription, "leases", len(leases), "err", err)
		}
	})
}

func (b *Broker) claimOnce(ctx context.Context, req ClaimRequest, sub subscription.Subscription) ([]Delivery, error) {
	if b.selfFenced.Load() {
		return nil, errSelfFenced
	}
	ordered := sub.Ordered && !req.Dead
	if b.claimsStopped.Load() {
		return nil, cluster.ErrClaimsStopped // before a peek could answer "nothing to claim"
	}
	m, release := b.pin()
	defer release()
	ctx = store.WithFence(ctx, store.Fence{MapVersion: m.Version()}) // claims write leases
	exclude := m.FrozenVShards()
	names := m.Clusters()
	clusters := *b.clusters.Load()
	start := int(b.rr.Add(1))
	order := make([]string, len(names))
	for k := range names {
		order[k] = names[(start+k)%len(names)]
	}
	var plan claimPlan
	if len(order) > 1 {
		plan = b.planClaim(ctx, req, order, clusters, exclude)
		if plan.empty() {
			return []Delivery{}, nil
		}
		order = plan.order
	}
	var out []Delivery
	bytes := 0
	failed := map[string]bool{}
	for name := range plan.failed {
		failed[name] = true
	}
	var lastErr error = plan.err
	claimFrom := func(name string, max int) {
		if req.MaxBytes > 0 && bytes >= req.MaxBytes {
			return
		}
		s, ok := clusters[name]
		if !ok {
			failed[name] = true
			return
		}
		token := rand.Uint64() | 1
		key := cluster.ClaimKey{Topic: req.Topic, Sub: req.Subscription, Ordered: ordered, Dead: req.Dead, ErrorCode: req.ErrorCode,
			MapVersion: m.Version()}
		sreq := store.ClaimRequest{Topic: req.Topic, Subscription: req.Subscription, Consumer: req.Consumer,
			Max: max, Lease: req.Lease, Token: token, MaxAttempts: sub.Policy().MaxAttempts, Now: b.now().UTC(),
			Ordered: ordered, Dead: req.Dead, ErrorCode: req.ErrorCode, ExcludeVShards: exclude}
		if req.MaxBytes > 0 {
			sreq.MaxBytes, sreq.AllowOversize = req.MaxBytes-bytes, len(out) == 0
		}
		got, err := s.conn.Claim(ctx, key, sreq)
		if err != nil {
			failed[name] = true
			lastErr = err
			b.log.Warn("claim failed on cluster", "cluster", name, "err", err)
			return
		}
		delete(failed, name)
		for _, c := range got {
			r := Receipt{VShard: shard.ID(c.Message.VShard), Topic: req.Topic,
				Lease: store.Lease{MessageID: c.Message.ID, Subscription: req.Subscription, Token: c.Token, Ordered: ordered}}
			out = append(out, Delivery{Claimed: c, Receipt: b.cfg.Receipts.Encode(r)})
			bytes += domain.EncodedSize(c.Message)
		}
	}
	for _, name := range order {
		if len(out) >= req.Max {
			break
		}
		want := req.Max - len(out)
		if plan.quota != nil {
			q, known := plan.quota[name]
			if known && q == 0 {
				continue
			}
			if known {
				want = min(want, q)
			}
		}
		claimFrom(name, want)
	}
	if plan.quota != nil {
		// Rows the peek saw may have gone to other claimers meanwhile (or
		// stay parked behind their order key): fill up from the clusters
		// that showed more than their share.
		for _, name := range order {
			if len(out) >= req.Max {
				break
			}
			if q, known := plan.quota[name]; known && plan.seen[name] > q {
				claimFrom(name, req.Max-len(out))
			}
		}
	}
	if len(out) == 0 && len(failed) == len(names) && len(names) > 0 {
		if errors.Is(lastErr, ErrUnavailable) {
			return nil, lastErr
		}
		return nil, fmt.Errorf("%w: no cluster answered the claim: %w", ErrUnavailable, lastErr)
	}
	// One answer in the claim's order over every cluster: priority, then
	// age (ids are router-generated and grow with time).
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Message, out[j].Message
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.ID < b.ID
	})
	return out, nil
}

// claimPlan is how a claim spanning clusters shares its max among them so
// that it takes the highest priority, then the oldest, deliveries of all
// of them (DESIGN §6 "Delay and priority"), and not the best of whichever
// cluster it happens to start with.
type claimPlan struct {
	order  []string       // clusters by the rank of their best claimable delivery; unknown ones last
	quota  map[string]int // deliveries to take from each cluster whose peek answered
	seen   map[string]int // claimable deliveries each such cluster showed
	failed map[string]bool
	err    error // the last peek error
}

// empty says that every cluster answered and none has anything to claim.
func (p claimPlan) empty() bool {
	if p.quota == nil || len(p.failed) > 0 {
		return false
	}
	for _, n := range p.seen {
		if n > 0 {
			return false
		}
	}
	return true
}

// planClaim peeks at every cluster's claim order (no locks) and merges
// them: the first req.Max of the merged order say how many to take from
// each cluster. A cluster whose peek failed is claimed last, for what is
// left.
func (b *Broker) planClaim(ctx context.Context, req ClaimRequest, order []string, clusters map[string]*clusterConn, exclude []uint16) claimPlan {
	type peeked struct {
		heads []store.ClaimHead
		err   error
	}
	res := make([]peeked, len(order))
	now := b.now().UTC()
	var wg sync.WaitGroup
	for k, name := range order {
		cs, ok := clusters[name]
		if !ok {
			res[k].err = fmt.Errorf("%w: cluster %s is not connected", ErrUnavailable, name)
			continue
		}
		wg.Go(func() {
			res[k].heads, res[k].err = cs.conn.PeekClaimable(ctx, req.Topic, req.Subscription, now, req.Max, req.Dead, req.ErrorCode, exclude)
		})
	}
	wg.Wait()
	plan := claimPlan{quota: map[string]int{}, seen: map[string]int{}, failed: map[string]bool{}}
	type ranked struct {
		head    store.ClaimHead
		cluster int
	}
	var all []ranked
	for k, p := range res {
		if p.err != nil {
			plan.failed[order[k]], plan.err = true, p.err
			continue
		}
		plan.quota[order[k]] = 0
		plan.seen[order[k]] = len(p.heads)
		for _, h := range p.heads {
			all = append(all, ranked{h, k})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i].head, all[j].head
		if a.Priority != b.Priority {
			return a.Priority > b.Priority
		}
		return a.MessageID < b.MessageID
	})
	placed := map[string]bool{}
	for i, r := range all {
		name := order[r.cluster]
		if i < req.Max {
			plan.quota[name]++
		}
		if !placed[name] {
			placed[name] = true
			plan.order = append(plan.order, name)
		}
	}
	for _, name := range order {
		if !placed[name] {
			plan.order = append(plan.order, name) // empty (quota 0) or unknown
		}
	}
	return plan
}

// LeaseResult is one ack's or extend's outcome.
type LeaseResult struct {
	Status  domain.LeaseStatus
	Expires time.Time
	Err     error
}

// orderedNow marks leases whose subscription is ordered now, whatever it
// was when they were taken: finishing them must release the next delivery
// of their key even across a switch to ordered.
func (b *Broker) orderedNow(ctx context.Context, receipts []Receipt) {
	for i := range receipts {
		r := &receipts[i]
		if s, ok, err := b.subs.Get(ctx, r.Topic, r.Subscription); err == nil && ok && s.Ordered {
			r.Ordered = true
		}
	}
}

// Ack completes deliveries: each receipt goes to the owner of its unit —
// this router's, or another router's (forwarded) — which acks a lease it
// holds in memory in its cluster's next flush; a durable lease (a retry,
// or one written to the table on expiry or hand-over) is acked in the
// table, in one transaction per cluster shared with the other acks that
// reach it meanwhile (acker.go).
func (b *Broker) Ack(ctx context.Context, receipts []Receipt) []LeaseResult {
	return b.ack(ctx, receipts, true)
}

// AckHere acks receipts another router forwarded: on the owners here and,
// for what they do not hold in memory, in the table; never forwarded
// again (a unit owned elsewhere answers unavailable: the sender reads the
// owner records again and the client retries).
func (b *Broker) AckHere(ctx context.Context, receipts []Receipt) []LeaseResult {
	return b.ack(ctx, receipts, false)
}

func (b *Broker) ack(ctx context.Context, receipts []Receipt, forward bool) []LeaseResult {
	b.orderedNow(ctx, receipts)
	out := make([]LeaseResult, len(receipts))
	rid := reqid.From(ctx)
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome { return o.Ack(ctx, ops(receipts, ids, rid, nil)) },
			func(addr string, ids []int) error {
				res, err := b.peer.Ack(ctx, addr, pick(receipts, ids))
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) { out[i] = LeaseResult{Status: oc.Status, Err: oc.Err} })
		if len(durable) == 0 {
			return
		}
		leases := make([]store.Lease, len(durable))
		for j, i := range durable {
			leases[j] = receipts[i].Lease
		}
		// Shared with the other acks that reach the cluster meanwhile
		// (acker.go).
		st, err := cs.conn.Ack(ctx, leases, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = LeaseResult{Status: st[j]}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: err}
		}
	}
	return out
}

// Extend moves the leases' expiry to now + lease: in the owner's memory
// for a lease held there (nothing is written), in the table for a durable
// one.
func (b *Broker) Extend(ctx context.Context, receipts []Receipt, lease time.Duration) []LeaseResult {
	return b.extend(ctx, receipts, lease, true)
}

// ExtendHere is Extend for receipts another router forwarded (see AckHere).
func (b *Broker) ExtendHere(ctx context.Context, receipts []Receipt, lease time.Duration) []LeaseResult {
	return b.extend(ctx, receipts, lease, false)
}

func (b *Broker) extend(ctx context.Context, receipts []Receipt, lease time.Duration, forward bool) []LeaseResult {
	out := make([]LeaseResult, len(receipts))
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome {
				return o.Extend(ctx, ops(receipts, ids, "", nil), lease)
			},
			func(addr string, ids []int) error {
				res, err := b.peer.Extend(ctx, addr, pick(receipts, ids), lease)
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) {
				out[i] = LeaseResult{Status: oc.Status, Expires: oc.Expires, Err: oc.Err}
			})
		if len(durable) == 0 {
			return
		}
		leases := make([]store.Lease, len(durable))
		for j, i := range durable {
			leases[j] = receipts[i].Lease
		}
		st, exp, err := cs.conn.Extend(ctx, leases, lease, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = LeaseResult{Status: st[j]}
			if st[j] == store.LeaseOK {
				out[i].Expires = exp
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = LeaseResult{Status: domain.LeaseUnavailable, Err: err}
		}
	}
	return out
}

// NackItem is one failed delivery.
type NackItem struct {
	Receipt    Receipt
	ErrorCode  string
	Error      string
	RetryAfter time.Duration // 0: the subscription's backoff, unless RetryNow
	RetryNow   bool          // ready again at once (retry_after_ms 0)
}

// NackResult is one nack's outcome.
type NackResult struct {
	Status        domain.NackStatus
	NextAttemptAt time.Time
	Err           error
}

// Nack fails deliveries: retried with the subscription's backoff, or dead
// at its max attempts. A lease held in an owner's memory is failed in its
// cluster's next flush, a durable one in the table.
func (b *Broker) Nack(ctx context.Context, items []NackItem) []NackResult {
	return b.nack(ctx, items, true)
}

// NackHere is Nack for items another router forwarded (see AckHere).
func (b *Broker) NackHere(ctx context.Context, items []NackItem) []NackResult {
	return b.nack(ctx, items, false)
}

func (b *Broker) nack(ctx context.Context, items []NackItem, forward bool) []NackResult {
	receipts := make([]Receipt, len(items))
	for i, it := range items {
		receipts[i] = it.Receipt
	}
	b.orderedNow(ctx, receipts)
	for i := range items {
		items[i].Receipt = receipts[i]
	}
	out := make([]NackResult, len(items))
	policy := func(topic, sub string) store.RetryPolicy { return b.nackPolicy(ctx, topic, sub) }
	rid := reqid.From(ctx)
	errs := b.dispatch(ctx, receiptVShards(receipts), nil, func(ctx context.Context, name string, cs *clusterConn, idx []int, _ func() func()) {
		durable := b.ownedOps(ctx, name, receipts, idx, forward,
			func(o *delivery.Owner, ids []int) []delivery.Outcome {
				u := o.Unit()
				return o.Nack(ctx, ops(receipts, ids, rid, items), func() store.RetryPolicy { return policy(u.Topic, u.Subscription) }, rand.Float64)
			},
			func(addr string, ids []int) error {
				fwd := make([]NackItem, len(ids))
				for j, i := range ids {
					fwd[j] = items[i]
				}
				res, err := b.peer.Nack(ctx, addr, fwd)
				for j, i := range ids {
					if err == nil {
						out[i] = res[j]
					}
				}
				return err
			},
			func(i int, oc delivery.Outcome) {
				out[i] = NackResult{Status: oc.NackStatus, NextAttemptAt: oc.NextAttemptAt, Err: oc.Err}
			})
		if len(durable) == 0 {
			return
		}
		batch := make([]store.NackItem, len(durable))
		for j, i := range durable {
			it := items[i]
			batch[j] = store.NackItem{Lease: it.Receipt.Lease, ErrorCode: it.ErrorCode, Error: it.Error, RetryAfter: it.RetryAfter,
				RetryNow: it.RetryNow}
		}
		res, err := cs.conn.Nack(ctx, batch, policy, rand.Float64, b.now().UTC())
		for j, i := range durable {
			if err != nil {
				out[i] = NackResult{Status: domain.NackUnavailable, Err: fmt.Errorf("cluster %s: %w", name, err)}
				continue
			}
			out[i] = NackResult{Status: res[j].Status, NextAttemptAt: res[j].NextAttemptAt}
		}
	})
	for i, err := range errs {
		if err != nil {
			out[i] = NackResult{Status: domain.NackUnavailable, Err: err}
		}
	}
	return out
}

func receiptVShards(receipts []Receipt) []shard.ID {
	vs := make([]shard.ID, len(receipts))
	for i, r := range receipts {
		vs[i] = r.VShard
	}
	return vs
}
