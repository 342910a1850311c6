package loadtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is what a run writes as report.json and report.md.
type Report struct {
	RunID    string    `json:"run_id"`
	Scenario string    `json:"scenario"`
	Command  string    `json:"command"`
	Router   string    `json:"router,omitempty"`
	Started  time.Time `json:"started"`
	ElapsedS float64   `json:"elapsed_s"`
	Host     Host      `json:"host"`
	Settings Settings  `json:"settings"`
	// Servers is the MariaDB sizing of the clusters' servers (read from
	// the first primary), when the run knew the topology.
	Servers string        `json:"servers,omitempty"`
	Phases  []PhaseReport `json:"phases"`
	Results []Result      `json:"results"`
	// Ratios: produce (router/baseline, batched), consume (router/
	// baseline), single_vs_batched_baseline (one message per request
	// through the router against the batched baseline),
	// client_single_vs_router_batched and client_async_vs_router_batched
	// (the Go client's Producer and Publisher phases against the router's
	// batched rate).
	Ratios       map[string]float64 `json:"ratios,omitempty"`
	Verification []Verification     `json:"verification"`
	Summary      Summary            `json:"summary"`
	// Capacity is the fleet the CPU per message of this run asks for at
	// the capacity target, and what limited the run (capacity.go).
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Host describes the machine the numbers come from.
type Host struct {
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
	Load1      string `json:"load_avg_at_start,omitempty"`
}

// Settings are the knobs of the run.
type Settings struct {
	Producers      int     `json:"producers"`
	Consumers      int     `json:"consumers"`
	Batch          int     `json:"batch"`
	ClaimMax       int     `json:"claim_max"`
	SingleClients  int     `json:"single_clients,omitempty"`
	AsyncCount     int     `json:"async_count,omitempty"`
	ProduceRate    float64 `json:"produce_rate_target"`
	ConsumeRate    float64 `json:"consume_rate_target"`
	DurationS      float64 `json:"duration_s"`
	WarmupS        float64 `json:"warmup_s"`
	DrainS         float64 `json:"drain_s"`
	Payload        string  `json:"payload"`
	Keys           string  `json:"keys"`
	Topics         int     `json:"topics"`
	Subscriptions  int     `json:"subscriptions"`
	DupShare       float64 `json:"dup_share"`
	NackShare      float64 `json:"nack_share"`
	RetryShare     float64 `json:"retry_share"`
	DropShare      float64 `json:"drop_share"`
	VisibilityS    float64 `json:"visibility_timeout_s"`
	Durability     string  `json:"durability"`
	Rounds         int     `json:"rounds,omitempty"`
	Preload        int     `json:"preload,omitempty"`
	Fault          string  `json:"fault,omitempty"`
	FaultAtS       float64 `json:"fault_at_s,omitempty"`
	FaultDownS     float64 `json:"fault_down_s,omitempty"`
	BaselineIncl   bool    `json:"baseline"`
	SandboxCluster int     `json:"clusters,omitempty"`
	// Routers driven as one fleet and how requests were spread over them;
	// Workers: generator processes that shared the run (coordinator mode).
	Routers int    `json:"routers,omitempty"`
	Routing string `json:"routing,omitempty"`
	Workers int    `json:"workers,omitempty"`
}

// Result is one measured figure, summed over the rounds that measured it.
type Result struct {
	Name      string  `json:"name"` // e.g. "router produce batch 100"
	Target    string  `json:"target"`
	Messages  int64   `json:"messages"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
}

// Summary is the verdict.
type Summary struct {
	Lost           int64   `json:"lost"`
	Duplicated     int64   `json:"duplicated"`
	Pending        int64   `json:"pending"`
	ProducedPerSec float64 `json:"produced_per_s"`
	ConsumedPerSec float64 `json:"consumed_per_s"`
	// Passed: nothing lost or truly duplicated, no unexpected message,
	// no corrupt payload, every fault injected and repaired.
	Passed   bool     `json:"passed"`
	Problems []string `json:"problems,omitempty"`
}

// FaultEvent is one kill or restart during a phase.
type FaultEvent struct {
	Target string  `json:"target"`
	Action string  `json:"action"`
	At     float64 `json:"at_s"`
	Took   float64 `json:"took_s,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// Recovery describes a flow's dip around a fault, from the timeline.
type Recovery struct {
	Flow string `json:"flow"` // produced or consumed
	// Before is the mean rate over the measured seconds before the kill.
	Before float64 `json:"before_per_s"`
	// Low is the lowest one-second rate from the kill to the recovery.
	Low float64 `json:"low_per_s"`
	// RecoveredAt is the first second after the restart whose rate was
	// back to 80 % of Before; -1 if it never was before the phase ended.
	RecoveredAt float64 `json:"recovered_at_s"`
	// AfterRestart is RecoveredAt minus the restart time.
	AfterRestart float64 `json:"recovered_after_restart_s"`
}

// Flow is one direction of a phase's traffic.
type Flow struct {
	Messages  int64   `json:"messages"`
	PerSecond float64 `json:"per_second"`
	Target    float64 `json:"target_per_second,omitempty"`
	Requests  int64   `json:"requests,omitempty"`
	// Latency: produce requests from their intended send time; claims
	// from theirs.
	Latency    Percentiles  `json:"latency"`
	AckLatency *Percentiles `json:"ack_latency,omitempty"`
	// EndToEnd: from the message's production to its first delivery.
	EndToEnd *Percentiles `json:"end_to_end,omitempty"`
}

// ClusterShare is one cluster's part of a phase's messages.
type ClusterShare struct {
	Cluster  string  `json:"cluster"`
	Produced int64   `json:"produced"`
	Consumed int64   `json:"consumed"`
	Share    float64 `json:"produced_share"`
}

// PhaseReport is one phase's measurements.
type PhaseReport struct {
	Name        string           `json:"name"`
	Target      string           `json:"target"`
	Kind        string           `json:"kind"`
	Preload     bool             `json:"preload,omitempty"`
	Producers   int              `json:"producers,omitempty"`
	Consumers   int              `json:"consumers,omitempty"`
	Batch       int              `json:"batch,omitempty"`
	ClaimMax    int              `json:"claim_max,omitempty"`
	ElapsedS    float64          `json:"elapsed_s"`
	WindowS     float64          `json:"window_s"`
	Produce     *Flow            `json:"produce,omitempty"`
	Consume     *Flow            `json:"consume,omitempty"`
	Offered     int64            `json:"offered"`
	Behind      int64            `json:"behind_requests,omitempty"`
	Unresolved  int64            `json:"unresolved,omitempty"`
	Errors      map[string]int64 `json:"errors,omitempty"`
	Statuses    map[string]int64 `json:"statuses,omitempty"`
	Clusters    []ClusterShare   `json:"clusters,omitempty"`
	VShardsUsed int              `json:"vshards_used"`
	HotVShards  []Hot            `json:"hot_vshards,omitempty"`
	Faults      []FaultEvent     `json:"faults,omitempty"`
	Recovery    []Recovery       `json:"recovery,omitempty"`
	Timeline    []Point          `json:"timeline"`
	// CPU is where the machine's cores went during the phase, and
	// CPUTimeline second by second.
	CPU         []CPUUse   `json:"cpu,omitempty"`
	CPUTimeline []CPUPoint `json:"cpu_timeline,omitempty"`
	// Generators are the workers of a fleet run, each on its own machine
	// as far as it knows: how busy it kept that machine's cores.
	Generators []GeneratorUse `json:"generators,omitempty"`
}

// GeneratorUse is one worker's CPU over its phase.
type GeneratorUse struct {
	Worker       int     `json:"worker"`
	CPUs         int     `json:"cpus"`
	Cores        float64 `json:"cores"`         // the worker process
	MachineCores float64 `json:"machine_cores"` // its whole machine
}

func (p *phase) report() PhaseReport {
	s := p.spec
	now := time.Now()
	r := PhaseReport{Name: s.Name, Target: p.wl.target.Name(), Kind: s.Kind, Preload: s.Preload, Batch: s.Batch,
		ElapsedS: now.Sub(p.start).Seconds(), Offered: p.offered.Load(), Behind: p.prodPacer.Behind(),
		Unresolved: int64(p.retry.len()), Errors: p.errs.Map(), Statuses: p.statuses.Map()}
	winEnd := now
	if winEnd.After(p.end) {
		winEnd = p.end
	}
	window := winEnd.Sub(p.measureFrom).Seconds()
	if s.Count > 0 || s.Kind == "consume" {
		window = now.Sub(p.start).Seconds()
	}
	if last := p.lastProduce.Load(); s.Count > 0 && last > 0 {
		// A fixed count written: rate over the time it took, from the
		// start to the last answer that stored one.
		window = time.Unix(0, last).Sub(p.start).Seconds()
	}
	r.WindowS = window
	if s.Kind != "consume" {
		r.Producers = s.Producers
		f := &Flow{Target: s.ProduceRate, Requests: p.mRequests.Load(), Latency: p.produceLat.Percentiles()}
		f.Messages = p.mProduced.Load()
		if s.Count > 0 {
			f.Messages = p.produced.Load()
		}
		if window > 0 {
			f.PerSecond = float64(f.Messages) / window
		}
		r.Produce = f
	}
	if s.Kind != "produce" {
		r.Consumers, r.ClaimMax = s.Consumers, s.ClaimMax
		ack, e2e := p.ackLat.Percentiles(), p.e2eLat.Percentiles()
		f := &Flow{Target: s.ConsumeRate, Latency: p.claimLat.Percentiles(), AckLatency: &ack, EndToEnd: &e2e}
		if s.Kind == "consume" {
			// A fixed backlog drained: rate over the time it took, from the
			// start to the last confirmed ack.
			f.Messages = p.consumed.Load()
			f.Target = 0
			if last := p.lastAck.Load(); last > 0 {
				r.WindowS = time.Unix(0, last).Sub(p.start).Seconds()
			}
		} else {
			f.Messages = p.mConsumed.Load()
		}
		if r.WindowS > 0 {
			f.PerSecond = float64(f.Messages) / r.WindowS
		}
		if s.Kind == "mixed" && window > 0 {
			f.PerSecond = float64(f.Messages) / window
		}
		r.Consume = f
	}
	for i, c := range p.cls {
		cs := ClusterShare{Cluster: c, Produced: p.clProduced[i].Load(), Consumed: p.clConsumed[i].Load()}
		if tot := p.produced.Load(); tot > 0 {
			cs.Share = float64(cs.Produced) / float64(tot)
		}
		r.Clusters = append(r.Clusters, cs)
	}
	r.HotVShards, r.VShardsUsed = p.vshards.top(5)
	r.Timeline = p.timeline.points(int(r.ElapsedS) + 1)
	p.faultMu.Lock()
	r.Faults = append([]FaultEvent(nil), p.faults...)
	p.faultMu.Unlock()
	r.Recovery = recovery(r.Timeline, r.Faults, s.Warmup.Seconds(), s.Kind)
	return r
}

// recovery measures the dip and the recovery of each flow around the
// first kill and restart.
func recovery(tl []Point, faults []FaultEvent, warmup float64, kind string) []Recovery {
	var kill, restart float64 = -1, -1
	for _, f := range faults {
		if f.Error != "" {
			continue
		}
		switch {
		case f.Action == "kill -9" && kill < 0:
			kill = f.At
		case f.Action == "restart" && restart < 0:
			restart = f.At + f.Took
		}
	}
	if kill < 0 || restart < 0 {
		return nil
	}
	var out []Recovery
	for _, flow := range []string{"produced", "consumed"} {
		if (flow == "produced" && kind == "consume") || (flow == "consumed" && kind == "produce") {
			continue
		}
		val := func(p Point) float64 {
			if flow == "produced" {
				return float64(p.Produced)
			}
			return float64(p.Consumed)
		}
		rec := Recovery{Flow: flow, RecoveredAt: -1, Low: -1}
		var sum, n float64
		for _, p := range tl {
			if float64(p.Second) >= warmup && float64(p.Second+1) <= kill {
				sum += val(p)
				n++
			}
		}
		if n == 0 {
			continue
		}
		rec.Before = sum / n
		for _, p := range tl {
			t := float64(p.Second)
			if t+1 <= kill {
				continue
			}
			if rec.Low < 0 || val(p) < rec.Low {
				rec.Low = val(p)
			}
			if t >= restart && val(p) >= 0.8*rec.Before {
				rec.RecoveredAt = t
				rec.AfterRestart = t - restart
				break
			}
		}
		out = append(out, rec)
	}
	return out
}

// Write writes report.json, report.md and report.html into dir (created
// if needed).
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.Markdown()), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), []byte(r.HTML()), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// Markdown renders the report for people.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# shardmq load test: %s\n\n", r.Scenario)
	for _, f := range r.facts(func(s string) string { return "`" + s + "`" }) {
		w("- %s\n", f)
	}

	w("\n## Verdict\n\n")
	sm := r.Summary
	verdict := "PASSED"
	if !sm.Passed {
		verdict = "FAILED: " + strings.Join(sm.Problems, "; ")
	}
	w("**%s** — lost %d, duplicated %d, pending %d; produced %s/s, consumed %s/s\n",
		verdict, sm.Lost, sm.Duplicated, sm.Pending, human(sm.ProducedPerSec), human(sm.ConsumedPerSec))

	if len(r.Ratios) > 0 || len(r.Results) > 0 {
		w("\n## Throughput\n\n")
		resultsTable(r.Results).markdown(w)
		if len(r.Ratios) > 0 {
			w("\n")
			ratiosTable(r.Ratios).markdown(w)
		}
	}

	w("\n## Phases\n\n")
	phasesTable(r.Phases).markdown(w)

	r.writeCPU(w)
	r.writeCapacity(w)

	w("\n## Verification\n\n")
	verificationTable(r.Verification).markdown(w)
	for _, v := range r.Verification {
		if notes := verificationNotes(v); len(notes) > 0 {
			w("\n- %s: %s", v.Workload, strings.Join(notes, "; "))
		}
	}
	w("\n")

	for _, p := range r.Phases {
		if p.Preload {
			continue
		}
		w("\n### %s\n\n", p.Name)
		if len(p.Clusters) > 0 {
			clustersTable(p).markdown(w)
			w("\n")
		}
		if hot := hotText(p); hot != "" {
			w("%s\n\n", hot)
		}
		for _, n := range phaseNotes(p) {
			w("%s\n\n", n)
		}
		if len(p.Errors) > 0 {
			errorsTable(p).markdown(w)
			w("\n")
		}
		if len(p.Faults) > 0 {
			faultsTable(p).markdown(w)
			w("\n")
			for _, l := range recoveryLines(p) {
				w("- %s\n", l)
			}
			w("\n")
			timelineTable(p).markdown(w)
			w("\n")
		}
	}
	return b.String()
}

