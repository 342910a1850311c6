// Package lookup answers the read side of shardmq — a message's trace, the
// messages of a transaction id, and which transaction ids have no message —
// without loading the primaries: each read goes to the cluster's least-
// lagged replica under the lag limit and falls back to the primary when no
// replica qualifies, when the replica does not have the row yet, or when it
// fails. Every answer says where it was read from and how stale it may be.
// Reads over all clusters scatter with bounded concurrency and a
// per-cluster timeout, and name the clusters that did not answer rather
// than silently returning less.
package lookup

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
)

// Reader is what the lookups need from one MySQL endpoint.
type Reader interface {
	Trace(ctx context.Context, topic, key string, now time.Time) (*store.MessageTrace, error)
	MessagesByTransaction(ctx context.Context, txID string, after uint64, limit, maxBytes int) ([]*store.Message, bool, error)
	FindTransactions(ctx context.Context, ids []string) (map[string]int, error)
	// Events reads the trace events of messages: the hot events of a
	// message whose own row is archived.
	Events(ctx context.Context, ids []uint64) ([]store.Event, error)
}

// Archive is what the lookups need from the archive cluster
// (docs/retention.md): the warm tier's rows and the index of the messages
// exported to cold files.
type Archive interface {
	ArchivedTrace(ctx context.Context, topic, key string, now time.Time) (*store.MessageTrace, error)
	ColdByKey(ctx context.Context, topic, key string) (*store.ColdEntry, error)
	ArchivedByTransaction(ctx context.Context, txID string, after uint64, limit, maxBytes int) ([]*store.Message, bool, error)
	ColdByTransaction(ctx context.Context, txID string, after uint64, limit int) ([]store.ColdEntry, error)
}

var _ Archive = (*store.Store)(nil)

// Tiers a message is found in.
const (
	TierHot  = "hot"
	TierWarm = "warm"
	TierCold = "cold"
)

// ArchiveCluster is the cluster name answers give the archive cluster.
const ArchiveCluster = "archive"

var _ Reader = (*store.Store)(nil)

// Conn is the call point of one endpoint: Do runs fn on its Reader (in
// the router, through the endpoint's breaker, bounded by its read timeout).
type Conn interface {
	Do(ctx context.Context, fn func(ctx context.Context, r Reader) error) error
}

// Target is an endpoint to read from.
type Target struct {
	Conn     Conn
	Endpoint string        // host:port
	Lag      time.Duration // replicas: the measured lag
}

// Endpoints resolves a cluster's endpoints for reads.
type Endpoints interface {
	// Primary is the cluster's primary.
	Primary(cluster string) (Target, bool)
	// Replica is the least-lagged replica under the lag limit.
	Replica(cluster string) (Target, bool)
	// AnyReplica is the freshest reachable replica whatever its lag: the
	// read of last resort when the primary cannot be read.
	AnyReplica(cluster string) (Target, bool)
}

// Where a read was served from.
const (
	FromReplica = "replica"
	FromPrimary = "primary"
)

// Why a read did not come from a replica within the limit.
const (
	FallbackNoReplica          = "no_replica_within_lag"
	FallbackNotOnReplica       = "not_on_replica"
	FallbackReplicaError       = "replica_error"
	FallbackPrimaryUnavailable = "primary_unavailable" // served by a replica over the limit
)

// Source says where one cluster's answer came from.
type Source struct {
	Cluster  string `json:"cluster"`
	ReadFrom string `json:"read_from"`
	Endpoint string `json:"endpoint"`
	// LagMS is the replica's measured lag; 0 for the primary.
	LagMS    int64  `json:"replica_lag_ms"`
	Fallback string `json:"fallback_reason,omitempty"`
}

// Config tunes the lookups. Zero fields take the defaults named.
type Config struct {
	// Concurrency bounds the clusters read at once by a scatter. Defaults
	// to 8.
	Concurrency int
	// ClusterTimeout bounds each cluster's part of a scatter. Defaults to
	// 2s.
	ClusterTimeout time.Duration
	// MaxMessages is a transaction lookup's page size when the request
	// gives none. Defaults to 100.
	MaxMessages int
	// Now is the clock (lease states in traces). Defaults to time.Now.
	Now func() time.Time
	// Archive returns the archive cluster's primary, or nil when there is
	// none: a message not on its hot cluster is then looked for there
	// (warm rows, then the cold index). Defaults to none.
	Archive func() Archive
	// Leases answers a lease held in an owner's memory (docs/consume.md,
	// "Owners"): the table shows such a delivery as ready, its owner knows
	// it is in flight. Defaults to none.
	Leases func(cluster, topic, sub string, id uint64) (Lease, bool)
}

