package delivery

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/internal/batch"
	"github.com/shardmq/shardmq/store"
)

// Store is what owners need of their cluster's primary.
type Store interface {
	ScanClaimable(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16) ([]store.Candidate, error)
	ScanClaimableSkipping(ctx context.Context, topic, sub string, now time.Time, after *store.ClaimCursor, limit int, exclude []uint16, skip map[uint64]bool) (store.Scan, error)
	OrderHeads(ctx context.Context, topic, sub string, keys []string) (map[string]uint64, error)
	Messages(ctx context.Context, ids []uint64) (map[uint64]*store.Message, error)
	ClaimDurable(ctx context.Context, unit store.OwnedUnit, req store.ClaimRequest, ids []uint64) ([]store.Claimed, error)
	FlushOwned(ctx context.Context, batch []store.OwnedFlush, now time.Time) ([]store.OwnedResult, error)
	AcquireOwner(ctx context.Context, topic, sub, owner, addr string, ttl time.Duration) (store.OwnerGrant, store.OwnerRecord, error)
	RenewOwners(ctx context.Context, owner string, ttl, horizon time.Duration) ([]store.OwnedUnit, time.Time, error)
	ReleaseOwner(ctx context.Context, topic, sub, owner string, epoch uint64, leasesInTable bool) error
	Owners(ctx context.Context) ([]store.OwnerRecord, error)
	Beat(ctx context.Context, router, addr string, within time.Duration) ([]store.Member, time.Time, error)
	LeaveMembers(ctx context.Context, router string, older time.Duration) error
}

var _ Store = (*store.Store)(nil)

// Cluster is one cluster's call point: every Store call goes through Do,
// which carries the cluster's breaker and metrics in the router. op names
// the operation.
type Cluster interface {
	Do(ctx context.Context, op string, fn func(ctx context.Context, s Store) error) error
}

// The operations a Cluster is told about.
const (
	OpScan    = "owner_scan"
	OpBodies  = "owner_bodies"
	OpClaim   = "owner_claim"
	OpFlush   = "owner_flush"
	OpOwners  = "owner_lease"
	OpMembers = "router_members"
)

// Config tunes a Manager. Zero fields take the defaults named.
type Config struct {
	// Router names this router instance in delivery_owner and
	// router_member. Defaults to a random name: a restarted router is a
	// new instance that knows nothing of its predecessor's memory.
	Router string
	// Addr is where other routers reach this one to forward calls for
	// the units it owns (host:port). Empty: this router serves alone and
	// owns every unit it is asked about.
	Addr string
	// LeaseTTL is how long an owner's lease on its units lasts without a
	// renewal; after it another router may take them. Defaults to 10s.
	LeaseTTL time.Duration
	// RenewEvery is how often leases are renewed and members seen.
	// Defaults to 1s.
	RenewEvery time.Duration
	// Margin is the safety kept against clock drift and pauses between a
	// router and its clusters. Defaults to 1s.
	Margin time.Duration
	// MaxInFlight caps the leases this router holds in memory, over all
	// units; past it a claim hands out fewer (first attempts) and says so
	// in a metric. Defaults to 1,000,000 (about 230 MiB; docs/consume.md).
	MaxInFlight int
	// ExpireEvery is how often expired leases are looked for. Defaults to
	// 100ms.
	ExpireEvery time.Duration
	// TopScanEvery is how often a unit's scan starts again from the head
	// of its claim order instead of its cursor, to see deliveries that
	// became claimable behind it (delays, retries, higher priorities).
	// Defaults to 100ms.
	TopScanEvery time.Duration
	// MaxScan caps the rows one scan reads. Defaults to 5000.
	MaxScan int
	// LiveWindow is how long a router not seen stays a member. Defaults
	// to 5s.
	LiveWindow time.Duration
	// HandOverAfter is how long a router must have been a member before
	// units move to it. Defaults to 3s.
	HandOverAfter time.Duration
	// Flush tunes each cluster's flushes (batch.Config; MaxBytes counts
	// outcomes). Defaults to 2000 outcomes per flush, one in flight.
	Flush batch.Config
	// Bodies, when not nil, keeps the messages this router produced so
	// that handing them out reads nothing back (see Bodies).
	Bodies *Bodies
	// MapVersion is the version of the shard map in use. A flush is
	// fenced (store.WithFence) with the oldest map among its items: a
	// request's outcomes carry the map the request was routed with (its
	// context's fence), the rest (expiries, parking, write-outs) this.
	// Nil: those are not fenced.
	MapVersion func() int64
}

