package testbed_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/testbed"
)

// procState is the one-letter state of pid in /proc (R, S, T for stopped…).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	i := bytes.LastIndexByte(stat, ')')
	return stat[i+2]
}

// Suspend makes a server hang (stopped, its connections open, no answer);
// Continue brings it back; Stop ends a suspended bed.
func TestSuspendContinue(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	b, err := testbed.Start(testContext(t), testbed.Spec{Clusters: 1, NoReplicas: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			b.Stop()
		}
	})
	p := b.Clusters[0].Primary
	db := open(t, p, "")
	if err := db.PingContext(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if err := b.Suspend(p); err != nil {
		t.Fatal(err)
	}
	if st := procState(t, p.PID); st != 'T' {
		t.Fatalf("suspended server is in state %c, want T (stopped)", st)
	}
	ctx, cancel := context.WithTimeout(testContext(t), 300*time.Millisecond)
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("query on a suspended server: %v, want it to hang until the deadline", err)
	}
	if err := b.Continue(p); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(testContext(t), "SELECT 1").Scan(new(int)); err != nil {
		t.Fatalf("query after Continue: %v", err)
	}
	if err := b.Suspend(p); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if err := b.Stop(); err != nil {
		t.Fatalf("Stop of a bed with a suspended server: %v", err)
	}
	if testbed.PIDAlive(p.PID) {
		t.Fatalf("suspended server %d survived Stop", p.PID)
	}
}
