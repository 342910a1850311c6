// Command bench-peers measures the router against a real peer in the same
// run, on the same sandbox primary: Watermill-SQL's MySQL queue schema
// (one table per topic, delete on ack), publishing 100 messages per call
// and consuming in batches of 100. The router's phases are the load
// tester's bench-produce and bench-consume scenarios (bin/loadtest, run as
// a child); the peer's phases run here, one before and one after the
// router's, and the ratios use the mean of the two. Last lines:
//
//	consume ratio router/peer: R
//	produce ratio router/peer: R
//
// It is its own Go module so that the product's go.mod does not carry
// Watermill (docs/performance.md, "The peer").
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/internal/procstat"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/loadtest"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout))
}

type options struct {
	sandbox, loadtestBin, routerBin, out string
	preload, publishers, batch, subs     int
	duration, warmup                     time.Duration
	loadtestArgs                         string
	floorClients, floorCommitters        int
	floorConsumers                       int
	floorAck                             string
	floorLeasedOut                       bool
	ownerOnly                            bool
}

func run(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("bench-peers", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.sandbox, "sandbox", "var/sandbox", "sandbox directory (started as `make run` does when none answers there)")
	fs.StringVar(&o.loadtestBin, "loadtest", "bin/loadtest", "the load tester, which runs the router's phases")
	fs.StringVar(&o.routerBin, "router-bin", "bin/router", "the router binary the load tester runs")
	fs.StringVar(&o.out, "out", "var/loadtest/bench-peers", "report directory")
	fs.IntVar(&o.preload, "preload", 60000, "messages drained per consume phase (the router's bench-consume default)")
	fs.IntVar(&o.publishers, "publishers", 8, "concurrent publishers of the peer's publish phase (the router's producers)")
	fs.IntVar(&o.batch, "batch", 100, "messages per publish call and per subscriber batch")
	fs.IntVar(&o.subs, "subscribers", 1, "the peer's subscribers (its queue schema locks the head rows FOR UPDATE without SKIP LOCKED, so more wait on each other)")
	fs.DurationVar(&o.duration, "duration", 12*time.Second, "each publish phase (the router's bench-produce phase length)")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "excluded at the start of each publish phase")
	fs.StringVar(&o.loadtestArgs, "loadtest-args", "", "extra flags for the load tester's runs")
	fs.IntVar(&o.floorClients, "floor-clients", 64, "one-message-at-a-time senders of the floor's single-message phase (the client scenario's goroutines)")
	fs.IntVar(&o.floorCommitters, "floor-committers", 2, "transactions in flight of the floor's ideal group commit")
	fs.StringVar(&o.floorAck, "floor-ack", "budget", "what the floor's ack writes besides the delete: budget (DESIGN §6: acked trace row and status), folded (the acked event in the status update), delete-only")
	fs.BoolVar(&o.floorLeasedOut, "floor-leased-out", false, "the floor moves leased deliveries out of the claim index's range (not the product's layout)")
	fs.IntVar(&o.floorConsumers, "floor-consumers", 4, "consumers of the floor's consume phase (the router's bench-consume consumers)")
	fs.BoolVar(&o.ownerOnly, "owner-only", false, "run only the peer's and the owner floor's consume phases")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench(ctx, o, stdout); err != nil {
		fmt.Fprintf(os.Stderr, "bench-peers: %v\n", err)
		return 1
	}
	return 0
}

// phase is one measured phase of the run, the peer's or the router's.
type phase struct {
	Name     string            `json:"name"`
	Target   string            `json:"target"` // router or peer
	Work     string            `json:"work"`   // produce or consume
	Messages int64             `json:"messages"`
	Seconds  float64           `json:"seconds"`
	PerSec   float64           `json:"per_second"`
	CPU      []loadtest.CPUUse `json:"cpu,omitempty"`
	Problems []string          `json:"problems,omitempty"`
}

type report struct {
	Started  time.Time          `json:"started"`
	Command  string             `json:"command"`
	Servers  string             `json:"servers"`
	Load     string             `json:"load_avg_at_start"`
	Lifetime lifetime           `json:"onerow_lifetime"`
	Peer     string             `json:"peer"`
	Phases   []phase            `json:"phases"`
	Ratios   map[string]float64 `json:"ratios"`
	Problems []string           `json:"problems,omitempty"`
}

