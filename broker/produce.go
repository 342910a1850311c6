package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

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
	}
	// Keys the recent-keys cache holds are answered from it (all looked
	// up under one lock); skip marks them.
	var held []recentKey
	if dur == DurabilityPrimary && b.recent != nil {
		b.recent.getAll(topic, len(msgs), func(i int) string { return results[i].Key }, func(i int, rk recentKey) {
			if held == nil {
				held = make([]recentKey, len(msgs))
			}
			held[i], skip[i] = rk, true
		})
	}
	for i, m := range msgs {
		hash := PayloadHash(m.Payload)
		if skip[i] {
			rk := held[i]
			results[i].ID = rk.id
			results[i].VShard = shard.ID(rk.vshard) // where the holder lives (and its trace)
			status := store.Conflict
			if string(rk.hash[:]) == string(hash) {
				status = store.Duplicate
			}
			results[i].Status = status
			b.rejected.add(b.ids.Next(), status, rk, hash)
			continue
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
			Msg: &store.Message{ID: id, VShard: uint16(vs[i]), Topic: topic, Key: results[i].Key, OrderKey: m.OrderKey,
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
	}
	if b.recent != nil {
		b.recent.addAll(topic, len(idx), func(j int) (string, recentKey, bool) {
			if resp.Errs[j] != nil {
				return "", recentKey{}, false
			}
			i, r := idx[j], resp.Results[j]
			if r.Status == store.Conflict {
				return "", recentKey{}, false // the holder's hash is not ours; let the database answer again
			}
			rk := recentKey{id: r.ID, vshard: items[i].Msg.VShard}
			copy(rk.hash[:], items[i].Hash)
			if r.Status == store.Duplicate {
				rk.vshard = r.VShard
			}
			return results[i].Key, rk, true
		})
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
