// Command loadtest drives shardmq at target rates and verifies that every
// acknowledged message was consumed exactly once (package loadtest).
//
//	loadtest -scenario mixed -sandbox var/sandbox -router-bin bin/router -out var/loadtest/mixed
//	loadtest -scenario mixed -router http://router:8080 -topology prod.yaml -baseline -out report/
//
// It prints a live progress line, writes report.md and report.json into
// -out, and ends with the verdict line (or, for the bench scenarios, the
// ratio line). Exit status: 0 passed, 1 lost or duplicated messages (or a
// failed fault), 2 the run could not be carried out.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/ctl"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/loadtest"
	"github.com/shardmq/shardmq/topology"
)

func main() {
	// The driver logs every connection a fault breaks; the run counts
	// those errors itself, and the lines would break the progress line.
	mysql.SetLogger(log.New(io.Discard, "", 0))
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadtest.Config
	fs.StringVar(&cfg.Scenario, "scenario", "mixed", "one of "+strings.Join(loadtest.Scenarios, ", "))
	routerList := fs.String("router", "", "router base URL, or several over the same clusters separated by commas (default http://127.0.0.1:8080 unless -router-bin)")
	routerBin := fs.String("router-bin", "", "run this router binary as a child on a free port over the topology (measures the current build; needed for -fault router)")
	nRouters := fs.Int("routers", 1, "with -router-bin: how many routers to run, each on its own free port over the same topology")
	fs.StringVar(&cfg.Routing, "routing", "rr", "how requests are spread over several routers: rr (each request to the next router) or key (each message to the router its key hashes to)")
	routerArgs := fs.String("router-args", "", "extra flags for the -router-bin router, space separated (e.g. \"-commit-workers 2\")")
	token := fs.String("token", "", "API token for -router (default $SHARDMQ_TOKEN, else the first line of -token-file); a -router-bin child gets a token made for the run")
	tokenFile := fs.String("token-file", "", "file holding the API token for -router (default "+ctl.DefaultTokenFile+" when it exists)")
	routerLog := fs.String("router-log", "", "log file of the child router (default OUT/router.log)")
	sandbox := fs.String("sandbox", "", "sandbox directory (var/sandbox): use the one running there or start one as `make run` does; gives -topology and the instances for -fault")
	sbClusters := fs.Int("sandbox-clusters", 2, "clusters of a sandbox -sandbox starts (one that runs is used as it is)")
	sbReplicas := fs.Int("sandbox-replicas", 1, "replicas per cluster of a sandbox -sandbox starts")
	topoPath := fs.String("topology", "", "static topology file: the clusters for the baseline, per-cluster figures and key lookups")
	fs.BoolVar(&cfg.Baseline, "baseline", false, "also run the workload straight into MySQL and report router/baseline ratios")
	fs.DurationVar(&cfg.Duration, "duration", 0, "each measured phase (default 60s; 12s per phase for bench-*)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "excluded from measurements at each phase's start (default 5s; 2s for bench-*)")
	fs.DurationVar(&cfg.Drain, "drain", 0, "bound on consuming what is left after the duration (default 180s; ends as soon as all is accounted for)")
	fs.Float64Var(&cfg.ProduceRate, "produce-rate", 0, "target messages/s written, 0 closed loop (mixed scenarios: 100000)")
	fs.Float64Var(&cfg.ConsumeRate, "consume-rate", 0, "target messages/s consumed, 0 closed loop (mixed scenarios: 50000)")
	fs.IntVar(&cfg.Producers, "producers", 0, "concurrent producers (default 8)")
	fs.IntVar(&cfg.Consumers, "consumers", 0, "concurrent consumers (default 4)")
	fs.IntVar(&cfg.Batch, "batch", 0, "messages per produce request (default 100)")
	fs.IntVar(&cfg.ClaimMax, "claim-max", 0, "max per claim (default 100)")
	fs.IntVar(&cfg.SingleClients, "single-clients", 0, "clients of bench-produce's one-message-per-request phase (default 64)")
	fs.DurationVar(&cfg.ClientProducer.Linger, "client-linger", 0, "bench-produce's Go client phase: the producer's linger (default the client's, 1ms; negative: none)")
	fs.IntVar(&cfg.ClientProducer.MaxInFlight, "client-inflight", 0, "bench-produce's Go client phase: produce requests in flight at once (default the client's, 2)")
	fs.IntVar(&cfg.AsyncCount, "async-count", 0, "bench-produce's async client phase: messages one goroutine publishes per round through client.Publisher (default 200000)")
	fs.DurationVar(&cfg.AsyncPublisher.Linger, "async-linger", 0, "bench-produce's async client phase: the publisher's linger (default the client's, 5ms; negative: none)")
	fs.IntVar(&cfg.AsyncPublisher.MaxInFlight, "async-inflight", 0, "bench-produce's async client phase: produce requests in flight at once (default the client's, 4)")
	fs.IntVar(&cfg.AsyncPublisher.MaxBatch, "async-batch", 0, "bench-produce's async client phase: messages per request at most (default the client's, 500)")
	fs.IntVar(&cfg.Rounds, "rounds", 0, "rounds of the bench scenarios, alternating router and baseline (default 2)")
	fs.IntVar(&cfg.Preload, "preload", 0, "messages preloaded per side (and round) by the consume scenarios (default 100000; 60000 for bench-consume)")
	fs.IntVar(&cfg.SQSPreload, "sqs-preload", 0, "messages per side (and round) of bench-consume's SQS leg (default -preload, at most 20000)")
	payload := fs.String("payload", "uniform:100:300", "payload bytes: N, uniform:A:B or exp:MEAN[:CAP]")
	keys := fs.String("keys", "uniform", "key distribution: uniform or hot:N:SHARE (SHARE of messages on N hot vshards)")
	fs.IntVar(&cfg.Topics, "topics", 0, "topics (default 1)")
	fs.IntVar(&cfg.Subscriptions, "subscriptions", 0, "subscriptions per topic (default 1, the implicit default one)")
	fs.Float64Var(&cfg.DupShare, "dup-share", 0, "share of produced messages repeating an earlier key (dedup: 0.5)")
	fs.Float64Var(&cfg.NackShare, "nack-share", 0, "share of keys always nacked, ending dead-lettered (deadletter: 0.1)")
	fs.Float64Var(&cfg.RetryShare, "retry-share", 0, "share of keys nacked on their first attempt (deadletter: 0.05)")
	fs.Float64Var(&cfg.DropShare, "drop-share", 0, "share of keys whose first delivery is neither acked nor nacked (lease expiry)")
	fs.DurationVar(&cfg.NackRetryAfter, "nack-retry-after", 0, "retry_after_ms of nacks (default 50ms)")
	fs.DurationVar(&cfg.Visibility, "visibility", 0, "claim lease (default 10s)")
	fs.IntVar(&cfg.RetryBuffer, "retry-buffer", 0, "items of unknown outcome the producers hold for resending; past it they take no new messages until some are stored (default 20000; negative: unbounded)")
	fs.DurationVar(&cfg.Wait, "wait", 0, "claim long poll (default 1s)")
	fs.StringVar(&cfg.Durability, "durability", "", "primary or replicated (router only)")
	fault := fs.String("fault", "", "kill -9 this sandbox instance (e.g. c1-primary) or the child router (router) mid-run, then restart it")
	fs.DurationVar(&cfg.FaultAt, "fault-at", 0, "when into the first router phase to kill (default 20s)")
	fs.DurationVar(&cfg.FaultDown, "fault-down", 0, "how long it stays down (default 5s)")
	fs.IntVar(&cfg.Workers, "workers", 0, "coordinate this many generator processes sharing the run (mixed scenarios); without -coordinator they are started here on loopback")
	coordAddr := fs.String("coordinator", "", "listen on this address as the coordinator of -workers generators started elsewhere with -worker (e.g. 0.0.0.0:9300)")
	workerOf := fs.String("worker", "", "run as a generator of the coordinator at this URL: take the plan, produce and consume its share, stream the books back")
	fs.Float64Var(&cfg.Capacity.Produce, "capacity-produce", 100000, "capacity model: messages/s written the fleet must carry")
	fs.Float64Var(&cfg.Capacity.Consume, "capacity-consume", 50000, "capacity model: messages/s consumed the fleet must carry")
	fs.Float64Var(&cfg.Capacity.Utilization, "capacity-utilization", 0.7, "capacity model: share of each host's cores used at the target (the rest is headroom)")
	fs.IntVar(&cfg.Capacity.DBCores, "capacity-db-cores", 16, "capacity model: cores of a database host (primary or replica)")
	fs.IntVar(&cfg.Capacity.RouterCores, "capacity-router-cores", 8, "capacity model: cores of a router host")
	fs.Float64Var(&cfg.Capacity.ClusterRate, "capacity-cluster-rate", 0, "capacity model: messages moved/s one cluster carries at most (its commit rate, from production hardware); 0 sizes clusters by CPU only")
	fs.IntVar(&cfg.Capacity.GeneratorCores, "capacity-generator-cores", 8, "capacity model: cores of a load-generator machine")
	out := fs.String("out", "", "report directory (default var/loadtest/SCENARIO)")
	cpuProfile := fs.String("cpuprofile", "", "write the generator's own CPU profile to this file (to see what the load tester costs)")
	prog := fs.String("progress", "auto", "auto (a live line on a terminal, a line every 5s otherwise), live, lines or off")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "loadtest: "+format+"\n", a...)
		return 2
	}
	var err error
	if cfg.Payload, err = loadtest.ParseDist(*payload); err != nil {
		return fail("-payload: %v", err)
	}
	if cfg.Keys, err = loadtest.ParseKeyDist(*keys); err != nil {
		return fail("-keys: %v", err)
	}
	if *out == "" {
		*out = filepath.Join("var", "loadtest", cfg.Scenario)
	}
	switch *prog {
	case "auto":
		cfg.Progress, cfg.Live = stdout, isTerminal(stdout)
	case "live":
		cfg.Progress, cfg.Live = stdout, true
	case "lines":
		cfg.Progress = stdout
	case "off":
	default:
		return fail("-progress %q: want auto, live, lines or off", *prog)
	}
	cfg.Command = "loadtest " + strings.Join(args, " ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *workerOf != "" {
		return runWorker(ctx, *workerOf, *token, *tokenFile, cfg.Progress, stdout, stderr)
	}

	var bed *testbed.Bed
	if *sandbox != "" {
		var started bool
		bed, started, err = loadtest.EnsureSandbox(ctx, *sandbox, *sbClusters, *sbReplicas, stdout)
		if err != nil {
			return fail("sandbox: %v", err)
		}
		if started {
			fmt.Fprintf(stdout, "started a sandbox in %s (it keeps running; `make stop` stops it)\n", *sandbox)
		}
		if *topoPath == "" {
			*topoPath = filepath.Join(*sandbox, testbed.TopologyFile)
		}
	}
	if *topoPath != "" {
		if cfg.Topology, err = topology.LoadFile(*topoPath); err != nil {
			return fail("%v", err)
		}
	}
	if *routerList != "" {
		cfg.Routers = strings.Split(*routerList, ",")
	}
	if *nRouters < 1 || (*nRouters > 1 && *routerBin == "") {
		return fail("-routers %d: want 1, or more with -router-bin", *nRouters)
	}
	var rps []*loadtest.RouterProcess
	if *routerBin != "" {
		if *topoPath == "" {
			return fail("-router-bin needs -topology or -sandbox")
		}
		if *routerLog == "" {
			*routerLog = filepath.Join(*out, "router.log")
		}
		if err := os.MkdirAll(filepath.Dir(*routerLog), 0o755); err != nil {
			return fail("%v", err)
		}
		// The child runs as routers run in production: with a token file,
		// here one admin token made for this run.
		tokens, secret, err := runToken(*out)
		if err != nil {
			return fail("%v", err)
		}
		if len(cfg.Routers) == 0 {
			cfg.Token = secret
		}
		// And an SQS access key acting as that token (bench-consume's
		// SQS leg).
		awsKeys, keyID, keySecret, err := runAccessKey(*out)
		if err != nil {
			return fail("%v", err)
		}
		// One receipt key for every router of the run: a receipt made by
		// one is acked at another.
		receiptKey, err := runReceiptKey(*out)
		if err != nil {
			return fail("%v", err)
		}
		if len(cfg.Routers) == 0 {
			cfg.SQSAccessKey, cfg.SQSSecret = keyID, keySecret
		}
		var urls []string
		for i := range *nRouters {
			logPath := *routerLog
			if i > 0 {
				logPath = strings.TrimSuffix(logPath, ".log") + fmt.Sprintf("-%d.log", i+1)
			}
			rp := &loadtest.RouterProcess{Bin: *routerBin, Topology: *topoPath, LogPath: logPath,
				Args: append([]string{"-tokens", tokens, "-aws-credentials", awsKeys, "-receipt-key-file", receiptKey}, strings.Fields(*routerArgs)...)}
			if err := rp.Start(ctx); err != nil {
				return fail("%v", err)
			}
			defer rp.Stop()
			rps = append(rps, rp)
			urls = append(urls, rp.URL())
			fmt.Fprintf(stdout, "router %s (%s, log %s)\n", rp.URL(), *routerBin, logPath)
		}
		if len(cfg.Routers) == 0 {
			cfg.Routers = urls
		}
	}
	if cfg.Token == "" {
		if cfg.Token, err = ctl.ResolveToken(*token, *tokenFile); err != nil {
			return fail("%v", err)
		}
	}
	switch {
	case *fault == "":
	case *fault == "router":
		if len(rps) == 0 {
			return fail("-fault router needs -router-bin (the load test can only restart a router it runs)")
		}
		cfg.Fault = rps[0]
	default:
		if bed == nil {
			return fail("-fault %s needs -sandbox", *fault)
		}
		f, err := loadtest.NewInstanceFault(bed, *fault)
		if err != nil {
			return fail("%v", err)
		}
		cfg.Fault = f
	}

	var workers []*exec.Cmd
	switch {
	case cfg.Workers <= 0:
	case *coordAddr != "":
		cfg.Listen = *coordAddr
	default:
		// Local workers: this binary again, one process each, logging to
		// OUT/worker-N.log; they exit once their result is sent.
		self, err := os.Executable()
		if err != nil {
			return fail("workers: %v", err)
		}
		cfg.ShareToken = len(rps) > 0
		if err := os.MkdirAll(*out, 0o755); err != nil {
			return fail("%v", err)
		}
		cfg.OnCoordinator = func(url string) error {
			for i := range cfg.Workers {
				logf, err := os.Create(filepath.Join(*out, fmt.Sprintf("worker-%d.log", i+1)))
				if err != nil {
					return err
				}
				defer logf.Close()
				cmd := exec.Command(self, "-worker", url, "-progress", "lines")
				if !cfg.ShareToken {
					cmd.Env = append(os.Environ(), "SHARDMQ_TOKEN="+cfg.Token)
				}
				cmd.Stdout, cmd.Stderr = logf, logf
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				if err := cmd.Start(); err != nil {
					return fmt.Errorf("workers: start %s: %w", self, err)
				}
				workers = append(workers, cmd)
			}
			fmt.Fprintf(stdout, "%d workers started (logs %s)\n", cfg.Workers, filepath.Join(*out, "worker-N.log"))
			return nil
		}
	}
	defer func() {
		// Workers end once their result is sent, or a minute after the
		// coordinator stopped answering; one that does not is killed.
		deadline := time.After(2 * time.Minute)
		for _, w := range workers {
			done := make(chan struct{})
			go func() { w.Wait(); close(done) }()
			select {
			case <-done:
			case <-deadline:
				w.Process.Kill()
				<-done
			}
		}
	}()

	cfg.CPU = append(cfg.CPU, loadtest.SelfCPU())
	if len(rps) > 0 {
		cfg.CPU = append(cfg.CPU, loadtest.RoutersCPU(rps))
	}
	if bed != nil {
		cfg.CPU = append(cfg.CPU, loadtest.SandboxCPU(bed))
		cfg.CPU = append(cfg.CPU, loadtest.SandboxRoleCPU(bed)...)
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail("-cpuprofile: %v", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail("-cpuprofile: %v", err)
		}
		defer pprof.StopCPUProfile()
	}
	begin := time.Now()
	rep, err := loadtest.Run(ctx, cfg)
	if err != nil {
		return fail("%v", err)
	}
	if err := rep.Write(*out); err != nil {
		return fail("%v", err)
	}
	fmt.Fprintf(stdout, "\nreports: %s, %s, %s (%.0f s)\n", filepath.Join(*out, "report.md"), filepath.Join(*out, "report.html"),
		filepath.Join(*out, "report.json"), time.Since(begin).Seconds())
	if !rep.Summary.Passed {
		fmt.Fprintf(stdout, "FAILED: %s\n", strings.Join(rep.Summary.Problems, "; "))
	}
	for _, l := range rep.SummaryLines() {
		fmt.Fprintln(stdout, l)
	}
	if !rep.Summary.Passed {
		return 1
	}
	return 0
}

