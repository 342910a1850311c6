package testbed

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// Main runs a package's tests against one bed per `go test` process:
//
//	var bed *testbed.Bed
//
//	func TestMain(m *testing.M) {
//		os.Exit(testbed.Main(m, testbed.Spec{}, func(b *testbed.Bed) { bed = b }))
//	}
//
// If the environment variable SHARDMQ_TESTBED names a file written by Save
// (`make test` starts one bed for all packages with `sandbox exec`) and that
// bed has the shape spec asks for (number of clusters and of replicas), Main
// attaches to it and leaves it running. Otherwise it starts a bed with spec,
// hands it to set, runs the tests and stops the bed, also when the process
// gets SIGINT or SIGTERM (it then stops the bed and dies of the signal).
// It returns the exit code for os.Exit. With EnvFast set it starts
// nothing and runs the tests, those that need a bed skipping (Need).
func Main(m *testing.M, spec Spec, set func(*Bed)) int {
	if os.Getenv(EnvFast) != "" {
		return m.Run() // no bed: the tests that need one skip (Need)
	}
	if path := os.Getenv(EnvVar); path != "" {
		b, err := Attach(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%v (from $%s)\n", err, EnvVar)
			return 1
		}
		ok, why := b.fits(spec)
		if ok {
			set(b)
			return m.Run()
		}
		fmt.Fprintf(os.Stderr, "testbed: not using the bed in $%s: %s; starting one\n", EnvVar, why)
	}

	b, err := Start(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			if err := b.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			// Die of the signal, as the process would have without Main.
			signal.Reset(sig)
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Signal(sig)
			}
		case <-done:
		}
	}()

	set(b)
	code := m.Run()

	signal.Stop(sigs)
	close(done)
	if err := b.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// fits reports whether b has the shape spec asks for.
func (b *Bed) fits(spec Spec) (bool, string) {
	spec, err := spec.withDefaults()
	if err != nil {
		return false, err.Error()
	}
	for _, c := range b.Clusters {
		if len(c.Replicas) != spec.Replicas {
			return false, fmt.Sprintf("cluster %s has %d replicas, the tests want %d", c.Name, len(c.Replicas), spec.Replicas)
		}
	}
	if len(b.Clusters) != spec.Clusters {
		return false, fmt.Sprintf("it has %d clusters, the tests want %d", len(b.Clusters), spec.Clusters)
	}
	return true, ""
}

// EnvFast, when set (`make test-fast`), runs only the tests that need no
// database: Main starts no bed, and every test that needs one calls Need
// first, which skips it.
const EnvFast = "SHARDMQ_TEST_FAST"

// Need skips tb when the run has no databases (EnvFast). Every test that
// reaches a bed, or starts MariaDB itself, calls it first.
func Need(tb testing.TB) {
	tb.Helper()
	if os.Getenv(EnvFast) != "" {
		tb.Skip("needs MariaDB; skipped by " + EnvFast + " (make test-fast)")
	}
}