func (c Config) withDefaults() Config {
	if c.Router == "" {
		var b [8]byte
		rand.Read(b[:])
		c.Router = "r-" + hex.EncodeToString(b[:])
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.LeaseTTL, 10*time.Second)
	def(&c.RenewEvery, time.Second)
	def(&c.Margin, time.Second)
	def(&c.ExpireEvery, 100*time.Millisecond)
	def(&c.TopScanEvery, 100*time.Millisecond)
	def(&c.LiveWindow, 5*time.Second)
	def(&c.HandOverAfter, 3*time.Second)
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 1_000_000
	}
	if c.MaxScan <= 0 {
		c.MaxScan = 5000
	}
	if c.Flush.MaxBytes <= 0 {
		c.Flush.MaxBytes = 2000
	}
	if c.Flush.InFlight <= 0 {
		// One: two in flight made each flush half as big and cost the
		// servers 50 % more per consumed message (bench-consume, 1 Dec
		// 2026: 187 against 124 µs; 6,243 against 8,071 messages/s).
		c.Flush.InFlight = 1
	}
	return c
}

// Manager is a router's owners: it takes units, renews and hands them
// over, spreads them over the live routers, and says where each unit's
// state lives. Safe for concurrent use.
type Manager struct {
	cfg Config
	now func() time.Time
	log *slog.Logger

	mu       sync.Mutex
	clusters map[string]*clusterState

	inflight atomic.Int64
	refused  atomic.Int64
	// aside is set while the router may not serve delivery state (it
	// fenced itself: its registration among the live routers lapsed):
	// it hands its units over, stops being a member and takes none.
	aside atomic.Bool

	stop    chan struct{}
	done    chan struct{}
	started bool
	stopped bool
}

// New returns a manager; Start runs its upkeep.
func New(cfg Config, now func() time.Time, log *slog.Logger) *Manager {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{cfg: cfg.withDefaults(), now: now, log: log, clusters: map[string]*clusterState{}, stop: make(chan struct{}), done: make(chan struct{})}
	return m
}

// Remember keeps msgs, just committed as new messages, for the owners'
// claims (Config.Bodies; nothing without it). The caller must not modify
// them afterwards.
func (m *Manager) Remember(msgs []*store.Message) { m.cfg.Bodies.Remember(msgs) }

// BodiesStats reads the body cache's figures.
func (m *Manager) BodiesStats() BodiesStats { return m.cfg.Bodies.Stats() }

// Router is this router's instance name.
func (m *Manager) Router() string { return m.cfg.Router }

// Addr is where other routers reach this one ("" when alone).
func (m *Manager) Addr() string { return m.cfg.Addr }

// clusterState is one cluster as the manager sees it.
type clusterState struct {
	m       *Manager
	name    string
	conn    Cluster
	flusher *batch.Batcher[flushItem, flushAnswer]

	acquiring sync.Mutex // one acquisition at a time (a second would bump the epoch)

	mu          sync.Mutex
	owners      map[[2]string]*Owner
	records     map[[2]string]store.OwnerRecord
	members     []store.Member
	memberSince map[string]time.Time
	renewedAt   time.Time     // router clock, taken before the last renewal was sent
	horizonLen  time.Duration // the horizon it recorded, from renewedAt
	validUntil  time.Time     // router clock: this router's leases on the cluster's units hold until then
	renewal     chan struct{} // closed when the renewal under way ends
	renewErr    error
	// asked is the longest lease asked for since the last renewal (ns):
	// the next horizon covers one that long handed out until the renewal
	// after it.
	asked atomic.Int64
	// latency is how long renewals took lately (the horizon is measured
	// from before a renewal is sent, so a slow one covers less).
	latency time.Duration
	// unreleased are units handed over whose release failed, with whether
	// their leases reached the table. A renewal renews every lease row
	// that names this router, so until such a release lands each renewal
	// would keep alive a unit nobody serves: it is retried before every
	// renewal.
	unreleased map[store.OwnedUnit]bool
	// ackSlots is what the last beat said of the members (every one reads
	// the final ack's slot), to log its changes.
	ackSlots atomic.Bool
}

