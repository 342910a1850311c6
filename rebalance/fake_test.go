package rebalance

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// The fakes of the state machine's collaborators: a cluster's primary
// (Mover) and the topology backend (ShardMaps) in memory, and the jobs'
// document (memDoc, state_test.go). A job over them runs the real
// state machine with no database; the statements themselves are tested on
// MariaDB in store, the whole flow in server.

// fakeCluster is a cluster's primary as a job uses it: the rows of the
// tables that move (laid out as store.MoveTables describes them), its
// vshard_owner record and its fence. Every operation first calls inject,
// when set, with its name and table ("" for none): an error it returns is
// the operation's, before it does anything. Calls of inject are
// serialized (a job syncs tables concurrently); inject may call c.
type fakeCluster struct {
	name string

	mu     sync.Mutex
	tables map[string]map[string]store.MoveRow // table → key text → row
	owners map[int]store.VShardOwner
	fence  int64
	calls  map[string]int
	inject func(op, table string) error

	injectMu sync.Mutex // held while inject runs
}

var _ Mover = (*fakeCluster)(nil)

func newFakeCluster(name string) *fakeCluster {
	return &fakeCluster{name: name, tables: map[string]map[string]store.MoveRow{}, owners: map[int]store.VShardOwner{}, calls: map[string]int{}}
}

// begin locks c and counts op; the error is inject's.
func (c *fakeCluster) begin(op, table string) error {
	c.mu.Lock()
	c.calls[op]++
	inject := c.inject
	c.mu.Unlock()
	if inject != nil {
		c.injectMu.Lock()
		err := inject(op, table)
		c.injectMu.Unlock()
		if err != nil {
			return err
		}
	}
	c.mu.Lock()
	return nil
}

func (c *fakeCluster) setInject(fn func(op, table string) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inject = fn
}

func (c *fakeCluster) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

func tableInfo(table string) store.MoveTableInfo {
	for _, t := range store.MoveTables() {
		if t.Name == table {
			return t
		}
	}
	panic("unknown table " + table)
}

func colOf(table, col string) int {
	i := slices.Index(tableInfo(table).Columns, col)
	if i < 0 {
		panic(table + " has no column " + col)
	}
	return i
}

func asUint(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case int64:
		return uint64(x)
	case int:
		return uint64(x)
	}
	panic(fmt.Sprintf("not a number: %T", v))
}

func keyText(table string, row store.MoveRow) string {
	k, err := store.MoveKeyOf(table, row)
	if err != nil {
		panic(err)
	}
	return store.MoveKeyText(k)
}

// rowText fingerprints a row: every column.
func rowText(row store.MoveRow) string {
	parts := make([]string, len(row))
	for i, v := range row {
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, "\x1f")
}

func bucketOf(table string, row store.MoveRow) uint64 {
	return asUint(row[colOf(table, tableInfo(table).BucketBy)]) >> 32
}