// Lease is a lease held in an owner's memory.
type Lease struct {
	Consumer           string
	ClaimedAt, Expires time.Time
}

func (c Config) withDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.ClusterTimeout <= 0 {
		c.ClusterTimeout = 2 * time.Second
	}
	if c.MaxMessages <= 0 {
		c.MaxMessages = 100
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Archive == nil {
		c.Archive = func() Archive { return nil }
	}
	return c
}

// Service runs lookups. Safe for concurrent use.
type Service struct {
	cfg   Config
	ep    Endpoints
	table *routing.Table
}

// New returns a service reading through ep, routing by table.
func New(cfg Config, ep Endpoints, table *routing.Table) *Service {
	return &Service{cfg: cfg.withDefaults(), ep: ep, table: table}
}

// ErrUnavailable: no endpoint of the cluster could answer.
var ErrUnavailable = store.ErrUnavailable

// read runs fn on the cluster's replica, else its primary, as the package
// comment says. absent reports the errors that mean "not there (yet)".
func (s *Service) read(ctx context.Context, cluster string, fn func(context.Context, Reader) error, absent func(error) bool) (Source, error) {
	src := Source{Cluster: cluster}
	tried := ""
	if t, ok := s.ep.Replica(cluster); ok {
		err := t.Conn.Do(ctx, fn)
		switch {
		case err == nil:
			src.ReadFrom, src.Endpoint, src.LagMS = FromReplica, t.Endpoint, t.Lag.Milliseconds()
			return src, nil
		case ctx.Err() != nil:
			return src, err
		case absent(err):
			src.Fallback = FallbackNotOnReplica
		default:
			src.Fallback = FallbackReplicaError
		}
		tried = t.Endpoint
	} else {
		src.Fallback = FallbackNoReplica
	}
	p, ok := s.ep.Primary(cluster)
	if !ok {
		return src, fmt.Errorf("%w: cluster %s has no primary connection", ErrUnavailable, cluster)
	}
	src.ReadFrom, src.Endpoint = FromPrimary, p.Endpoint
	err := p.Conn.Do(ctx, fn)
	if err == nil || absent(err) || ctx.Err() != nil || !errors.Is(err, store.ErrUnavailable) {
		return src, err
	}
	// The primary is down. A replica over the lag limit still knows
	// everything it had applied; unless it already said "not here".
	if src.Fallback == FallbackNotOnReplica {
		return src, err
	}
	if t, ok := s.ep.AnyReplica(cluster); ok && t.Endpoint != tried {
		if rerr := t.Conn.Do(ctx, fn); rerr == nil || absent(rerr) {
			return Source{Cluster: cluster, ReadFrom: FromReplica, Endpoint: t.Endpoint, LagMS: t.Lag.Milliseconds(),
				Fallback: FallbackPrimaryUnavailable}, rerr
		}
	}
	return src, err
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// Trace is a message's trace and where it was read.
type Trace struct {
	*store.MessageTrace
	Source
	VShard shard.ID
	// Tier is where the message was found: TierHot (its cluster), TierWarm
	// (the archive cluster) or TierCold (a file; MessageTrace then holds
	// what the index keeps: the message without payload, produced and
	// archived events, no deliveries).
	Tier string
	// Cold names the file of a TierCold message.
	Cold *store.ColdEntry
}

// Trace reads the trace of the message with key on topic. orderKey must be
// the message's order key, if it had one: it decides the vshard. It
// returns store.ErrNotFound when no cluster endpoint has the message and
// store.ErrUnavailable when its cluster cannot be read.
func (s *Service) Trace(ctx context.Context, topic, key, orderKey string) (*Trace, error) {
	v := shard.Of(shard.Key(orderKey, key))
	cluster, _ := s.table.Load().Lookup(v)
	var tr *store.MessageTrace
	src, err := s.read(ctx, cluster, func(ctx context.Context, r Reader) (err error) {
		tr, err = r.Trace(ctx, topic, key, s.cfg.Now().UTC())
		return err
	}, isNotFound)
	if isNotFound(err) {
		if t, aerr := s.archivedTrace(ctx, cluster, topic, key, v); t != nil || !isNotFound(aerr) {
			return t, aerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("trace on cluster %s: %w", cluster, err)
	}
	s.withLeases(cluster, topic, tr)
	return &Trace{MessageTrace: tr, Source: src, VShard: v, Tier: TierHot}, nil
}

// withLeases shows the deliveries of tr that an owner holds in memory as
// in flight, with their claim.
func (s *Service) withLeases(cluster, topic string, tr *store.MessageTrace) {
	if s.cfg.Leases == nil {
		return
	}
	for i := range tr.Deliveries {
		d := &tr.Deliveries[i]
		if d.State != domain.DeliveryReady {
			continue
		}
		l, ok := s.cfg.Leases(cluster, topic, d.Subscription, tr.Message.ID)
		if !ok {
			continue
		}
		d.State, d.Consumer, d.LeaseExpires, d.NextAttemptAt = domain.DeliveryInFlight, l.Consumer, l.Expires, time.Time{}
		d.Attempts = max(d.Attempts, 1)
		tr.Events = append(tr.Events, store.Event{At: l.ClaimedAt, MessageID: tr.Message.ID, VShard: tr.Message.VShard,
			Subscription: d.Subscription, Type: store.EventClaimed, Consumer: l.Consumer, Attempt: d.Attempts})
	}
	sort.SliceStable(tr.Events, func(i, j int) bool { return tr.Events[i].At.Before(tr.Events[j].At) })
}

// archivedTrace looks for a message its hot cluster lacks in the warm tier
// (merging the events still on the hot cluster: written after the
// message's month moved) and then in the cold index.
func (s *Service) archivedTrace(ctx context.Context, cluster, topic, key string, v shard.ID) (*Trace, error) {
	a := s.cfg.Archive()
	if a == nil {
		return nil, store.ErrNotFound
	}
	now := s.cfg.Now().UTC()
	src := Source{Cluster: ArchiveCluster, ReadFrom: FromPrimary}
	tr, err := a.ArchivedTrace(ctx, topic, key, now)
	if err == nil {
		var evs []store.Event
		if _, err := s.read(ctx, cluster, func(ctx context.Context, r Reader) (err error) {
			evs, err = r.Events(ctx, []uint64{tr.Message.ID})
			return err
		}, func(error) bool { return false }); err != nil {
			return nil, fmt.Errorf("trace events on cluster %s: %w", cluster, err)
		}
		return &Trace{MessageTrace: store.MergeEvents(tr, evs, now), Source: src, VShard: v, Tier: TierWarm}, nil
	}
	if !isNotFound(err) {
		return nil, fmt.Errorf("trace on the archive cluster: %w", err)
	}
	ce, err := a.ColdByKey(ctx, topic, key)
	if err != nil {
		if isNotFound(err) {
			return nil, err
		}
		return nil, fmt.Errorf("trace on the archive cluster: %w", err)
	}
	m := ce.Message
	return &Trace{MessageTrace: &store.MessageTrace{Message: m, Events: []store.Event{
		{At: m.CreatedAt, MessageID: m.ID, VShard: m.VShard, Type: store.EventProduced},
		{At: ce.ExportedAt, MessageID: m.ID, VShard: m.VShard, Type: store.EventArchived},
	}}, Source: src, VShard: v, Tier: TierCold, Cold: ce}, nil
}

// ClusterError is a cluster that did not answer a scatter.
type ClusterError struct {
	Cluster string `json:"cluster"`
	Error   string `json:"error"`
}

// Found is a message found by a scatter and the cluster it lives on.
type Found struct {
	*store.Message
	Cluster string
	// Tier is TierHot, TierWarm or TierCold; File names a cold message's
	// file (its Message then lacks payload and headers).
	Tier string
	File string
}

// TransactionResult is one page of what every cluster holds for one
// transaction id.
type TransactionResult struct {
	// Messages are the page's messages, oldest (lowest id) first.
	Messages []Found
	// NextCursor is where the next page starts (TxPage.After); 0 when
	// this page is the last.
	NextCursor uint64
	// Sources says where each answering cluster was read.
	Sources []Source
	// Unanswered lists the clusters that could not be read: the answer
	// may lack their messages.
	Unanswered []ClusterError
}

// TxPage selects one page of a transaction lookup: the messages with ids
// above After, at most Limit (0: Config.MaxMessages) and at most MaxBytes
// of encoded messages (domain.EncodedSize; 0: no byte cap). The first
// message of a page is answered whatever its size.
type TxPage struct {
	After    uint64
	Limit    int
	MaxBytes int
}

// txPart is one source's page (a cluster, the warm or the cold tier):
// its messages in id order and whether it has more after them.
type txPart struct {
	found []Found
	last  uint64 // the last id the source read (some may be left out)
	more  bool
}

// mergePages merges the sources' pages into one page of at most limit
// messages and maxBytes. A source that has more after its page bounds
// the merge: a message above its last id could hide one of its own, so
// the page ends there and the cursor resumes from it. A message found in
// two sources (moved while the lookup ran) is answered once, from the
// first.
func mergePages(parts []txPart, limit, maxBytes int) ([]Found, uint64) {
	var bound uint64
	cut := false
	for _, p := range parts {
		if p.more && (!cut || p.last < bound) {
			bound, cut = p.last, true
		}
	}
	var all []Found
	seen := map[uint64]bool{}
	for _, p := range parts {
		for _, f := range p.found {
			if seen[f.ID] {
				continue
			}
			seen[f.ID] = true
			all = append(all, f)
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	out := all[:0:0]
	used := 0
	for _, f := range all {
		size := domain.EncodedSize(f.Message)
		if cut && f.ID > bound {
			return out, bound
		}
		if len(out) == limit || (maxBytes > 0 && len(out) > 0 && used+size > maxBytes) {
			return out, out[len(out)-1].ID
		}
		out = append(out, f)
		used += size
	}
	if cut {
		// Every message up to the bound is in the page; the bound's
		// source has more after it.
		return out, bound
	}
	return out, 0
}

// scatter runs fn for every cluster of the current map with bounded
// concurrency, each under ClusterTimeout, and collects who failed.
func (s *Service) scatter(ctx context.Context, fn func(ctx context.Context, cluster string) error) []ClusterError {
	var mu sync.Mutex
	var failed []ClusterError
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Concurrency)
	for _, c := range s.table.Load().Clusters() {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(gctx, s.cfg.ClusterTimeout)
			defer cancel()
			if err := fn(cctx, c); err != nil {
				mu.Lock()
				failed = append(failed, ClusterError{Cluster: c, Error: err.Error()})
				mu.Unlock()
			}
			return nil
		})
	}
	g.Wait()
	sort.Slice(failed, func(i, j int) bool { return failed[i].Cluster < failed[j].Cluster })
	return failed
}

// Transaction finds one page of the messages that carry transaction id
// txID on every cluster and in the archive. A cluster whose replica has
// none is asked again on its primary (the messages may be too new for the
// replica). Each source reads at most the page's limit and bytes, so that
// a lookup of a large transaction holds at most one page per source.
func (s *Service) Transaction(ctx context.Context, txID string, page TxPage) (*TransactionResult, error) {
	if page.Limit <= 0 {
		page.Limit = s.cfg.MaxMessages
	}
	out := &TransactionResult{}
	var mu sync.Mutex
	var parts []txPart
	errNone := errors.New("none")
	out.Unanswered = s.scatter(ctx, func(ctx context.Context, cluster string) error {
		var msgs []*store.Message
		var more bool
		src, err := s.read(ctx, cluster, func(ctx context.Context, r Reader) (err error) {
			msgs, more, err = r.MessagesByTransaction(ctx, txID, page.After, page.Limit, page.MaxBytes)
			if err == nil && len(msgs) == 0 {
				return errNone
			}
			return err
		}, func(err error) bool { return errors.Is(err, errNone) })
		if err != nil && !errors.Is(err, errNone) {
			return err
		}
		part := txPart{more: more}
		m := s.table.Load()
		for _, msg := range msgs {
			part.last = msg.ID
			// A resharding job's rows (copied before the flip, left until
			// the cleanup after it) are answered by the owner only.
			if owner, _ := m.Lookup(shard.ID(msg.VShard)); owner != cluster {
				continue
			}
			part.found = append(part.found, Found{Message: msg, Cluster: cluster, Tier: TierHot})
		}
		mu.Lock()
		defer mu.Unlock()
		out.Sources = append(out.Sources, src)
		parts = append(parts, part)
		return nil
	})
	if len(out.Sources) == 0 && len(out.Unanswered) > 0 {
		return out, fmt.Errorf("%w: no cluster answered: %s", ErrUnavailable, out.Unanswered[0].Error)
	}
	// The hot tier first: a message being archived is answered from its
	// cluster while it is still there.
	parts = append(parts, s.archivedTransaction(ctx, txID, page, out)...)
	sort.Slice(out.Sources, func(i, j int) bool { return out.Sources[i].Cluster < out.Sources[j].Cluster })
	out.Messages, out.NextCursor = mergePages(parts, page.Limit, page.MaxBytes)
	return out, nil
}

// archivedTransaction reads the page's archived messages of txID: warm
// rows, then cold index entries of messages not restored to the warm
// tier.
func (s *Service) archivedTransaction(ctx context.Context, txID string, page TxPage, out *TransactionResult) []txPart {
	a := s.cfg.Archive()
	if a == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ClusterTimeout)
	defer cancel()
	warm, warmMore, err := a.ArchivedByTransaction(ctx, txID, page.After, page.Limit, page.MaxBytes)
	var cold []store.ColdEntry
	if err == nil {
		cold, err = a.ColdByTransaction(ctx, txID, page.After, page.Limit+1)
	}
	if err != nil {
		out.Unanswered = append(out.Unanswered, ClusterError{Cluster: ArchiveCluster, Error: err.Error()})
		return nil
	}
	out.Sources = append(out.Sources, Source{Cluster: ArchiveCluster, ReadFrom: FromPrimary})
	w := txPart{more: warmMore}
	for _, m := range warm {
		w.found = append(w.found, Found{Message: m, Cluster: ArchiveCluster, Tier: TierWarm})
		w.last = m.ID
	}
	c := txPart{more: len(cold) > page.Limit}
	for _, e := range cold[:min(len(cold), page.Limit)] {
		c.found = append(c.found, Found{Message: e.Message, Cluster: ArchiveCluster, Tier: TierCold, File: e.File})
		c.last = e.Message.ID
	}
	return []txPart{w, c}
}