// SetClusters follows the topology: a cluster that left or whose call
// point changed loses its owners here (their leases lapse into the
// table's hands: the next owner waits for their horizon).
func (m *Manager) SetClusters(clusters map[string]Cluster) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, cl := range m.clusters {
		if c, ok := clusters[name]; !ok || c != cl.conn {
			delete(m.clusters, name)
			go cl.close(m)
		}
	}
	for name, c := range clusters {
		if _, ok := m.clusters[name]; ok {
			continue
		}
		cl := &clusterState{m: m, name: name, conn: c, owners: map[[2]string]*Owner{}, records: map[[2]string]store.OwnerRecord{},
			memberSince: map[string]time.Time{}, unreleased: map[store.OwnedUnit]bool{}}
		cl.ackSlots.Store(true)
		cl.flusher = batch.New(m.cfg.Flush, cl.runFlush, flushItem.ops)
		m.clusters[name] = cl
	}
}

func (cl *clusterState) close(m *Manager) {
	cl.mu.Lock()
	owners := make([]*Owner, 0, len(cl.owners))
	for _, o := range cl.owners {
		owners = append(owners, o)
	}
	cl.mu.Unlock()
	for _, o := range owners {
		m.lose(o)
	}
	cl.flusher.Stop()
}

func (m *Manager) cluster(name string) (*clusterState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cl, ok := m.clusters[name]
	if !ok || m.stopped {
		return nil, fmt.Errorf("%w: cluster %s is not connected", domain.ErrUnavailable, name)
	}
	return cl, nil
}

// leaseValid says whether this router's leases on the cluster's units
// still hold at now (it hands nothing out past them).
func (cl *clusterState) leaseValid(now time.Time) bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return now.Before(cl.validUntil)
}

