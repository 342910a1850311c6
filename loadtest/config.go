package loadtest

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/topology"
)

// Scenarios.
const (
	// ScenarioProduce: producers only, router (and the baseline with
	// Config.Baseline); a sample of the acknowledged keys is looked up.
	ScenarioProduce = "produce"
	// ScenarioConsume: a preloaded backlog of Preload messages is drained
	// by the consumers, router (and baseline).
	ScenarioConsume = "consume"
	// ScenarioMixed is the quarterly test: producers at ProduceRate
	// (default 100,000/s) and consumers at ConsumeRate (default 50,000/s)
	// at once for Duration, then a drain, and every acknowledged key
	// accounted for.
	ScenarioMixed = "mixed"
	// ScenarioDedup is mixed with DupShare (default 0.5) of the produced
	// messages repeating an earlier key: it measures the unique
	// constraint's cost and proves a repeat is never delivered.
	ScenarioDedup = "dedup"
	// ScenarioDeadletter is mixed with NackShare (default 0.1) of the keys
	// always nacked, so that they end dead-lettered after the
	// subscription's max attempts, and RetryShare (default 0.05) nacked
	// once.
	ScenarioDeadletter = "deadletter"
	// ScenarioBaseline is the mixed workload straight into MySQL only.
	ScenarioBaseline = "baseline"
	// ScenarioBenchProduce (issue 3) measures, in one run and alternating
	// in Rounds, batched produce through the router and through the
	// baseline with the same producers and batch, and single-message
	// produce (one message per request, SingleClients clients) through
	// the router; it reports both ratios to the batched baseline. Two
	// phases go through the Go client: SingleClients goroutines sending
	// one message at a time through one client.Producer, and one
	// goroutine publishing AsyncCount messages through a
	// client.Publisher; both are reported over the router's batched rate.
	ScenarioBenchProduce = "bench-produce"
	// ScenarioBenchConsume (issue 4) preloads Preload messages for the
	// router and for the baseline in each of Rounds rounds and drains each
	// with the same consumers (claim ClaimMax, ack in one request).
	ScenarioBenchConsume = "bench-consume"
)

// Scenarios lists the scenario names.
var Scenarios = []string{ScenarioProduce, ScenarioConsume, ScenarioMixed, ScenarioDedup, ScenarioDeadletter, ScenarioBaseline, ScenarioBenchProduce, ScenarioBenchConsume}