// MissingResult answers which transaction ids have no message.
type MissingResult struct {
	// Missing are the ids no answering cluster has, in request order. When
	// Unanswered is not empty they may live on a cluster that did not
	// answer.
	Missing []string
	// Found counts the messages of each id that has some.
	Found      map[string]int
	Sources    []Source
	Unanswered []ClusterError
}

// MissingTransactions reports which of ids (say, from a producer's own
// database) have no message on any cluster — the seed's reconciliation by
// transaction id. Ids a replica lacks are asked again on the primary.
func (s *Service) MissingTransactions(ctx context.Context, ids []string) (*MissingResult, error) {
	out := &MissingResult{Found: map[string]int{}}
	var mu sync.Mutex
	out.Unanswered = s.scatter(ctx, func(ctx context.Context, cluster string) error {
		found := map[string]int{}
		want := ids
		src := Source{Cluster: cluster}
		// Replica first; ids it lacks go to the primary.
		if t, ok := s.ep.Replica(cluster); ok {
			got, err := findTransactions(ctx, t.Conn, want)
			if err == nil {
				src.ReadFrom, src.Endpoint, src.LagMS = FromReplica, t.Endpoint, t.Lag.Milliseconds()
				maps(found, got)
				want = lacking(want, got)
				if len(want) > 0 {
					src.Fallback = FallbackNotOnReplica
				}
			} else {
				src.Fallback = FallbackReplicaError
			}
		} else {
			src.Fallback = FallbackNoReplica
		}
		if len(want) > 0 {
			got, s2, err := s.readFind(ctx, cluster, want, src.Fallback)
			if err != nil {
				return err
			}
			if src.ReadFrom == "" {
				src = s2
			}
			maps(found, got)
		}
		mu.Lock()
		defer mu.Unlock()
		out.Sources = append(out.Sources, src)
		maps(out.Found, found)
		return nil
	})
	if len(out.Sources) == 0 && len(out.Unanswered) > 0 {
		return out, fmt.Errorf("%w: no cluster answered: %s", ErrUnavailable, out.Unanswered[0].Error)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if out.Found[id] == 0 && !seen[id] {
			out.Missing = append(out.Missing, id)
		}
		seen[id] = true
	}
	sort.Slice(out.Sources, func(i, j int) bool { return out.Sources[i].Cluster < out.Sources[j].Cluster })
	return out, nil
}

func findTransactions(ctx context.Context, c Conn, ids []string) (got map[string]int, err error) {
	err = c.Do(ctx, func(ctx context.Context, r Reader) (err error) {
		got, err = r.FindTransactions(ctx, ids)
		return err
	})
	return got, err
}

// readFind asks the primary (or, if it is down and no replica answered
// yet, the freshest replica) for ids.
func (s *Service) readFind(ctx context.Context, cluster string, ids []string, fallback string) (map[string]int, Source, error) {
	src := Source{Cluster: cluster, Fallback: fallback}
	p, ok := s.ep.Primary(cluster)
	if !ok {
		return nil, src, fmt.Errorf("%w: cluster %s has no primary connection", ErrUnavailable, cluster)
	}
	got, err := findTransactions(ctx, p.Conn, ids)
	if err == nil {
		src.ReadFrom, src.Endpoint = FromPrimary, p.Endpoint
		return got, src, nil
	}
	return nil, src, err
}

func maps(dst, src map[string]int) {
	for k, v := range src {
		dst[k] += v
	}
}

func lacking(ids []string, got map[string]int) []string {
	var out []string
	for _, id := range ids {
		if got[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}