// coverHorizon makes sure a lease of d handed out now ends before the
// horizon recorded for the cluster's units, renewing at once when it
// would not. The horizon covers the leases held and the longest lease
// asked for since the last renewal, so it shrinks back when long leases
// stop being asked for, and a takeover after a crash waits no longer
// than the crashed router's longest lease (plus RenewEvery and margins).
func (cl *clusterState) coverHorizon(ctx context.Context, now time.Time, d time.Duration) error {
	for {
		a := cl.asked.Load()
		if a >= int64(d) || cl.asked.CompareAndSwap(a, int64(d)) {
			break
		}
	}
	for range 3 {
		cl.mu.Lock()
		covered := cl.renewedAt.Add(cl.horizonLen - cl.m.cfg.Margin)
		cl.mu.Unlock()
		if !now.Add(d).After(covered) {
			return nil
		}
		if err := cl.renewNow(ctx); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: cannot record a horizon for a lease of %v on cluster %s", domain.ErrUnavailable, d, cl.name)
}

// outstanding is how long the longest lease held in memory on the
// cluster still runs from now.
func (cl *clusterState) outstanding(now time.Time) time.Duration {
	cl.mu.Lock()
	owners := make([]*Owner, 0, len(cl.owners))
	for _, o := range cl.owners {
		owners = append(owners, o)
	}
	cl.mu.Unlock()
	var out time.Duration
	for _, o := range owners {
		o.mu.Lock()
		for _, l := range o.leases {
			out = max(out, l.expires.Sub(now))
		}
		o.mu.Unlock()
	}
	return out
}

// renewNow renews the cluster's units (or waits for the renewal under
// way) and returns its error.
func (cl *clusterState) renewNow(ctx context.Context) error {
	cl.mu.Lock()
	if ch := cl.renewal; ch != nil {
		cl.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		cl.mu.Lock()
		err := cl.renewErr
		cl.mu.Unlock()
		return err
	}
	ch := make(chan struct{})
	cl.renewal = ch
	cl.mu.Unlock()
	err := cl.renew(ctx)
	cl.mu.Lock()
	cl.renewal, cl.renewErr = nil, err
	cl.mu.Unlock()
	close(ch)
	return err
}

// renew extends this router's leases on the cluster's units and their
// horizon (covering leases handed out until the next renewal), and loses
// the units another router took meanwhile.
func (cl *clusterState) renew(ctx context.Context) error {
	m := cl.m
	before := m.now()
	cl.mu.Lock()
	slack := 2 * cl.latency
	cl.mu.Unlock()
	hlen := max(cl.outstanding(before), time.Duration(cl.asked.Swap(0))) + m.cfg.RenewEvery + 2*m.cfg.Margin + slack
	cl.releaseLeftovers(ctx) // before the renewal, which would renew them too
	var held []store.OwnedUnit
	err := cl.conn.Do(ctx, OpOwners, func(ctx context.Context, s Store) (err error) {
		held, _, err = s.RenewOwners(ctx, m.cfg.Router, m.cfg.LeaseTTL, hlen)
		return err
	})
	if err != nil {
		return err
	}
	holds := map[store.OwnedUnit]bool{}
	for _, u := range held {
		holds[u] = true
	}
	cl.releaseOrphans(ctx, held)
	cl.mu.Lock()
	cl.renewedAt, cl.horizonLen = before, hlen
	cl.validUntil = before.Add(m.cfg.LeaseTTL - m.cfg.Margin)
	cl.latency = max(m.now().Sub(before), cl.latency/2)
	var gone []*Owner
	for _, o := range cl.owners {
		if !holds[o.storeUnit()] {
			gone = append(gone, o)
		}
	}
	cl.mu.Unlock()
	for _, o := range gone {
		m.log.Warn("delivery owner: unit taken over by another router; its leases in memory are dropped", "unit", o.unit.String(), "epoch", o.Epoch())
		m.lose(o)
	}
	return nil
}

// lose forgets an owner whose unit this router no longer holds: its
// leases are dropped (their receipts are answered lease_lost).
func (m *Manager) lose(o *Owner) {
	o.mu.Lock()
	if o.lost {
		o.mu.Unlock()
		return
	}
	o.lost = true
	n := len(o.leases)
	var wake []chan struct{}
	for _, l := range o.leases {
		if l.finishing != nil {
			wake = append(wake, l.finishing)
			l.finishing = nil
		}
	}
	o.leases, o.reserved, o.keys, o.expiry = map[uint64]*lease{}, map[uint64]bool{}, map[string]int{}, nil
	o.mu.Unlock()
	m.unadmit(n)
	for _, ch := range wake {
		close(ch)
	}
	cl := o.cl
	cl.mu.Lock()
	k := [2]string{o.unit.Topic, o.unit.Subscription}
	if cl.owners[k] == o {
		delete(cl.owners, k)
		if r, ok := cl.records[k]; ok && r.Owner == m.cfg.Router {
			r.Live = false
			cl.records[k] = r
		}
	}
	cl.mu.Unlock()
}

// admit counts n leases about to be held in memory against the cap and
// answers how many may be.
func (m *Manager) admit(n int) int {
	for {
		cur := m.inflight.Load()
		room := int64(m.cfg.MaxInFlight) - cur
		k := min(int64(n), max(room, 0))
		if m.inflight.CompareAndSwap(cur, cur+k) {
			if int(k) < n {
				m.refused.Add(int64(n) - k)
			}
			return int(k)
		}
	}
}

func (m *Manager) unadmit(n int) { m.inflight.Add(-int64(n)) }

// InFlight is how many leases this router holds in memory, and how many
// first attempts the cap kept it from handing out so far.
func (m *Manager) InFlight() (held, refused int64) { return m.inflight.Load(), m.refused.Load() }

// SetAside steps this router aside from delivery state while it may not
// serve it (a router that fenced itself: cut off from the registry of
// live routers, it still reaches the clusters). Until SetAside(false) its
// upkeep hands every unit it owns over (leases written to the table, the
// unit released), leaves the members so that the other routers choose
// among themselves and take the units at once, and it takes no unit.
// Without it a fenced router kept its units for as long as the cut
// lasted, refusing every claim of them while its membership, renewed in
// the clusters, kept the others from taking them.
func (m *Manager) SetAside(aside bool) {
	if m.aside.Swap(aside) != aside {
		if aside {
			m.log.Warn("delivery owner: stepping aside (router fenced): handing every unit over and leaving the members")
		} else {
			m.log.Info("delivery owner: serving again; units come back as the members choose")
		}
	}
}

// Route says where unit u's delivery state lives: owner is this router's
// owner of it, or addr the router that owns it. With take, a unit that
// no live router owns and that belongs here (the live routers' choice
// for it is this one) is taken now. epoch, when not 0, is the epoch a
// receipt was handed out under: a cached record older than it is read
// again.
func (m *Manager) Route(ctx context.Context, u Unit, take bool, epoch uint64) (owner *Owner, addr string, err error) {
	cl, err := m.cluster(u.Cluster)
	if err != nil {
		return nil, "", err
	}
	k := [2]string{u.Topic, u.Subscription}
	for attempt := 0; attempt < 2; attempt++ {
		cl.mu.Lock()
		o := cl.owners[k]
		rec, known := cl.records[k]
		cl.mu.Unlock()
		if o != nil {
			return o, "", nil
		}
		// A record naming this router's own address under another name is
		// an earlier process here, dead: it is taken, not forwarded to.
		mine := m.cfg.Addr != "" && rec.Addr == m.cfg.Addr
		if known && rec.Live && rec.Owner != m.cfg.Router && !mine && (epoch == 0 || rec.Epoch >= epoch) {
			if rec.Addr == "" {
				// Its leases are in a memory no other router reaches: the
				// table does not know them, so "lease lost" would be false.
				return nil, "", fmt.Errorf("%w: %s is owned by router %s, which cannot be reached", domain.ErrUnavailable, u, rec.Owner)
			}
			return nil, rec.Addr, nil
		}
		if attempt == 0 && m.cfg.Addr != "" && (!known || (epoch != 0 && rec.Epoch < epoch)) {
			if err := cl.readRecords(ctx); err != nil {
				return nil, "", err
			}
			continue
		}
		break
	}
	if !take {
		return nil, "", nil
	}
	if m.aside.Load() {
		return nil, "", fmt.Errorf("%w: this router is fenced and takes no unit (%s)", domain.ErrUnavailable, u)
	}
	if want := cl.choose(u, false); want != nil && want.Router != m.cfg.Router {
		return nil, want.Addr, nil
	}
	return m.acquire(ctx, cl, u)
}

// acquire takes u for this router.
func (m *Manager) acquire(ctx context.Context, cl *clusterState, u Unit) (*Owner, string, error) {
	k := [2]string{u.Topic, u.Subscription}
	cl.acquiring.Lock()
	defer cl.acquiring.Unlock()
	cl.mu.Lock()
	o := cl.owners[k]
	cl.mu.Unlock()
	if o != nil {
		return o, "", nil // taken meanwhile by a concurrent call
	}
	before := m.now()
	var g store.OwnerGrant
	var rec store.OwnerRecord
	err := cl.conn.Do(ctx, OpOwners, func(ctx context.Context, s Store) (err error) {
		g, rec, err = s.AcquireOwner(ctx, u.Topic, u.Subscription, m.cfg.Router, m.cfg.Addr, m.cfg.LeaseTTL)
		return err
	})
	if errors.Is(err, store.ErrOwned) {
		cl.mu.Lock()
		cl.records[k] = rec
		cl.mu.Unlock()
		if rec.Addr == "" || m.cfg.Addr == "" {
			return nil, "", fmt.Errorf("%w: %s is owned by router %s, which cannot be reached", domain.ErrUnavailable, u, rec.Owner)
		}
		return nil, rec.Addr, nil
	}
	if err != nil {
		return nil, "", err
	}
	// The previous owner's horizon in this router's clock.
	wait := before.Add(g.WaitUntil.Sub(g.ServerNow))
	cl.mu.Lock()
	o = newOwner(m, cl, u, g.Epoch, wait)
	cl.owners[k] = o
	cl.records[k] = store.OwnerRecord{Topic: u.Topic, Subscription: u.Subscription, Owner: m.cfg.Router, Addr: m.cfg.Addr, Epoch: g.Epoch, Live: true}
	if v := before.Add(m.cfg.LeaseTTL - m.cfg.Margin); v.After(cl.validUntil) {
		cl.validUntil = v
	}
	cl.mu.Unlock()
	if wait.After(before) {
		m.log.Info("delivery owner: unit taken; its previous owner's leases may run until its horizon, nothing is handed out before",
			"unit", u.String(), "epoch", g.Epoch, "wait", wait.Sub(before).Round(time.Millisecond))
	}
	// Record a horizon for this router's leases before handing any out.
	if err := cl.renewNow(ctx); err != nil {
		m.log.Warn("delivery owner: first renewal failed", "unit", u.String(), "err", err)
	}
	return o, "", nil
}

// readRecords reloads the cluster's delivery_owner records.
func (cl *clusterState) readRecords(ctx context.Context) error {
	var recs []store.OwnerRecord
	err := cl.conn.Do(ctx, OpOwners, func(ctx context.Context, s Store) (err error) {
		recs, err = s.Owners(ctx)
		return err
	})
	if err != nil {
		return err
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.records = make(map[[2]string]store.OwnerRecord, len(recs))
	for _, r := range recs {
		cl.records[[2]string{r.Topic, r.Subscription}] = r
	}
	return nil
}

// choose is the live router u belongs to (highest random weight over the
// members, so each unit moves only when its own choice joins or leaves);
// stable counts only routers seen for HandOverAfter. nil when no member
// is known (this router serves alone).
func (cl *clusterState) choose(u Unit, stable bool) *store.Member {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.m.cfg.Addr == "" {
		return nil
	}
	now := cl.m.now()
	var best *store.Member
	var bestW uint64
	for i := range cl.members {
		mb := &cl.members[i]
		if mb.Router != cl.m.cfg.Router && mb.Addr == cl.m.cfg.Addr {
			continue // an earlier process at this router's address: dead
		}
		if stable && mb.Router != cl.m.cfg.Router && now.Sub(cl.memberSince[mb.Router]) < cl.m.cfg.HandOverAfter {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(mb.Router))
		h.Write([]byte{0})
		h.Write([]byte(u.String()))
		if w := h.Sum64(); best == nil || w > bestW {
			best, bestW = mb, w
		}
	}
	return best
}

// Owners lists this router's owners on cluster (all clusters when "").
func (m *Manager) Owners(cluster string) []*Owner {
	m.mu.Lock()
	cls := make([]*clusterState, 0, len(m.clusters))
	for name, cl := range m.clusters {
		if cluster == "" || name == cluster {
			cls = append(cls, cl)
		}
	}
	m.mu.Unlock()
	var out []*Owner
	for _, cl := range cls {
		cl.mu.Lock()
		for _, o := range cl.owners {
			out = append(out, o)
		}
		cl.mu.Unlock()
	}
	return out
}

// WriteOut writes into the table, as durable leases, every lease held in
// memory on cluster whose vshard match says, and waits until they are
// written: before a resharding cut-over copies those vshards' rows. An
// owner that cannot is lost (its leases' horizon still fences them).
func (m *Manager) WriteOut(ctx context.Context, cluster string, match func(vshard uint16) bool) error {
	var errs []error
	for _, o := range m.Owners(cluster) {
		if err := o.writeOut(ctx, func(l *lease) bool { return match(l.c.VShard) }); err != nil && !errors.Is(err, ErrNotOwner) {
			errs = append(errs, fmt.Errorf("%s: %w", o.unit, err))
		}
	}
	return errors.Join(errs...)
}

// Start runs the upkeep: membership, renewals, hand-overs and expiries.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.stopped {
		return nil
	}
	m.started = true
	go m.run()
	return nil
}