// hotText names the busiest vshards of a phase.
func hotText(p PhaseReport) string {
	if len(p.HotVShards) == 0 {
		return ""
	}
	var hs []string
	for _, h := range p.HotVShards {
		hs = append(hs, fmt.Sprintf("%d (%.1f %%)", h.VShard, 100*h.Share))
	}
	return fmt.Sprintf("%d vshards used; busiest: %s", p.VShardsUsed, strings.Join(hs, ", "))
}

// phaseNotes say what the open loop left undone.
func phaseNotes(p PhaseReport) []string {
	var out []string
	if p.Behind > 0 {
		out = append(out, fmt.Sprintf("Open loop: %d requests were still due when the phase ended (the target rate was not reached).", p.Behind))
	}
	if p.Unresolved > 0 {
		out = append(out, fmt.Sprintf("%d produced items never got a definite answer (not counted as acknowledged).", p.Unresolved))
	}
	return out
}

func pct(p Percentiles) string {
	if p.Count == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f / %.1f / %.1f", p.P50, p.P99, p.P999)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// cpuText says what the CPU table measures.
func (r *Report) cpuText() string {
	return fmt.Sprintf("CPU time over each whole phase (warm-up and drain included) over the messages it moved (a message produced and consumed in the phase counts twice); cores busy is the mean over the phase, of %d. A figure marked * misses up to a second of a process that ended during the phase.", r.Host.CPUs)
}

// writeCPU writes where each phase's CPU went, per message, when it was
// measured.
func (r *Report) writeCPU(w func(string, ...any)) {
	if !hasCPU(r.Phases) {
		return
	}
	w("\n## CPU per message\n\n%s\n\n", r.cpuText())
	cpuTable(r.Phases).markdown(w)
}

func hasCPU(ps []PhaseReport) bool {
	for _, p := range ps {
		if len(p.CPU) > 0 {
			return true
		}
	}
	return false
}