func bench(ctx context.Context, o options, stdout io.Writer) error {
	bed, started, err := loadtest.EnsureSandbox(ctx, o.sandbox, 2, 1, stdout)
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	if started {
		fmt.Fprintf(stdout, "started a sandbox in %s (it keeps running; `make stop` stops it)\n", o.sandbox)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	rep := &report{Started: time.Now().UTC(), Command: "bench-peers " + strings.Join(os.Args[1:], " "),
		Load: strings.Join(strings.Fields(string(load))[:3], " "),
		Peer: "Watermill-SQL v4 MySQLQueueSchema + MySQLQueueOffsetsAdapter{DeleteOnAck: true}, database peer_watermill on " + bed.Clusters[0].Name + "'s primary"}

	primary := bed.Clusters[0].Primary
	if err := createDB(ctx, primary.DSN("")); err != nil {
		return err
	}
	// The same driver settings a hand-tuned client (and the router) uses:
	// values interpolated, so a 100-message insert is one round trip.
	db, err := sql.Open("mysql", primary.DSN("peer_watermill")+"?interpolateParams=true&parseTime=true")
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	rep.Servers, err = loadtest.ServerSettingsOf(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "servers: %s\n", rep.Servers)

	cpu := []loadtest.CPUSource{loadtest.SelfCPU(), loadtest.SandboxCPU(bed)}
	p := &peer{db: db, o: o, cpu: cpu}
	addPeer := func(ph phase, err error) error {
		if err != nil {
			return err
		}
		rep.Phases = append(rep.Phases, ph)
		fmt.Fprintf(stdout, "%s: %.0f messages/s (%d in %.1f s)\n", ph.Name, ph.PerSec, ph.Messages, ph.Seconds)
		return nil
	}
	ack, err := loadtest.ParseFloorAck(o.floorAck)
	if err != nil {
		return err
	}
	fl, err := newFloor(ctx, primary.DSN(""), "peer_floor", o, cpu, func(db *sql.DB) *loadtest.Floor {
		return &loadtest.Floor{DB: db, Acks: ack, LeasedOut: o.floorLeasedOut}
	})
	if err != nil {
		return err
	}
	defer fl.close()
	// The inline layout (no delivery row for the default subscription;
	// docs/performance.md, "The baseline, the peer and the floor"), with
	// the product's final ack on the message row, its only ack.
	inline, err := newFloor(ctx, primary.DSN(""), "peer_floor_inline", o, cpu, func(db *sql.DB) *loadtest.Floor {
		return &loadtest.Floor{DB: db, Layout: loadtest.LayoutInline, Acks: loadtest.AckFolded}
	})
	if err != nil {
		return err
	}
	defer inline.close()
	// The one-row layout (the message row is the dedup registry and the
	// default subscription's delivery; not partitioned), with the same
	// final ack as the inline layout.
	onerow, err := newFloor(ctx, primary.DSN(""), "peer_floor_onerow", o, cpu, func(db *sql.DB) *loadtest.Floor {
		return &loadtest.Floor{DB: db, Layout: loadtest.LayoutOneRow, Acks: loadtest.AckFolded}
	})
	if err != nil {
		return err
	}
	defer onerow.close()
	// ownedFolded is the queue layout's owned consume with the product's
	// final ack (on the message row), the inline layout's counterpart.
	ownedFolded := func(name string) (phase, error) {
		acks := fl.f.Acks
		fl.f.Acks = loadtest.AckFolded
		defer func() { fl.f.Acks = acks }()
		ph, err := fl.consumeOwned(ctx, name)
		ph.Target = "floor-owned"
		return ph, err
	}
	if o.ownerOnly {
		if err := addPeer(p.consume(ctx, "peer consume #1")); err != nil {
			return err
		}
		for _, a := range []loadtest.FloorAck{loadtest.AckBudget, loadtest.AckFolded, loadtest.AckDeleteOnly} {
			fl.f.Acks = a
			if err := addPeer(fl.consumeOwned(ctx, "floor owned consume "+a.String())); err != nil {
				return err
			}
		}
		if err := addPeer(inline.consumeOwned(ctx, "floor inline owned consume")); err != nil {
			return err
		}
		if err := addPeer(onerow.consumeOwned(ctx, "floor onerow owned consume")); err != nil {
			return err
		}
		return addPeer(p.consume(ctx, "peer consume #2"))
	}
	// Produce: peer, router (bench-produce, one round: baseline, router
	// batched, router single), the floor (batched, single, inline
	// batched, one-row batched), peer.
	if err := addPeer(p.publish(ctx, "peer publish #1")); err != nil {
		return err
	}
	rp, err := routerPhases(ctx, o, "bench-produce", stdout)
	if err != nil {
		return err
	}
	rep.Phases = append(rep.Phases, rp...)
	if err := addPeer(fl.produceBatched(ctx, "floor publish")); err != nil {
		return err
	}
	if err := addPeer(fl.produceSingle(ctx, "floor single")); err != nil {
		return err
	}
	if err := addPeer(inline.produceBatched(ctx, "floor inline publish")); err != nil {
		return err
	}
	if err := addPeer(onerow.produceBatched(ctx, "floor onerow publish")); err != nil {
		return err
	}
	// What the one-row layout defers: its rows leave by deletes, their
	// keys kept, where the other layouts drop a month's partition.
	settle := func(ctx context.Context) error {
		if err := testbed.WaitReplicated(ctx, bed); err != nil {
			return fmt.Errorf("settle the servers: %w", err)
		}
		return ctxwait.Sleep(ctx, 3*time.Second)
	}
	if err := addPeer(onerow.retire(ctx, "floor onerow retire", settle)); err != nil {
		return err
	}
	if err := addPeer(p.publish(ctx, "peer publish #2")); err != nil {
		return err
	}
	// Consume: peer, router (bench-consume, one round), the floor
	// (durable leases; owned in every layout), peer.
	if err := addPeer(p.consume(ctx, "peer consume #1")); err != nil {
		return err
	}
	rc, err := routerPhases(ctx, o, "bench-consume", stdout)
	if err != nil {
		return err
	}
	rep.Phases = append(rep.Phases, rc...)
	consumeName := "floor consume"
	if o.floorAck != "budget" {
		consumeName += " (ack " + o.floorAck + ", not DESIGN §6)"
	}
	if o.floorLeasedOut {
		consumeName += " (leased out of the claim range)"
	}
	if err := addPeer(fl.consume(ctx, consumeName)); err != nil {
		return err
	}
	if err := addPeer(ownedFolded("floor owned consume (ack folded)")); err != nil {
		return err
	}
	if err := addPeer(inline.consumeOwned(ctx, "floor inline owned consume")); err != nil {
		return err
	}
	if err := addPeer(onerow.consumeOwned(ctx, "floor onerow owned consume")); err != nil {
		return err
	}
	if err := addPeer(p.consume(ctx, "peer consume #2")); err != nil {
		return err
	}

	rep.Ratios = map[string]float64{
		"consume":              rate(rep.Phases, "router", "consume") / rate(rep.Phases, "peer", "consume"),
		"produce":              rate(rep.Phases, "router", "produce") / rate(rep.Phases, "peer", "produce"),
		"floor_consume":        rate(rep.Phases, "floor", "consume") / rate(rep.Phases, "peer", "consume"),
		"floor_produce":        rate(rep.Phases, "floor", "produce") / rate(rep.Phases, "peer", "produce"),
		"router_floor_consume": rate(rep.Phases, "router", "consume") / rate(rep.Phases, "floor", "consume"),
		"router_floor_produce": rate(rep.Phases, "router", "produce") / rate(rep.Phases, "floor", "produce"),
		"floor_single":         rate(rep.Phases, "floor", "single") / rate(rep.Phases, "floor", "produce"),
		"floor_owned_consume":  rate(rep.Phases, "floor-owned", "consume") / rate(rep.Phases, "peer", "consume"),
		"floor_inline_consume": rate(rep.Phases, "floor-inline", "consume") / rate(rep.Phases, "peer", "consume"),
		"floor_inline_produce": rate(rep.Phases, "floor-inline", "produce") / rate(rep.Phases, "peer", "produce"),
		"floor_onerow_consume": rate(rep.Phases, "floor-onerow", "consume") / rate(rep.Phases, "peer", "consume"),
		"floor_onerow_produce": rate(rep.Phases, "floor-onerow", "produce") / rate(rep.Phases, "peer", "produce"),
	}
	rep.Lifetime = lifetime{
		QueuePublish:  serversPerMessage(rep.Phases, "floor publish"),
		OneRowPublish: serversPerMessage(rep.Phases, "floor onerow publish"),
		OneRowRetire:  serversPerMessage(rep.Phases, "floor onerow retire"),
	}
	for _, ph := range rep.Phases {
		for _, pr := range ph.Problems {
			rep.Problems = append(rep.Problems, ph.Name+": "+pr)
		}
	}
	md := rep.markdown()
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(o.out, "report.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, md)
	fmt.Fprintf(stdout, "report: %s\n", filepath.Join(o.out, "report.md"))
	fmt.Fprintf(stdout, "floor consume ratio floor/peer: %.2f\n", rep.Ratios["floor_consume"])
	fmt.Fprintf(stdout, "floor produce ratio floor/peer: %.2f\n", rep.Ratios["floor_produce"])
	fmt.Fprintf(stdout, "floor single-message ratio floor single/floor batched: %.2f\n", rep.Ratios["floor_single"])
	fmt.Fprintf(stdout, "floor owned consume ratio floor/peer: %.2f\n", rep.Ratios["floor_owned_consume"])
	fmt.Fprintf(stdout, "floor inline produce ratio floor/peer: %.2f\n", rep.Ratios["floor_inline_produce"])
	fmt.Fprintf(stdout, "floor inline consume ratio floor/peer: %.2f\n", rep.Ratios["floor_inline_consume"])
	fmt.Fprintf(stdout, "floor onerow produce ratio floor/peer: %.2f\n", rep.Ratios["floor_onerow_produce"])
	fmt.Fprintf(stdout, "floor onerow consume ratio floor/peer: %.2f\n", rep.Ratios["floor_onerow_consume"])
	fmt.Fprintf(stdout, "floor onerow lifetime, servers µs per message: publish %.1f + retire %.1f = %.1f; three rows, publish (a month's partition dropped): %.1f\n",
		rep.Lifetime.OneRowPublish, rep.Lifetime.OneRowRetire, rep.Lifetime.OneRowPublish+rep.Lifetime.OneRowRetire, rep.Lifetime.QueuePublish)
	fmt.Fprintf(stdout, "consume ratio router/peer: %.2f\n", rep.Ratios["consume"])
	fmt.Fprintf(stdout, "produce ratio router/peer: %.2f\n", rep.Ratios["produce"])
	if len(rep.Problems) > 0 {
		return fmt.Errorf("%d problems (see the report)", len(rep.Problems))
	}
	return nil
}

// lifetime is what the servers spend on a message over its life in the
// floor's layouts, leaving the consume out (the owned consume phases'
// rows of the CPU table give it, layout by layout):
// the three-row layout writes its rows and drops them with their month's
// partition (nearly free); the one-row layout writes one row, then deletes
// it and keeps its key (Floor.Retire).
type lifetime struct {
	QueuePublish  float64 `json:"queue_publish_us"`
	OneRowPublish float64 `json:"onerow_publish_us"`
	OneRowRetire  float64 `json:"onerow_retire_us"`
}

// serversPerMessage is the mariadbd µs per message of the phase named
// name, 0 when there is none.
func serversPerMessage(ps []phase, name string) float64 {
	for _, p := range ps {
		if p.Name == name {
			if u, ok := p.cpu("mariadbd"); ok {
				return u.PerMessageUS
			}
		}
	}
	return 0
}

// cpu is the phase's CPU use of the source whose name begins with prefix.
func (p phase) cpu(prefix string) (loadtest.CPUUse, bool) {
	for _, u := range p.CPU {
		if strings.HasPrefix(u.Name, prefix) {
			return u, true
		}
	}
	return loadtest.CPUUse{}, false
}

// rate is the mean rate of target's phases of one kind of work (messages
// over seconds, so that two phases weigh by their length).
func rate(ps []phase, target, work string) float64 {
	var n int64
	var s float64
	for _, p := range ps {
		if p.Target == target && p.Work == work {
			n += p.Messages
			s += p.Seconds
		}
	}
	if s == 0 {
		return 0
	}
	return float64(n) / s
}

func createDB(ctx context.Context, dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{"DROP DATABASE IF EXISTS peer_watermill", "CREATE DATABASE peer_watermill"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("peer database: %s: %w", q, err)
		}
	}
	return nil
}

// routerPhases runs one round of a load-tester benchmark scenario against
// a router built from the current source, and returns its router phases.
func routerPhases(ctx context.Context, o options, scenario string, stdout io.Writer) ([]phase, error) {
	out := filepath.Join(o.out, "router-"+strings.TrimPrefix(scenario, "bench-"))
	args := []string{"-scenario", scenario, "-rounds", "1", "-sandbox", o.sandbox, "-router-bin", o.routerBin, "-out", out, "-progress", "lines"}
	args = append(args, strings.Fields(o.loadtestArgs)...)
	fmt.Fprintf(stdout, "running %s %s\n", o.loadtestBin, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, o.loadtestBin, args...)
	cmd.Stdout, cmd.Stderr = prefixed(stdout, "  | "), os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", o.loadtestBin, scenario, err)
	}
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		return nil, err
	}
	var lr loadtest.Report
	if err := json.Unmarshal(data, &lr); err != nil {
		return nil, fmt.Errorf("%s: %w", out, err)
	}
	var ps []phase
	for _, ph := range lr.Phases {
		if ph.Target != "router" {
			continue
		}
		if ph.Preload || ph.WindowS == 0 {
			continue
		}
		work, flow := "consume", ph.Consume
		if scenario == "bench-produce" {
			if strings.Contains(ph.Name, "single") {
				continue // the peer's publish is batched: compare batched
			}
			work, flow = "produce", ph.Produce
		}
		if flow == nil {
			continue
		}
		n := flow.Messages
		ps = append(ps, phase{Name: ph.Name, Target: "router", Work: work, Messages: n, Seconds: ph.WindowS,
			PerSec: float64(n) / ph.WindowS, CPU: ph.CPU})
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("%s: no router phase in the report", out)
	}
	ps[0].Problems = append(ps[0].Problems, lr.Summary.Problems...)
	return ps, nil
}