// Stop hands every unit over (its leases written to the table, so the
// next owner starts at once), leaves the members, and stops the upkeep
// and the flushers. Safe to call twice.
func (m *Manager) Stop() {
	if !m.halt() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, o := range m.Owners("") {
		m.handOver(ctx, o)
	}
	m.mu.Lock()
	cls := make([]*clusterState, 0, len(m.clusters))
	for _, cl := range m.clusters {
		cls = append(cls, cl)
	}
	m.mu.Unlock()
	for _, cl := range cls {
		if m.cfg.Addr != "" {
			cl.conn.Do(ctx, OpMembers, func(ctx context.Context, s Store) error {
				return s.LeaveMembers(ctx, m.cfg.Router, time.Hour)
			})
		}
		cl.flusher.Stop()
	}
}

// halt stops the upkeep; false when it was stopped already.
func (m *Manager) halt() bool {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return false
	}
	m.stopped = true
	started := m.started
	m.mu.Unlock()
	close(m.stop)
	if started {
		<-m.done
	}
	return true
}

// Abandon stops the manager as a crash would: no lease is written, no
// unit released, nothing renewed; the units pass to another router when
// their lease runs out, after their horizon. For tests that kill a
// router; Stop is the orderly way.
func (m *Manager) Abandon() {
	if !m.halt() {
		return
	}
	for _, o := range m.Owners("") {
		o.mu.Lock()
		o.lost = true
		o.mu.Unlock()
	}
}