// rows returns table's rows of vs, in key order (called with c.mu held).
func (c *fakeCluster) rows(table string, vs []uint16) []store.MoveRow {
	in := map[uint64]bool{}
	for _, v := range vs {
		in[uint64(v)] = true
	}
	vcol := colOf(table, "vshard")
	var out []store.MoveRow
	for _, r := range c.tables[table] {
		if in[asUint(r[vcol])] {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(a, b int) bool { return keyText(table, out[a]) < keyText(table, out[b]) })
	return out
}

// checkOwner honours the store.OwnerCheck ctx carries, as the store's
// writes do (called with c.mu held).
func (c *fakeCluster) checkOwner(ctx context.Context) error {
	oc, ok := store.OwnerCheckFrom(ctx)
	if !ok {
		return nil
	}
	for _, v := range oc.VShards {
		o, ok := c.owners[int(v)]
		if !ok || o.Cluster != oc.Cluster || o.MapVersion < oc.MinVersion {
			return fmt.Errorf("%w: vshard %d on %s", store.ErrNotOwnerRecord, v, c.name)
		}
	}
	return nil
}

func (c *fakeCluster) MoveCount(_ context.Context, table string, vs []uint16) (int64, error) {
	if err := c.begin("MoveCount", table); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	return int64(len(c.rows(table, vs))), nil
}

func (c *fakeCluster) read(op, table string, vs []uint16, after store.MoveCursor, limit int, keysOnly bool) ([]store.MoveRow, store.MoveCursor, error) {
	if err := c.begin(op, table); err != nil {
		return nil, nil, err
	}
	defer c.mu.Unlock()
	from := strings.Join(after, "\x00")
	var out []store.MoveRow
	cur := after
	for _, r := range c.rows(table, vs) {
		kt := keyText(table, r)
		if len(after) > 0 && kt <= from {
			continue
		}
		if len(out) == limit {
			break
		}
		if keysOnly {
			k, _ := store.MoveKeyOf(table, r)
			r = k
		}
		out = append(out, slices.Clone(r))
		cur = strings.Split(kt, "\x00")
	}
	return out, cur, nil
}

func (c *fakeCluster) MoveRead(_ context.Context, table string, vs []uint16, after store.MoveCursor, limit int) ([]store.MoveRow, store.MoveCursor, error) {
	return c.read("MoveRead", table, vs, after, limit, false)
}

func (c *fakeCluster) MoveReadKeys(_ context.Context, table string, vs []uint16, after store.MoveCursor, limit int) ([]store.MoveRow, store.MoveCursor, error) {
	return c.read("MoveReadKeys", table, vs, after, limit, true)
}

func (c *fakeCluster) MoveWrite(ctx context.Context, table string, rows []store.MoveRow) error {
	if err := c.begin("MoveWrite", table); err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.checkOwner(ctx); err != nil {
		return err
	}
	for _, r := range rows {
		c.put(table, r)
	}
	return nil
}

// put upserts a row (called with c.mu held).
func (c *fakeCluster) put(table string, r store.MoveRow) {
	if c.tables[table] == nil {
		c.tables[table] = map[string]store.MoveRow{}
	}
	c.tables[table][keyText(table, r)] = slices.Clone(r)
}

func (c *fakeCluster) MoveDelete(ctx context.Context, table string, keys []store.MoveRow) (int64, error) {
	if err := c.begin("MoveDelete", table); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	if err := c.checkOwner(ctx); err != nil {
		return 0, err
	}
	var n int64
	for _, k := range keys {
		kt := store.MoveKeyText(k)
		if _, ok := c.tables[table][kt]; ok {
			delete(c.tables[table], kt)
			n++
		}
	}
	return n, nil
}

func (c *fakeCluster) MoveDeleteVShards(ctx context.Context, table string, vs []uint16, _ int) (int64, error) {
	if err := c.begin("MoveDeleteVShards", table); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	if err := c.checkOwner(ctx); err != nil {
		return 0, err
	}
	rows := c.rows(table, vs)
	for _, r := range rows {
		delete(c.tables[table], keyText(table, r))
	}
	return int64(len(rows)), nil
}

func (c *fakeCluster) MoveBuckets(_ context.Context, table string, vs []uint16) (map[uint64]store.MoveBucket, error) {
	if err := c.begin("MoveBuckets", table); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	sums := map[uint64]uint64{}
	out := map[uint64]store.MoveBucket{}
	for _, r := range c.rows(table, vs) {
		b := bucketOf(table, r)
		sums[b] += uint64(crc32.ChecksumIEEE([]byte(rowText(r))))
		out[b] = store.MoveBucket{Rows: out[b].Rows + 1, Sum: fmt.Sprint(sums[b])}
	}
	return out, nil
}

func (c *fakeCluster) MoveBucketRows(_ context.Context, table string, vs []uint16, bucket uint64, keysOnly bool) ([]store.MoveRow, error) {
	op := "MoveBucketRows"
	if keysOnly {
		op = "MoveBucketKeys"
	}
	if err := c.begin(op, table); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	var out []store.MoveRow
	for _, r := range c.rows(table, vs) {
		if bucketOf(table, r) != bucket {
			continue
		}
		sum := md5.Sum([]byte(rowText(r)))
		row := slices.Clone(r)
		if keysOnly {
			row, _ = store.MoveKeyOf(table, r)
		}
		out = append(out, append(row, []byte(hex.EncodeToString(sum[:]))))
	}
	return out, nil
}

func (c *fakeCluster) VShardLoads(context.Context, time.Time) (map[uint16]store.VShardLoad, error) {
	if err := c.begin("VShardLoads", ""); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	return map[uint16]store.VShardLoad{}, nil
}

func (c *fakeCluster) RaiseFence(_ context.Context, version int64, owners []store.VShardOwner, _ string, _ time.Time) error {
	if err := c.begin("RaiseFence", ""); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.fence = max(c.fence, version)
	c.record(owners)
	return nil
}

// record writes owners where newer (called with c.mu held).
func (c *fakeCluster) record(owners []store.VShardOwner) {
	for _, o := range owners {
		if cur, ok := c.owners[o.VShard]; !ok || o.MapVersion > cur.MapVersion {
			c.owners[o.VShard] = o
		}
	}
}

func (c *fakeCluster) RecordVShardOwners(_ context.Context, owners []store.VShardOwner, _ time.Time) error {
	if err := c.begin("RecordVShardOwners", ""); err != nil {
		return err
	}
	defer c.mu.Unlock()
	c.record(owners)
	return nil
}

func (c *fakeCluster) VShardOwners(context.Context) ([]store.VShardOwner, error) {
	if err := c.begin("VShardOwners", ""); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	out := make([]store.VShardOwner, 0, len(c.owners))
	for _, o := range c.owners {
		out = append(out, o)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].VShard < out[b].VShard })
	return out, nil
}