// peer drives Watermill-SQL.
type peer struct {
	db  *sql.DB
	o   options
	cpu []loadtest.CPUSource
	n   int // topics made
}

func (p *peer) logger() watermill.LoggerAdapter { return watermill.NopLogger{} }

func (p *peer) topic() string {
	p.n++
	return fmt.Sprintf("bench_%d_%d", time.Now().Unix(), p.n)
}

func (p *peer) publisher() (*wsql.Publisher, error) {
	return wsql.NewPublisher(wsql.BeginnerFromStdSQL(p.db), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}, AutoInitializeSchema: true}, p.logger())
}

// messages makes n messages of the load tester's payload size (100–300
// bytes, uniform) as JSON, the queue schema's payload type, with a key
// in the metadata.
func messages(n int, prefix string, seq *atomic.Int64) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		k := seq.Add(1)
		size := 100 + rand.IntN(201)
		body := fmt.Sprintf(`{"key":"%s-%d","p":"`, prefix, k)
		pad := size - len(body) - 2
		if pad < 0 {
			pad = 0
		}
		body += strings.Repeat("x", pad) + `"}`
		m := message.NewMessage(watermill.NewUUID(), []byte(body))
		m.Metadata.Set("key", fmt.Sprintf("%s-%d", prefix, k))
		out[i] = m
	}
	return out
}