func (m *Manager) run() {
	defer close(m.done)
	renew := time.NewTicker(m.cfg.RenewEvery)
	defer renew.Stop()
	expire := time.NewTicker(m.cfg.ExpireEvery)
	defer expire.Stop()
	m.upkeep()
	for {
		select {
		case <-m.stop:
			return
		case <-expire.C:
			now := m.now()
			for _, o := range m.Owners("") {
				o.expire(now)
			}
		case <-renew.C:
			m.upkeep()
		}
	}
}

// upkeep runs one round on every cluster: be seen, renew, read who owns
// what, and hand over the units that belong to another router now.
func (m *Manager) upkeep() {
	m.mu.Lock()
	cls := make([]*clusterState, 0, len(m.clusters))
	for _, cl := range m.clusters {
		cls = append(cls, cl)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, cl := range cls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), m.cfg.LeaseTTL/2)
			defer cancel()
			if err := cl.upkeep(ctx); err != nil {
				m.log.Warn("delivery owner upkeep failed; leases stop being handed out when they run out", "cluster", cl.name, "err", err)
			}
		})
	}
	wg.Wait()
}

func (cl *clusterState) upkeep(ctx context.Context) error {
	m := cl.m
	if m.aside.Load() {
		return cl.stepAside(ctx)
	}
	if m.cfg.Addr != "" {
		var members []store.Member
		err := cl.conn.Do(ctx, OpMembers, func(ctx context.Context, s Store) (err error) {
			members, _, err = s.Beat(ctx, m.cfg.Router, m.cfg.Addr, m.cfg.LiveWindow)
			return err
		})
		if err != nil {
			return err
		}
		now := m.now()
		if slots := store.AckSlotsReadBy(members); slots != cl.ackSlots.Swap(slots) {
			if slots {
				m.log.Info("delivery owner: every member reads the final ack's slot; final acks are written into it again", "cluster", cl.name)
			} else {
				m.log.Warn("delivery owner: a router of an older version is a member; final acks are written into the message row's columns, not its slot, until it leaves", "cluster", cl.name)
			}
		}
		cl.mu.Lock()
		cl.members = members
		seen := map[string]bool{}
		for _, mb := range members {
			seen[mb.Router] = true
			if _, ok := cl.memberSince[mb.Router]; !ok {
				cl.memberSince[mb.Router] = now
			}
		}
		for r := range cl.memberSince {
			if !seen[r] {
				delete(cl.memberSince, r)
			}
		}
		cl.mu.Unlock()
	}
	cl.mu.Lock()
	idle := len(cl.owners) == 0
	cl.mu.Unlock()
	if m.cfg.Addr == "" {
		if idle {
			return nil // alone and owning nothing here: nothing to renew
		}
		return cl.renewNow(ctx)
	}
	if err := cl.renewNow(ctx); err != nil {
		return err
	}
	if err := cl.readRecords(ctx); err != nil {
		return err
	}
	cl.mu.Lock()
	var move []*Owner
	for _, o := range cl.owners {
		move = append(move, o)
	}
	cl.mu.Unlock()
	for _, o := range move {
		if want := cl.choose(o.unit, true); want != nil && want.Router != m.cfg.Router && !o.handingOver() {
			m.log.Info("delivery owner: handing unit over to the router it belongs to", "unit", o.unit.String(), "to", want.Router)
			go m.handOver(context.Background(), o)
		}
	}
	return nil
}

