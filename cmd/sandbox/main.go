// Command sandbox runs real MariaDB clusters on this machine (see package
// internal/testbed):
//
//	sandbox up   -dir ./var/sandbox [-clusters 2] [-replicas 1]  start a detached bed, write topology.yaml
//	sandbox up   -reuse -dir ./var/sandbox …                     the same, or reuse the bed there: start only its servers that are down, keep all data
//	sandbox add-cluster -dir ./var/sandbox [-replicas 1]          start one more cluster, owning no vshards yet
//	sandbox down -dir ./var/sandbox                              stop it and remove its data
//	sandbox exec [-clusters 2] [-replicas 1] -- CMD ARGS…        run CMD against a bed for its lifetime
//
// `make test` runs `sandbox exec -- go test -race ./...`, so every test
// package attaches to one bed through $SHARDMQ_TESTBED.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/shardmq/shardmq/internal/testbed"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  sandbox up   -dir DIR [-clusters N] [-replicas N] [-reuse] [-v]
  sandbox add-cluster -dir DIR [-replicas N] [-v]
  sandbox down -dir DIR
  sandbox exec [-clusters N] [-replicas N] [-v] -- CMD [ARGS…]
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("sandbox "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	dir := fs.String("dir", "./var/sandbox", "directory for the bed's data (up, down)")
	clusters := fs.Int("clusters", 2, "number of clusters (up, exec)")
	replicas := fs.Int("replicas", 1, "replicas per cluster, 0 for none (up, exec, add-cluster)")
	verbose := fs.Bool("v", false, "log start-up progress to stderr")
	reuse := fs.Bool("reuse", false, "up: reuse a sandbox already in -dir, starting only its servers that are not running (its data is kept)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	spec := testbed.Spec{Clusters: *clusters, Replicas: *replicas, NoReplicas: *replicas == 0}
	if *verbose {
		spec.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx := context.Background()

	var err error
	switch args[0] {
	case "up":
		if *reuse {
			_, _, _, err = testbed.SandboxEnsure(ctx, *dir, spec, stdout)
		} else {
			_, err = testbed.SandboxUp(ctx, *dir, spec, stdout)
		}
	case "add-cluster":
		_, err = testbed.SandboxAddCluster(ctx, *dir, spec, stdout)
	case "down":
		err = testbed.SandboxDown(ctx, *dir)
	case "exec":
		if fs.NArg() == 0 {
			fmt.Fprint(stderr, usage)
			return 2
		}
		var code int
		code, err = testbed.SandboxExec(ctx, spec, fs.Arg(0), fs.Args()[1:]...)
		if err != nil {
			fmt.Fprintf(stderr, "sandbox: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		return code
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbox: %v\n", err)
		return 1
	}
	return 0
}