// publish runs publishers closed loop for the duration, counting the
// messages whose insert committed after the warm-up.
func (p *peer) publish(ctx context.Context, name string) (phase, error) {
	pub, err := p.publisher()
	if err != nil {
		return phase{}, err
	}
	topic := p.topic()
	if err := pub.Publish(topic, messages(1, "init", new(atomic.Int64))...); err != nil { // creates the table
		return phase{}, fmt.Errorf("peer publish: %w", err)
	}
	tr := newTracker(p.cpu)
	start := time.Now()
	from, end := start.Add(p.o.warmup), start.Add(p.o.duration)
	var counted, total atomic.Int64
	var seq atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range p.o.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				msgs := messages(p.o.batch, fmt.Sprint("w", w), &seq)
				if err := pub.Publish(topic, msgs...); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				total.Add(int64(len(msgs)))
				if now := time.Now(); !now.Before(from) && !now.After(end) {
					counted.Add(int64(len(msgs)))
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return phase{}, fmt.Errorf("peer publish: %w", firstErr)
	}
	secs := p.o.duration.Seconds() - p.o.warmup.Seconds()
	ph := phase{Name: name, Target: "peer", Work: "produce", Messages: counted.Load(), Seconds: secs,
		PerSec: float64(counted.Load()) / secs, CPU: tr.finish(total.Load())}
	return ph, nil
}