// stepAside is the upkeep of a router set aside: every unit handed over,
// out of the members (the others stop choosing it at their next beat),
// nothing renewed but what a failed hand-over still holds.
func (cl *clusterState) stepAside(ctx context.Context) error {
	m := cl.m
	for _, o := range m.Owners(cl.name) {
		m.handOver(ctx, o)
	}
	cl.releaseLeftovers(ctx)
	if m.cfg.Addr != "" {
		cl.mu.Lock()
		cl.members = nil
		cl.mu.Unlock()
		if err := cl.conn.Do(ctx, OpMembers, func(ctx context.Context, s Store) error {
			return s.LeaveMembers(ctx, m.cfg.Router, time.Hour)
		}); err != nil {
			return err
		}
	}
	return nil
}

// handOver gives a unit up: nothing new is handed out, every lease in
// memory is written to the table, and the unit is released with its
// horizon ended, so that the next owner starts at once. When the leases
// cannot be written the release keeps the horizon.
func (m *Manager) handOver(ctx context.Context, o *Owner) {
	o.mu.Lock()
	if o.lost || o.releasing {
		o.mu.Unlock()
		return
	}
	o.releasing = true
	o.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := o.writeOut(wctx, nil)
	cancel()
	if errors.Is(err, ErrNotOwner) {
		return
	}
	if err != nil {
		m.log.Warn("delivery owner: leases not written before the hand-over; the next owner waits for their horizon", "unit", o.unit.String(), "err", err)
	}
	// The release has a deadline of its own: a write-out that used all of
	// its time must not make the release fail too.
	u, written := o.storeUnit(), err == nil
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	rerr := o.cl.release(rctx, u, written)
	rcancel()
	if rerr != nil {
		m.log.Warn("delivery owner: release failed; retried before each renewal, else the unit passes on when its lease runs out", "unit", o.unit.String(), "err", rerr)
		o.cl.mu.Lock()
		o.cl.unreleased[u] = written
		o.cl.mu.Unlock()
	}
	m.lose(o)
}

