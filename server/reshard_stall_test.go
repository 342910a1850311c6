package server

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/shard"
	"github.com/shardmq/shardmq/topology"
)

// handLeader is an election a test hands over by hand: it leads from
// grant until lose.
type handLeader struct {
	gained, lost chan struct{}
	once         sync.Once
}

var _ topology.Leader = (*handLeader)(nil)

func newHandLeader() *handLeader {
	return &handLeader{gained: make(chan struct{}), lost: make(chan struct{})}
}

func (l *handLeader) grant()                { close(l.gained) }
func (l *handLeader) lose()                 { l.once.Do(func() { close(l.lost) }) }
func (l *handLeader) Start(context.Context) {}
func (l *handLeader) Stop()                 { l.lose() }
func (l *handLeader) IsLeader() bool        { return false }
func (l *handLeader) Leading(ctx context.Context) (<-chan struct{}, error) {
	select {
	case <-l.gained:
		return l.lost, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Must-show (d) of issue 26. A leader stalls inside the cut-over with the
// source's deliveries of the moving vshards deleted in a transaction it
// never ends — what a SIGSTOP between the cut-over's DELETE and its COMMIT
// leaves: the rows locked on the source's primary, on a connection of the
// leader's own pool. Its election then passes to another router. The new
// leader kills the stalled leader's connections (recorded on the cluster
// under its epoch) before its first step there, finishes the cut-over,
// and the range takes writes again within 30 s; nothing is lost.
func TestReshardStalledLeaderReleasesRange(t *testing.T) {
	t.Parallel()
	testbed.Need(t)
	e := setupReshard(t, nil)
	ctx := t.Context()
	const topic = "rs-stall"
	var msgs []any
	for i := 0; i < 400; i++ {
		msgs = append(msgs, msg(fmt.Sprint("st-", i), i))
	}
	if st, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": msgs}); st != 200 {
		t.Fatalf("produce: %d %v", st, body)
	}
	rs := e.r.reshard
	rs.manager.Stop() // the router's own runner steps aside: two test leaders take turns

	// The sessions each leader opened, so the test can stall the first
	// inside its own pool.
	var mu sync.Mutex
	opened := map[string]rebalance.Session{}
	open := e.r.pools.reshardSessions("test", slog.New(slog.DiscardHandler))
	sessions := func(ctx context.Context, cluster string, epoch int64) (rebalance.Session, error) {
		s, err := open(ctx, cluster, epoch)
		if err == nil {
			mu.Lock()
			opened[fmt.Sprint(cluster, "/", epoch)] = s
			mu.Unlock()
		}
		return s, err
	}
	stalled := make(chan time.Time, 1)
	release := make(chan struct{})
	var stuck *sql.Tx
	a, b := newHandLeader(), newHandLeader()
	first := rebalance.New(rebalance.Config{RowsPerSecond: -1, Leader: a, Sessions: sessions, OnState: func(j *rebalance.Job) {
		if j.State != rebalance.StateCutover {
			return
		}
		var js rebalance.Jobs
		data, _, err := rs.state.Get(ctx)
		if err == nil {
			err = json.Unmarshal(data, &js)
		}
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		src := opened[fmt.Sprint("c2/", js.LeaderEpoch)]
		mu.Unlock()
		db := src.(interface{ DB() *sql.DB }).DB()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM message_queue WHERE vshard BETWEEN 512 AND 767 LIMIT 10000"); err != nil {
			t.Error(err)
			return
		}
		stuck = tx
		stalled <- time.Now()
		<-release // stopped here, the transaction open, until the test ends
	}}, rs.state, rs.backend, e.r.pools.movers)
	t.Cleanup(func() {
		close(release)
		first.Stop()
		if stuck != nil {
			stuck.Rollback()
		}
	})
	a.grant()
	first.Start(ctx)

	st, body := e.do(t, "POST", "/v1/admin/reshard", map[string]any{"ranges": []any{map[string]any{"from": 512, "to": 767, "target": "c1"}}})
	if st != 202 {
		t.Fatalf("submit: %d %v", st, body)
	}
	id := body["job"].(string)
	var since time.Time
	select {
	case since = <-stalled:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first leader never reached the cut-over")
	}
	a.lose()
	second := rebalance.New(rebalance.Config{RowsPerSecond: -1, Leader: b, Sessions: sessions}, rs.state, rs.backend, e.r.pools.movers)
	t.Cleanup(second.Stop)
	b.grant()
	second.Start(ctx)

	// A key of the range: writable again once the map flips to c1.
	key := ""
	for i := 0; key == ""; i++ {
		if v := shard.Of(fmt.Sprint("after-", i)); v >= 512 && v <= 767 {
			key = fmt.Sprint("after-", i)
		}
	}
	var took time.Duration
	for {
		st, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": []any{msg(key, 1)}})
		if st == 200 && results(t, body)[0]["status"] == "created" {
			took = time.Since(since)
			break
		}
		if time.Since(since) > 60*time.Second {
			t.Fatalf("range 512-767 still not writable %v after the leader stalled: %d %v", time.Since(since), st, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("range writable again %v after the leader stalled in the cut-over", took.Round(time.Millisecond))
	if took > 30*time.Second {
		t.Fatalf("range writable again only after %v, want within 30s", took)
	}
	job := e.waitJob(t, id)
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	if got := e.ownerOf(t, 600); got != "c1" {
		t.Fatalf("vshard 600 owned by %s after the move", got)
	}
	// The stalled transaction was ended by the server: it cannot commit.
	if err := stuck.Commit(); err == nil {
		t.Fatal("the stalled leader's transaction committed after its successor took over")
	}
	// Nothing lost, nothing twice: every message delivered once.
	seen := map[string]bool{}
	for {
		got := e.claim(t, topic, "default", map[string]any{"max": 500, "visibility_timeout_ms": 120000})
		if len(got) == 0 {
			break
		}
		for _, m := range got {
			if seen[m["id"].(string)] {
				t.Fatalf("message %s delivered twice", m["id"])
			}
			seen[m["id"].(string)] = true
		}
		e.ack(t, got...)
	}
	if len(seen) != len(msgs)+1 {
		t.Fatalf("%d messages delivered, want %d", len(seen), len(msgs)+1)
	}
}

// Must-show (e) of issue 26 through the router: a range holding ten
// messages of 1 MiB of zero bytes (20 MiB as escaped statement text, more
// than the servers' max_allowed_packet) moves, whole.
func TestReshardMovesLargeMessages(t *testing.T) {
	t.Parallel()
	testbed.Need(t)
	e := setupReshard(t, nil)
	const topic = "rs-large"
	zeros := base64.StdEncoding.EncodeToString(make([]byte, 1<<20))
	n := 0
	for i := 0; n < 10; i++ {
		key := fmt.Sprint("big-", i)
		if v := shard.Of(key); v < 512 || v > 767 {
			continue
		}
		st, _, body := e.post(t, "/v1/topics/"+topic+"/messages", map[string]any{"messages": []any{map[string]any{"key": key, "payload_base64": zeros}}})
		if st != 200 || results(t, body)[0]["status"] != "created" {
			t.Fatalf("produce %s: %d %v", key, st, body)
		}
		n++
	}
	job := e.reshard(t, []map[string]any{{"from": 512, "to": 767, "target": "c1"}})
	if job["state"] != "done" {
		t.Fatalf("job %v", job)
	}
	whole := "SELECT COUNT(*) FROM message_store WHERE topic = ? AND payload = REPEAT(0x00, 1048576)"
	if got := e.count(t, whole, topic); got["c1"] != 10 || got["c2"] != 0 {
		t.Fatalf("whole 1 MiB messages per cluster after the move: %v, want 10 on c1", got)
	}
}