func (c *fakeCluster) EndStalledTransactions(context.Context, time.Duration) (int, error) {
	if err := c.begin("EndStalledTransactions", ""); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	return 0, nil
}

// snapshot returns table's rows of vs as key text → row text.
func (c *fakeCluster) snapshot(table string, vs []uint16) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for _, r := range c.rows(table, vs) {
		out[keyText(table, r)] = rowText(r)
	}
	return out
}

// setOwners overwrites the record of vs (an operator's restore, a later
// map).
func (c *fakeCluster) setOwners(vs []uint16, cluster string, version int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range vs {
		c.owners[int(v)] = store.VShardOwner{VShard: int(v), Cluster: cluster, MapVersion: version}
	}
}

func (c *fakeCluster) owner(v int) store.VShardOwner {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owners[v]
}

// fakeMaps is the topology backend's shard map: check-and-set updates
// and a barrier whose outcome a test sets (barrier; nil: every router
// applied the version).
type fakeMaps struct {
	mu      sync.Mutex
	cur     *routing.Map
	written []*routing.Map
	barrier func(v int64) error
}

var _ ShardMaps = (*fakeMaps)(nil)

func (f *fakeMaps) ShardMap(context.Context) (*routing.Map, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur, nil
}

func (f *fakeMaps) UpdateShardMap(_ context.Context, prev int64, next *routing.Map) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := topology.CheckNext(prev, next); err != nil {
		return err
	}
	if f.cur.Version() != prev {
		return &topology.ConflictError{Want: prev, Have: f.cur.Version()}
	}
	f.cur = next
	f.written = append(f.written, next)
	return nil
}

func (f *fakeMaps) WaitApplied(_ context.Context, v int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v > f.cur.Version() {
		return fmt.Errorf("no router can apply version %d: the stored map is %d", v, f.cur.Version())
	}
	if f.barrier != nil {
		return f.barrier(v)
	}
	return nil
}

func (f *fakeMaps) set(m *routing.Map) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur = m
}

func (f *fakeMaps) setBarrier(fn func(v int64) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.barrier = fn
}