// consume preloads the backlog (not measured) and drains it with the
// subscribers, each acking every message it gets; the rate is the backlog
// over the time from the subscription's start to the moment the table is
// empty (the last batch's delete committed). Every message must arrive
// once; a repeat (a redelivery) is a problem of the phase.
func (p *peer) consume(ctx context.Context, name string) (phase, error) {
	pub, err := p.publisher()
	if err != nil {
		return phase{}, err
	}
	topic := p.topic()
	var seq atomic.Int64
	var wg sync.WaitGroup
	per := p.o.preload / p.o.publishers
	errs := make(chan error, p.o.publishers)
	for w := range p.o.publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left := per; left > 0; left -= p.o.batch {
				if err := pub.Publish(topic, messages(min(left, p.o.batch), fmt.Sprint("c", w), &seq)...); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return phase{}, fmt.Errorf("peer preload: %w", err)
	}
	want := int64(per * p.o.publishers)

	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tr := newTracker(p.cpu)
	start := time.Now()
	var got atomic.Int64
	seen := sync.Map{}
	var dups atomic.Int64
	var subsWG sync.WaitGroup
	for range p.o.subs {
		sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(p.db), wsql.SubscriberConfig{
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: p.o.batch},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
			PollInterval:   10 * time.Millisecond,
		}, p.logger())
		if err != nil {
			return phase{}, err
		}
		ch, err := sub.Subscribe(cctx, topic)
		if err != nil {
			return phase{}, err
		}
		subsWG.Add(1)
		go func() {
			defer subsWG.Done()
			defer sub.Close()
			for m := range ch {
				if _, dup := seen.LoadOrStore(m.UUID, true); dup {
					dups.Add(1)
				}
				m.Ack()
				got.Add(1)
			}
		}()
	}
	// Done when the table is empty: every batch's delete committed.
	var end time.Time
	for {
		if got.Load() >= want {
			var left int64
			if err := p.db.QueryRowContext(cctx, "SELECT COUNT(*) FROM `watermill_"+topic+"`").Scan(&left); err != nil {
				return phase{}, err
			}
			if left == 0 {
				end = time.Now()
				break
			}
		}
		select {
		case <-cctx.Done():
			return phase{}, fmt.Errorf("peer consume: %d of %d after %s", got.Load(), want, time.Since(start).Round(time.Second))
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	subsWG.Wait()
	secs := end.Sub(start).Seconds()
	ph := phase{Name: name, Target: "peer", Work: "consume", Messages: want, Seconds: secs, PerSec: float64(want) / secs,
		CPU: tr.finish(want)}
	if d := dups.Load(); d > 0 {
		ph.Problems = append(ph.Problems, fmt.Sprintf("%d redelivered", d))
	}
	return ph, nil
}

// tracker is the CPU of a peer phase's processes and of the machine.
type tracker struct {
	srcs    []loadtest.CPUSource
	at      time.Time
	machine time.Duration
	first   []map[int]time.Duration
}

func newTracker(srcs []loadtest.CPUSource) *tracker {
	t := &tracker{srcs: srcs, at: time.Now(), machine: procstat.Machine()}
	for _, s := range srcs {
		m := map[int]time.Duration{}
		for _, pid := range s.PIDs() {
			m[pid], _ = procstat.Process(pid)
		}
		t.first = append(t.first, m)
	}
	return t
}

func (t *tracker) finish(msgs int64) []loadtest.CPUUse {
	wall := time.Since(t.at).Seconds()
	use := func(name string, d time.Duration) loadtest.CPUUse {
		u := loadtest.CPUUse{Name: name, Seconds: d.Seconds(), Cores: d.Seconds() / wall}
		if msgs > 0 {
			u.PerMessageUS = d.Seconds() * 1e6 / float64(msgs)
		}
		return u
	}
	out := []loadtest.CPUUse{use("machine", procstat.Machine()-t.machine)}
	for i, s := range t.srcs {
		var d time.Duration
		for pid, c0 := range t.first[i] {
			if c, ok := procstat.Process(pid); ok {
				d += c - c0
			}
		}
		name := s.Name
		if name == "loadtest" {
			name = "generator (peer client)"
		}
		out = append(out, use(name, d))
	}
	return out
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("# bench-peers %s\n\n", r.Started.Format(time.RFC3339))
	w("- command: `%s`\n- servers: %s\n- load average at start: %s\n- peer: %s\n\n", r.Command, r.Servers, r.Load, r.Peer)
	w("| phase | messages | seconds | messages/s |\n|---|---:|---:|---:|\n")
	for _, p := range r.Phases {
		w("| %s | %d | %.1f | %.0f |\n", p.Name, p.Messages, p.Seconds, p.PerSec)
	}
	w("\nCPU per message (µs; the router's phases count warm-up and drain, the peer's its whole phase; cores busy of the machine's):\n\n")
	w("| phase | cores busy | machine | generator | router | mariadbd |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Phases {
		get := func(prefix string) string {
			if u, ok := p.cpu(prefix); ok {
				return fmt.Sprintf("%.0f", u.PerMessageUS)
			}
			return "—"
		}
		cores := "—"
		for _, u := range p.CPU {
			if u.Name == "machine" {
				cores = fmt.Sprintf("%.2f", u.Cores)
			}
		}
		gen := get("loadtest")
		if gen == "—" {
			gen = get("generator")
		}
		w("| %s | %s | %s | %s | %s | %s |\n", p.Name, cores, get("machine"), gen, get("router"), get("mariadbd"))
	}
	w("\n| ratio (router / peer, mean of the peer's two phases) | |\n|---|---:|\n")
	w("| consume | %.2f |\n| produce (router batched 100 per request / peer 100 per publish) | %.2f |\n", r.Ratios["consume"], r.Ratios["produce"])
	w("\nThe floor (DESIGN §6's rows by hand, no router; docs/performance.md, \"The floor\"):\n\n| ratio | |\n|---|---:|\n")
	w("| floor consume / peer consume | %.2f |\n| floor publish / peer publish | %.2f |\n", r.Ratios["floor_consume"], r.Ratios["floor_produce"])
	w("| router consume / floor consume | %.2f |\n| router batched produce / floor publish | %.2f |\n", r.Ratios["router_floor_consume"], r.Ratios["router_floor_produce"])
	w("| floor single (ideal group commit) / floor publish | %.2f |\n", r.Ratios["floor_single"])
	w("| floor owned consume (queue layout, ack folded) / peer consume | %.2f |\n", r.Ratios["floor_owned_consume"])
	w("| floor inline publish (no delivery row: 2 rows) / peer publish | %.2f |\n", r.Ratios["floor_inline_produce"])
	w("| floor inline owned consume (1 update) / peer consume | %.2f |\n", r.Ratios["floor_inline_consume"])
	w("| floor onerow publish (the message row is the dedup key: 1 row) / peer publish | %.2f |\n", r.Ratios["floor_onerow_produce"])
	w("| floor onerow owned consume (1 update) / peer consume | %.2f |\n", r.Ratios["floor_onerow_consume"])
	w("\nWhat the one-row layout defers (servers' µs per message): it publishes at %.1f and retires (a delete, its key kept) at %.1f, %.1f in all; the three rows publish at %.1f and leave with their month's partition.\n",
		r.Lifetime.OneRowPublish, r.Lifetime.OneRowRetire, r.Lifetime.OneRowPublish+r.Lifetime.OneRowRetire, r.Lifetime.QueuePublish)
	for _, p := range r.Problems {
		w("\nPROBLEM: %s\n", p)
	}
	return b.String()
}

// prefixed writes w's lines with a prefix.
func prefixed(w io.Writer, prefix string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 4096)
		for {
			n, err := pr.Read(tmp)
			buf = append(buf, tmp[:n]...)
			for {
				i := strings.IndexAny(string(buf), "\n\r")
				if i < 0 {
					break
				}
				if i > 0 {
					fmt.Fprintf(w, "%s%s\n", prefix, buf[:i])
				}
				buf = buf[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	return pw
}