// runWorker is `loadtest -worker URL`: one generator of a coordinator's
// run.
func runWorker(ctx context.Context, url, token, tokenFile string, progress, stdout, stderr io.Writer) int {
	tok, err := ctl.ResolveToken(token, tokenFile)
	if err != nil {
		tok = "" // the plan may carry the run's token
	}
	if progress == nil {
		progress = io.Discard
	}
	res, err := loadtest.RunWorker(ctx, strings.TrimSuffix(url, "/"), loadtest.WorkerOptions{Token: tok, Progress: progress, CPU: []loadtest.CPUSource{loadtest.SelfCPU()}})
	if err != nil {
		fmt.Fprintf(stderr, "loadtest: %v\n", err)
		return 2
	}
	p := res.Phase
	fmt.Fprintf(stdout, "worker %d done: produced %d, consumed %d in the window\n", res.Worker, p.Produce.Messages, p.Consume.Messages)
	return 0
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// runAccessKey makes an SQS access key for a child router acting as the
// run's token: the access-key file in dir, and the key.
func runAccessKey(dir string) (path, id, secret string, err error) {
	if id, secret, err = auth.NewAccessKey(); err != nil {
		return "", "", "", err
	}
	path = filepath.Join(dir, "router-aws-keys.yaml")
	os.Remove(path)
	err = auth.PutAccessKey(path, auth.AccessKey{ID: id, Secret: secret, Token: "loadtest"}, true)
	return path, id, secret, err
}

// runReceiptKey writes a random receipt key for the run's routers in dir.
func runReceiptKey(dir string) (string, error) {
	key := make([]byte, 48)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "router-receipt.key")
	return path, os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}

// runToken makes an admin token for a child router: the token file (its
// hash) in dir, and the secret, which stays in this process.
func runToken(dir string) (path, secret string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	secret, err = auth.NewToken()
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "router-tokens.yaml")
	os.Remove(path)
	err = auth.PutEntry(path, auth.FileToken{Name: "loadtest", SHA256: auth.Hash(secret), Scopes: map[auth.Scope][]string{auth.Admin: {"*"}}})
	return path, secret, err
}