// release ends this router's lease on unit u (its epoch), and its horizon
// when its leases reached the table.
func (cl *clusterState) release(ctx context.Context, u store.OwnedUnit, leasesInTable bool) error {
	return cl.conn.Do(ctx, OpOwners, func(ctx context.Context, s Store) error {
		return s.ReleaseOwner(ctx, u.Topic, u.Subscription, cl.m.cfg.Router, u.Epoch, leasesInTable)
	})
}

// releaseOrphans releases the units whose lease names this router but
// which it does not serve (dropped from memory without a release: a
// cluster whose call point changed, say): the renewal that just ran
// renewed them, and it would go on renewing them while nobody serves
// them. An acquisition under way has written its row before it records
// its owner, so orphans are only judged when none is (else next time).
func (cl *clusterState) releaseOrphans(ctx context.Context, held []store.OwnedUnit) {
	if !cl.acquiring.TryLock() {
		return
	}
	defer cl.acquiring.Unlock()
	cl.mu.Lock()
	var orphans []store.OwnedUnit
	for _, u := range held {
		if cl.owners[[2]string{u.Topic, u.Subscription}] == nil {
			orphans = append(orphans, u)
		}
	}
	cl.mu.Unlock()
	for _, u := range orphans {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := cl.release(rctx, u, false) // its leases may be anywhere: the next owner waits for the horizon
		cancel()
		if err != nil {
			cl.m.log.Warn("delivery owner: release of a unit renewed but not served failed", "unit", cl.name+"/"+u.Topic+"/"+u.Subscription, "err", err)
			continue
		}
		cl.m.log.Info("delivery owner: released a unit renewed but not served", "unit", cl.name+"/"+u.Topic+"/"+u.Subscription, "epoch", u.Epoch)
	}
}

// releaseLeftovers retries the releases that failed (unreleased); a unit
// that changed hands or epoch meanwhile is left alone by ReleaseOwner. One
// that fails again is tried at the next renewal: the renewal goes on, as
// the units this router serves must not lapse for it.
func (cl *clusterState) releaseLeftovers(ctx context.Context) {
	cl.mu.Lock()
	left := maps.Clone(cl.unreleased)
	cl.mu.Unlock()
	for u, written := range left {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		err := cl.release(rctx, u, written)
		cancel()
		if err != nil {
			cl.m.log.Warn("delivery owner: release of a unit handed over failed again", "unit", cl.name+"/"+u.Topic+"/"+u.Subscription, "err", err)
			continue
		}
		cl.mu.Lock()
		delete(cl.unreleased, u)
		cl.mu.Unlock()
	}
}

// ClusterStats is what this router's owners hold and wrote on a cluster.
type ClusterStats struct {
	Units, Leases     int
	Flushes, Outcomes int64 // flush transactions run, and the outcomes they carried
}

// Stats reports, per cluster, the units this router owns, the leases it
// holds in memory and its flushes so far.
func (m *Manager) Stats() map[string]ClusterStats {
	m.mu.Lock()
	cls := make(map[string]*clusterState, len(m.clusters))
	for name, cl := range m.clusters {
		cls[name] = cl
	}
	m.mu.Unlock()
	out := make(map[string]ClusterStats, len(cls))
	for name, cl := range cls {
		var st ClusterStats
		st.Flushes, st.Outcomes = cl.flusher.Stats()
		cl.mu.Lock()
		owners := make([]*Owner, 0, len(cl.owners))
		for _, o := range cl.owners {
			owners = append(owners, o)
		}
		cl.mu.Unlock()
		st.Units = len(owners)
		for _, o := range owners {
			st.Leases += o.InFlight()
		}
		out[name] = st
	}
	return out
}