// Config is one run. Zero fields take the defaults named.
type Config struct {
	// Scenario is one of Scenarios. Defaults to mixed.
	Scenario string
	// Router is the router's base URL. Defaults to http://127.0.0.1:8080.
	// Unused by the baseline scenario.
	Router string
	// Routers, when set, are several routers over the same clusters
	// driven as one (Router is then ignored): requests are spread over
	// them as Routing says (RouteRoundRobin or RouteByKey; round robin by
	// default).
	Routers []string
	Routing string

	// Workers > 0 makes this run the coordinator of that many generator
	// processes (RunWorker) that share a mixed scenario: each takes
	// 1/Workers of the rates with Producers and Consumers of its own, and
	// streams its books here for one verification (coord.go). Listen is
	// the coordinator's address (default 127.0.0.1:0); OnCoordinator is
	// called with its URL once it listens (to start local workers).
	// ShareToken hands Token to the workers in their plan (only for a
	// token made for this run).
	Workers int
	Listen  string
	// Capacity is the load and hosts the report's capacity model sizes a
	// fleet for (defaults: 100k produced/s + 50k consumed/s).
	Capacity      CapacityTarget
	OnCoordinator func(url string) error
	ShareToken    bool
	// Token is the API token sent with every request to the router; ""
	// sends none (a router without a token file).
	Token string
	// SQSAccessKey and SQSSecret sign the SQS leg of bench-consume (an
	// access key of the router's -aws-credentials acting as an admin
	// token); "" sends it unsigned (a router without a token file).
	SQSAccessKey, SQSSecret string
	// Topology gives the clusters: needed for the baseline, the
	// per-cluster distribution and looking up keys that were not consumed.
	// Without it a run against the router still verifies by consumption,
	// but cannot tell a message still queued from a lost one.
	Topology *topology.Topology
	// Baseline also runs the scenario straight into MySQL and reports the
	// router/baseline ratios (always on for the bench scenarios).
	Baseline bool

	// Duration of each measured phase. Defaults to 60s (12s per phase in
	// the bench scenarios).
	Duration time.Duration
	// Warmup is excluded from the measurements at the start of each phase.
	// Defaults to 5s (2s in the bench scenarios).
	Warmup time.Duration
	// Drain bounds the time after Duration that consumers keep going so
	// that every acknowledged message is accounted for; they stop as soon
	// as it is. Defaults to 180s (the quarterly mix produces twice what it
	// consumes, so a backlog is expected).
	Drain time.Duration

	// ProduceRate and ConsumeRate are the targets in messages/s; 0 runs
	// closed loop (as fast as the workers go). The mixed scenarios default
	// to the quarterly 100,000 and 50,000; the others to 0.
	ProduceRate, ConsumeRate float64
	// Producers and Consumers are the concurrent workers. Default 8 and 4.
	Producers, Consumers int
	// Batch is messages per produce request. Defaults to 100.
	Batch int
	// ClaimMax is max per claim. Defaults to 100.
	ClaimMax int
	// SingleClients are the clients of the single-message phase of
	// bench-produce. Defaults to 64.
	SingleClients int
	// ClientProducer tunes the Go client's producer in bench-produce's
	// client phase (SingleClients goroutines sending one message at a
	// time through one client.Producer). Zero values take the client's
	// defaults.
	ClientProducer client.ProducerConfig
	// AsyncCount is how many messages bench-produce's async phase
	// publishes per round: one goroutine, one client.Publisher.Publish
	// call per message. Defaults to 200,000.
	AsyncCount int
	// AsyncPublisher tunes that phase's publisher. Zero values take the
	// client's defaults.
	AsyncPublisher client.PublisherConfig
	// Rounds of the bench scenarios, alternating the order of router and
	// baseline. Defaults to 2.
	Rounds int
	// Preload is messages per side and round of the consume scenarios.
	// Defaults to 100,000 (60,000 in bench-consume, to stay within 3
	// minutes on 2 cores).
	Preload int
	// SQSPreload is the backlog per side and round of bench-consume's SQS
	// leg (batches of 10 take ten times the requests of claims of 100).
	// Defaults to Preload, at most 20,000.
	SQSPreload int

	// Payload sizes. Defaults to uniform:100:300.
	Payload Dist
	// Keys: uniform, or a share on a few hot vshards.
	Keys KeyDist
	// Topics and Subscriptions per topic. Default 1 and 1 (the implicit
	// "default" subscription); more subscriptions need the router's
	// subscriptions API.
	Topics, Subscriptions int
	// DupShare of produced messages repeat an earlier key. Defaults to 0.5
	// in the dedup scenario, 0 elsewhere.
	DupShare float64
	// Consumer policy shares; NackShare defaults to 0.1 and RetryShare to
	// 0.05 in the deadletter scenario, 0 elsewhere.
	NackShare, RetryShare, DropShare float64
	// NackRetryAfter is the retry_after_ms of nacks. Defaults to 50ms.
	NackRetryAfter time.Duration
	// MaxAttempts of created subscriptions. Defaults to 5.
	MaxAttempts int
	// RetryBuffer bounds the items of unknown outcome (refused as
	// unavailable, or unanswered) that the producers hold for resending:
	// past it they take no new messages until the retriers stored some,
	// as a client's bounded buffer blocks its publisher (the asynchronous
	// client's MaxBuffered). Without it an open-loop schedule far above
	// what the system takes piles up every refused item of an outage (a
	// 5 s router restart at 100k/s: 500,000) on top of the backlog.
	// Defaults to 20,000; negative: unbounded.
	RetryBuffer int
	// Visibility is the claim's lease. Defaults to 10s.
	Visibility time.Duration
	// Wait is the claim's long poll. Defaults to 1s.
	Wait time.Duration
	// Durability of produces: "" (the router's default, primary) or
	// "replicated" (router only: the baseline commits on the primary).
	Durability string

	// Fault is killed FaultAt into the first router phase that has
	// producers and restarted FaultDown later. Defaults 20s and 5s.
	Fault              Fault
	FaultAt, FaultDown time.Duration

	// CPU lists the processes whose CPU each phase reports per message
	// (besides the whole machine, always reported when /proc is there).
	CPU []CPUSource

	// Command is recorded in the report (how to reproduce it).
	Command string
	// Progress receives the live line and phase messages. Defaults to
	// discarding them; Live rewrites one line in place (a terminal).
	Progress io.Writer
	Live     bool
}