func (f *fakeMaps) current() *routing.Map {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

// world is a job's surroundings: clusters c1 (vshards 0-511), c2
// (512-1023) and c3 (none) under shard map 1, recorded on each; c1 holds
// rowsPerTable rows in every table, on the moving vshards 0-7 and on
// vshard 100, which stays.
type world struct {
	doc      *memDoc
	maps     *fakeMaps
	clusters map[string]*fakeCluster
}

// moving are the vshards the jobs of the tests move from c1 to c3.
var moving = []uint16{0, 1, 2, 3, 4, 5, 6, 7}

const rowsPerTable = 12

func newWorld(t *testing.T) *world {
	t.Helper()
	m, err := routing.NewMap(1, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{doc: &memDoc{}, maps: &fakeMaps{cur: m}, clusters: map[string]*fakeCluster{}}
	for _, name := range []string{"c1", "c2", "c3"} {
		c := newFakeCluster(name)
		c.record(ownersOf(m))
		w.clusters[name] = c
	}
	for _, tb := range store.MoveTables() {
		for i := range rowsPerTable {
			w.clusters["c1"].put(tb.Name, testRow(tb.Name, i, moving[i%len(moving)]))
			w.clusters["c1"].put(tb.Name, testRow(tb.Name, 1000+i, 100))
		}
	}
	return w
}

// testRow is row i of table on vshard v: ids spread over a few buckets.
func testRow(table string, i int, v uint16) store.MoveRow {
	info := tableInfo(table)
	id := uint64(i/5)<<32 | uint64(i)
	row := make(store.MoveRow, len(info.Columns))
	for c, col := range info.Columns {
		switch {
		case col == "vshard":
			row[c] = int64(v)
		case col == info.BucketBy:
			row[c] = id
		default:
			row[c] = []byte(fmt.Sprintf("%s-%d", col, i))
		}
	}
	return row
}

// config is the jobs' configuration of the tests: no throttle, small
// batches, a freeze budget no test machine exceeds.
func config() Config {
	return Config{RowsPerSecond: -1, BatchRows: 5, FreezeBudget: time.Minute, Log: slog.New(slog.DiscardHandler)}
}

// manager returns a runner over w; sleeps collects its waits between
// retries (none is slept).
func (w *world) manager(cfg Config) (*Manager, *[]time.Duration) {
	m := New(cfg, w.doc, w.maps, func() map[string]Mover {
		out := map[string]Mover{}
		for n, c := range w.clusters {
			out[n] = c
		}
		return out
	})
	var mu sync.Mutex
	sleeps := &[]time.Duration{}
	m.sleep = func(_ context.Context, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		*sleeps = append(*sleeps, d)
	}
	return m, sleeps
}

// submit records the job moving vshards 0-7 to c3.
func (w *world) submit(t *testing.T, m *Manager) *Job {
	t.Helper()
	j, _, err := m.Submit(t.Context(), []Range{{From: 0, To: 7, Target: "c3"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (w *world) job(t *testing.T, m *Manager, id string) *Job {
	t.Helper()
	j, err := m.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// seeded is c1's rows of table as newWorld wrote them.
func seeded(table string, vs []uint16) map[string]string {
	c := newFakeCluster("seed")
	for i := range rowsPerTable {
		c.put(table, testRow(table, i, moving[i%len(moving)]))
		c.put(table, testRow(table, 1000+i, 100))
	}
	return c.snapshot(table, vs)
}

func allTables() []string {
	var out []string
	for _, t := range store.MoveTables() {
		out = append(out, t.Name)
	}
	return out
}

// checkRows says whether cluster holds exactly the seeded rows of vs in
// tables (want) or none (!want).
func (w *world) checkRows(t *testing.T, cluster string, vs []uint16, tables []string, want bool) {
	t.Helper()
	for _, table := range tables {
		got := w.clusters[cluster].snapshot(table, vs)
		exp := map[string]string{}
		if want {
			exp = seeded(table, vs)
		}
		if len(got) != len(exp) {
			t.Errorf("%s holds %d rows of %s on vshards %v, want %d", cluster, len(got), table, vs, len(exp))
			continue
		}
		for k, v := range exp {
			if got[k] != v {
				t.Errorf("%s: row %q of %s is %q, want %q", cluster, k, table, got[k], v)
			}
		}
	}
}

// checkMap says whether every moving vshard is owner's, in state st.
func (w *world) checkMap(t *testing.T, owner string, st routing.State) {
	t.Helper()
	m := w.maps.current()
	for _, v := range moving {
		if c, s := m.Lookup(shard.ID(v)); c != owner || s != st {
			t.Fatalf("map %d: vshard %d is %s's (%v), want %s's (%v)", m.Version(), v, c, s, owner, st)
		}
	}
	if c, s := m.Lookup(100); c != "c1" || s != routing.Serving {
		t.Fatalf("map %d: vshard 100 is %s's (%v), want c1's, serving", m.Version(), c, s)
	}
}

// checkMoved: the job's vshards are c3's, with every row, and gone from
// c1; vshard 100 stays on c1.
func (w *world) checkMoved(t *testing.T) {
	t.Helper()
	w.checkMap(t, "c3", routing.Serving)
	w.checkRows(t, "c3", moving, allTables(), true)
	w.checkRows(t, "c1", moving, allTables(), false)
	w.checkRows(t, "c1", []uint16{100}, allTables(), true)
	w.checkRows(t, "c3", []uint16{100}, allTables(), false)
}

// checkRolledBack: everything is as before the job.
func (w *world) checkRolledBack(t *testing.T) {
	t.Helper()
	w.checkMap(t, "c1", routing.Serving)
	w.checkRows(t, "c1", append([]uint16{100}, moving...), allTables(), true)
	w.checkRows(t, "c3", append([]uint16{100}, moving...), allTables(), false)
}
