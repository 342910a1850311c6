package testbed_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
)

// bed is shared by the tests that only read and write; tests that kill,
// restart, promote or stop replication start their own (see setupOwn).
var bed *testbed.Bed

const helperEnv = "TESTBED_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(m.Run()) // a child of TestServersDieWithTheirOwner
	}
	os.Exit(testbed.Main(m, testbed.Spec{}, func(b *testbed.Bed) { bed = b }))
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// setupOwn starts a bed of one cluster with one replica for a test that
// breaks things.
func setupOwn(t *testing.T) (*testbed.Bed, *testbed.Cluster) {
	t.Helper()
	begin := time.Now()
	b, err := testbed.Start(testContext(t), testbed.Spec{Clusters: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start (1 cluster × 1 replica) took %s", time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
	})
	return b, b.Clusters[0]
}

func open(t *testing.T, inst *testbed.Instance, database string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", inst.DSN(database))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// createTable creates database.t on c's primary.
func createTable(t *testing.T, b *testbed.Bed, c *testbed.Cluster, database string) *sql.DB {
	t.Helper()
	ctx := testContext(t)
	if err := testbed.CreateDatabase(ctx, b, database); err != nil {
		t.Fatal(err)
	}
	db := open(t, c.Primary, database)
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY, v VARCHAR(64))"); err != nil {
		t.Fatal(err)
	}
	return db
}

func insert(t *testing.T, db *sql.DB, id int) {
	t.Helper()
	if _, err := db.ExecContext(testContext(t), "INSERT INTO t (id, v) VALUES (?, ?)", id, "räksmörgås"); err != nil {
		t.Fatal(err)
	}
}

// hasRow reports whether inst's database.t holds id.
func hasRow(t *testing.T, inst *testbed.Instance, database string, id int) bool {
	t.Helper()
	var v string
	err := open(t, inst, database).QueryRowContext(testContext(t), "SELECT v FROM t WHERE id = ?", id).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false
	case err != nil:
		t.Fatal(err)
	case v != "räksmörgås":
		t.Fatalf("%s: row %d has v = %q", inst.Name, id, v)
	}
	return true
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestReplicates(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testContext(t)
	if len(bed.Clusters) < 2 {
		t.Fatalf("bed has %d clusters, want ≥ 2", len(bed.Clusters))
	}
	ids := map[int]string{}
	for _, c := range bed.Clusters {
		db := createTable(t, bed, c, "tb_replicates")
		insert(t, db, 1)
		for _, inst := range append([]*testbed.Instance{c.Primary}, c.Replicas...) {
			if other, ok := ids[inst.ServerID]; ok {
				t.Errorf("%s and %s share server_id %d", inst.Name, other, inst.ServerID)
			}
			ids[inst.ServerID] = inst.Name
		}
	}
	if err := testbed.WaitReplicated(ctx, bed); err != nil {
		t.Fatal(err)
	}
	for _, c := range bed.Clusters {
		for _, r := range c.Replicas {
			if !hasRow(t, r, "tb_replicates", 1) {
				t.Errorf("%s: row 1 not replicated", r.Name)
			}
			var serverID int
			var charset string
			err := open(t, r, "").QueryRowContext(ctx, "SELECT @@server_id, @@character_set_server").Scan(&serverID, &charset)
			if err != nil {
				t.Fatal(err)
			}
			if serverID != r.ServerID || charset != "utf8mb4" {
				t.Errorf("%s: server_id %d, character_set_server %s; want %d, utf8mb4", r.Name, serverID, charset, r.ServerID)
			}
		}
	}
}

func TestReplicaRefusesWrites(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	r := bed.Clusters[0].Replicas[0]
	_, err := open(t, r, "").ExecContext(testContext(t), "CREATE DATABASE tb_must_not_exist")
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != 1290 {
		t.Fatalf("write on %s: got %v, want error 1290 (read-only)", r.Name, err)
	}
}