func (c Config) withDefaults() (Config, error) {
	bench := c.Scenario == ScenarioBenchProduce || c.Scenario == ScenarioBenchConsume
	mixed := c.Scenario == ScenarioMixed || c.Scenario == ScenarioDedup || c.Scenario == ScenarioDeadletter || c.Scenario == ScenarioBaseline
	if c.Scenario == "" {
		c.Scenario, mixed = ScenarioMixed, true
	}
	known := false
	for _, s := range Scenarios {
		known = known || s == c.Scenario
	}
	if !known {
		return c, fmt.Errorf("config: Scenario %q is not one of %v", c.Scenario, Scenarios)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if len(c.Routers) > 0 {
		c.Router = c.Routers[0]
	}
	if c.Router == "" {
		c.Router = "http://127.0.0.1:8080"
	}
	if len(c.Routers) == 0 {
		c.Routers = []string{c.Router}
	}
	if bench {
		defD(&c.Duration, 12*time.Second)
		defD(&c.Warmup, 2*time.Second)
		c.Baseline = true
	}
	defD(&c.Duration, 60*time.Second)
	defD(&c.Warmup, 5*time.Second)
	defD(&c.Drain, 180*time.Second)
	if c.Warmup >= c.Duration {
		return c, fmt.Errorf("config: Warmup %s must be shorter than Duration %s", c.Warmup, c.Duration)
	}
	if mixed && c.ProduceRate == 0 && c.ConsumeRate == 0 {
		c.ProduceRate, c.ConsumeRate = 100000, 50000
	}
	def(&c.Producers, 8)
	def(&c.Consumers, 4)
	def(&c.Batch, 100)
	def(&c.ClaimMax, 100)
	def(&c.SingleClients, 64)
	def(&c.AsyncCount, 200000)
	def(&c.Rounds, 2)
	if c.Scenario == ScenarioBenchConsume {
		def(&c.Preload, 60000)
	}
	def(&c.Preload, 100000)
	def(&c.SQSPreload, min(c.Preload, 20000))
	def(&c.Topics, 1)
	def(&c.Subscriptions, 1)
	def(&c.MaxAttempts, 5)
	if c.Payload.Kind == "" {
		c.Payload = Dist{Kind: "uniform", A: 100, B: 300}
	}
	if c.Scenario == ScenarioDedup && c.DupShare == 0 {
		c.DupShare = 0.5
	}
	if c.Scenario == ScenarioDeadletter && c.NackShare == 0 && c.RetryShare == 0 {
		c.NackShare, c.RetryShare = 0.1, 0.05
	}
	defD(&c.NackRetryAfter, 50*time.Millisecond)
	defD(&c.Visibility, 10*time.Second)
	if c.RetryBuffer == 0 {
		c.RetryBuffer = 20000
	}
	defD(&c.Wait, time.Second)
	defD(&c.FaultAt, 20*time.Second)
	defD(&c.FaultDown, 5*time.Second)
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	switch {
	case c.Producers > maxWorkers || c.SingleClients > maxWorkers:
		return c, fmt.Errorf("config: at most %d producers", maxWorkers)
	case c.Topics > 255 || c.Topics*c.Subscriptions > maxPairs:
		return c, fmt.Errorf("config: Topics × Subscriptions is %d, at most %d", c.Topics*c.Subscriptions, maxPairs)
	case c.Producers < c.Topics:
		return c, fmt.Errorf("config: %d producers cannot write %d topics (one topic per producer)", c.Producers, c.Topics)
	case c.Scenario != ScenarioProduce && c.Scenario != ScenarioBenchProduce && c.Consumers < c.Topics*c.Subscriptions:
		return c, fmt.Errorf("config: %d consumers cannot serve %d subscriptions (one per consumer)", c.Consumers, c.Topics*c.Subscriptions)
	case c.DupShare < 0 || c.DupShare >= 1 || c.NackShare < 0 || c.NackShare > 1 || c.RetryShare < 0 || c.RetryShare > 1 || c.DropShare < 0 || c.DropShare > 1:
		return c, errors.New("config: shares must be within [0, 1] (DupShare below 1)")
	case c.Workers > 0 && (!mixed || c.Scenario == ScenarioBaseline || c.Baseline):
		return c, errors.New("config: Workers share the router mixed scenarios only (mixed, dedup, deadletter; no baseline)")
	case (c.Baseline || c.Scenario == ScenarioBaseline) && c.Topology == nil:
		return c, errors.New("config: the baseline needs Topology (the clusters' DSNs)")
	case c.Durability != "" && c.Durability != "primary" && c.Durability != "replicated":
		return c, fmt.Errorf("config: Durability %q is not primary or replicated", c.Durability)
	case c.DropShare > 0 && c.Drain < c.Visibility:
		return c, fmt.Errorf("config: Drain %s must exceed Visibility %s when consumers drop deliveries", c.Drain, c.Visibility)
	}
	return c, nil
}