func TestStopStartReplication(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	b, c := setupOwn(t)
	ctx := testContext(t)
	r := c.Replicas[0]
	db := createTable(t, b, c, "tb_lag")
	insert(t, db, 1)
	if err := testbed.WaitReplicated(ctx, b); err != nil {
		t.Fatal(err)
	}

	if err := b.StopReplication(ctx, r); err != nil {
		t.Fatal(err)
	}
	insert(t, db, 2)
	// Once the IO thread has fetched the insert, only the stopped SQL
	// thread stands between it and the replica's table.
	var pos string
	if err := db.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "replica fetches "+pos, func() bool { return gtidIOPos(t, r) == pos })
	if hasRow(t, r, "tb_lag", 2) {
		t.Fatal("row 2 reached the replica while its SQL thread was stopped")
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := testbed.WaitReplica(short, b, r); err == nil {
		t.Fatal("WaitReplica succeeded while the SQL thread was stopped")
	}

	if err := b.StartReplication(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitReplica(ctx, b, r); err != nil {
		t.Fatal(err)
	}
	if !hasRow(t, r, "tb_lag", 2) {
		t.Fatal("row 2 missing on the replica after StartReplication")
	}
}

func gtidIOPos(t *testing.T, r *testbed.Instance) string {
	t.Helper()
	rows, err := open(t, r, "").QueryContext(testContext(t), "SHOW SLAVE STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		t.Fatalf("%s is not a replica", r.Name)
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		if c == "Gtid_IO_Pos" {
			return vals[i].String
		}
	}
	t.Fatal("no Gtid_IO_Pos column")
	return ""
}

func TestKillRestart(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	b, c := setupOwn(t)
	ctx := testContext(t)
	p, r := c.Primary, c.Replicas[0]
	db := createTable(t, b, c, "tb_crash")
	insert(t, db, 1)

	oldPID := p.PID
	if err := b.Kill(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(oldPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("killed primary's pid %d: kill(0) = %v, want ESRCH", oldPID, err)
	}
	if err := open(t, p, "").PingContext(ctx); err == nil {
		t.Fatal("killed primary still answers")
	}
	if err := b.Kill(p); err == nil {
		t.Fatal("Kill of a dead instance succeeded")
	}
	begin := time.Now()
	if err := b.Restart(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Logf("Restart after kill -9 took %s", time.Since(begin).Round(time.Millisecond))
	if p.PID == oldPID {
		t.Errorf("PID unchanged by Restart")
	}
	if !hasRow(t, p, "tb_crash", 1) {
		t.Fatal("committed row 1 lost in the crash")
	}
	// The replica reconnects to the restarted primary by itself.
	insert(t, db, 2)
	if err := testbed.WaitReplicated(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !hasRow(t, r, "tb_crash", 2) {
		t.Fatal("row 2 not replicated after the primary's restart")
	}

	// A crashed replica resumes where it was.
	if err := b.Kill(r); err != nil {
		t.Fatal(err)
	}
	insert(t, db, 3)
	if err := b.Restart(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitReplicated(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !hasRow(t, r, "tb_crash", 3) {
		t.Fatal("row 3 not replicated after the replica's restart")
	}
	// Restart of a running server shuts it down cleanly first.
	if err := b.Restart(ctx, r); err != nil {
		t.Fatal(err)
	}
}

func TestPromote(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	b, c := setupOwn(t)
	ctx := testContext(t)
	p, r := c.Primary, c.Replicas[0]
	db := createTable(t, b, c, "tb_failover")
	insert(t, db, 1)
	if err := testbed.WaitReplicated(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := b.Kill(p); err != nil {
		t.Fatal(err)
	}
	if err := b.Promote(ctx, r); err != nil {
		t.Fatal(err)
	}
	rdb := open(t, r, "tb_failover")
	insert(t, rdb, 2)
	if err := testbed.WaitReplica(ctx, b, r); err != nil {
		t.Fatalf("WaitReplica on a promoted replica: %v", err)
	}
	// It stays writable across a restart.
	if err := b.Restart(ctx, r); err != nil {
		t.Fatal(err)
	}
	insert(t, rdb, 3)
	if !hasRow(t, r, "tb_failover", 1) {
		t.Fatal("row 1 lost in the failover")
	}
}

func TestSaveAttach(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := testContext(t)
	path := filepath.Join(t.TempDir(), "bed.json")
	if err := bed.Save(path); err != nil {
		t.Fatal(err)
	}
	a, err := testbed.Attach(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(bed.Clusters)
	got, _ := json.Marshal(a.Clusters)
	if string(got) != string(want) || a.Dir != bed.Dir {
		t.Fatalf("attached bed differs:\n got %s %s\nwant %s %s", a.Dir, got, bed.Dir, want)
	}

	if err := testbed.CreateDatabase(ctx, a, "tb_attach"); err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitReplicated(ctx, a); err != nil {
		t.Fatal(err)
	}
	p := a.Clusters[0].Primary
	if err := a.Kill(p); !errors.Is(err, testbed.ErrNotOwner) {
		t.Errorf("Kill on an attached bed: %v, want ErrNotOwner", err)
	}
	if err := a.Restart(ctx, p); !errors.Is(err, testbed.ErrNotOwner) {
		t.Errorf("Restart on an attached bed: %v, want ErrNotOwner", err)
	}
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := open(t, p, "tb_attach").PingContext(ctx); err != nil {
		t.Fatalf("the attached bed's Stop stopped a server: %v", err)
	}
}

func TestSpecErrors(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	for _, spec := range []testbed.Spec{
		{Replicas: -1},
		{Clusters: -1},
		{NoReplicas: true, Replicas: 2},
		{Replicas: 99},
	} {
		if b, err := testbed.Start(testContext(t), spec); err == nil {
			b.Stop()
			t.Errorf("Start(%+v) succeeded", spec)
		}
	}
}

// TestServersDieWithTheirOwner kills a process that started a bed with
// SIGKILL (no chance to stop anything) and expects its servers to go too.
func TestServersDieWithTheirOwner(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartAndBlock$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	var (
		pids []int
		dir  string
	)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "dir "); ok {
			dir = d
		} else if p, ok := strings.CutPrefix(line, "pid "); ok {
			pid, _ := strconv.Atoi(p)
			pids = append(pids, pid)
		} else if line == "ready" {
			break
		}
	}
	if len(pids) == 0 {
		t.Fatal("helper reported no servers")
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cmd.Process.Kill()
	cmd.Wait()
	for _, pid := range pids {
		eventually(t, 10*time.Second, fmt.Sprintf("server %d dies with its owner", pid), func() bool {
			return !alive(pid)
		})
	}
}

// alive reports whether pid runs (zombies, whose reaping is up to their new
// parent, count as dead).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func TestHelperStartAndBlock(t *testing.T) {
	testbed.Need(t)
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper for TestServersDieWithTheirOwner")
	}
	b, err := testbed.Start(testContext(t), testbed.Spec{Clusters: 1, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("dir", b.Dir)
	for _, inst := range b.Instances() {
		fmt.Println("pid", inst.PID)
	}
	fmt.Println("ready")
	<-t.Context().Done() // until killed
}
