package loadtest

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strings"
	"time"
)

// HTML renders the report as one self-contained page (report.html): the
// tables of report.md and, per phase, charts over time — throughput
// produced and consumed against the targets, p50 and p99 latency, errors,
// the CPU of each part of the machine — with the warm-up, the end of the
// schedule and any fault marked, and each cluster's share. The charts are
// inline SVG (svgchart.go); a Content-Security-Policy of its own forbids
// the page any script or network access, so it reads the same offline.
func (r *Report) HTML() string {
	var b strings.Builder
	esc := html.EscapeString
	b.WriteString(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
`)
	fmt.Fprintf(&b, "<title>shardmq load test: %s %s</title>\n<style>%s</style>\n</head><body>\n", esc(r.Scenario), esc(r.RunID), reportCSS)
	fmt.Fprintf(&b, "<h1>shardmq load test: %s</h1>\n<ul class=\"facts\">\n", esc(r.Scenario))
	for _, f := range r.facts(func(s string) string { return s }) {
		fmt.Fprintf(&b, "<li>%s</li>\n", esc(f))
	}
	b.WriteString("</ul>\n")

	sm := r.Summary
	cls, verdict := "pass", "PASSED"
	if !sm.Passed {
		cls, verdict = "fail", "FAILED: "+strings.Join(sm.Problems, "; ")
	}
	fmt.Fprintf(&b, `<p class="verdict %s" data-verdict=%q><strong>%s</strong> — lost %d, duplicated %d, pending %d; produced %s/s, consumed %s/s</p>`+"\n",
		cls, cls, esc(verdict), sm.Lost, sm.Duplicated, sm.Pending, human(sm.ProducedPerSec), human(sm.ConsumedPerSec))

	if len(r.Results) > 0 || len(r.Ratios) > 0 {
		b.WriteString("<h2>Throughput</h2>\n")
		resultsTable(r.Results).html(&b, "results")
		if len(r.Ratios) > 0 {
			ratiosTable(r.Ratios).html(&b, "ratios")
		}
	}
	b.WriteString("<h2>Phases</h2>\n")
	phasesTable(r.Phases).html(&b, "phases")

	for i, p := range r.Phases {
		if p.Preload {
			continue
		}
		r.phaseHTML(&b, i, p)
	}

	if hasCPU(r.Phases) {
		fmt.Fprintf(&b, "<h2>CPU per message</h2>\n<p>%s</p>\n", esc(r.cpuText()))
		cpuTable(r.Phases).html(&b, "cpu")
	}
	if c := r.Capacity; c != nil {
		// The section of report.md: its sentences as paragraphs, its table
		// as a table.
		var md strings.Builder
		r.writeCapacity(func(f string, a ...any) { fmt.Fprintf(&md, f, a...) })
		b.WriteString("<h2>Capacity</h2>\n")
		table := false
		for _, line := range strings.Split(md.String(), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case line == "" || strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "|"):
				if !table {
					capacityTable(c).html(&b, "capacity")
					table = true
				}
			default:
				fmt.Fprintf(&b, "<p>%s</p>\n", esc(strings.ReplaceAll(line, "**", "")))
			}
		}
	}

	b.WriteString("<h2>Verification</h2>\n")
	verificationTable(r.Verification).html(&b, "verification")
	for _, v := range r.Verification {
		if notes := verificationNotes(v); len(notes) > 0 {
			fmt.Fprintf(&b, "<p>%s: %s</p>\n", esc(v.Workload), esc(strings.Join(notes, "; ")))
		}
	}
	b.WriteString("</body></html>\n")
	return b.String()
}

// facts are the run's lines at the top of both reports; code marks the
// run id and the command (Markdown puts them in backquotes).
func (r *Report) facts(code func(string) string) []string {
	var out []string
	out = append(out, fmt.Sprintf("run %s, started %s, %.0f s", code(r.RunID), r.Started.Format(time.RFC3339), r.ElapsedS))
	out = append(out, "command: "+code(r.Command))
	if r.Router != "" {
		out = append(out, "router: "+r.Router)
	}
	if st := r.Settings; st.Routers > 1 || st.Workers > 0 {
		out = append(out, fmt.Sprintf("fleet: %d routers (requests spread %s), %d generator workers (one merged verification)", st.Routers, orDefault(st.Routing, "rr"), max(st.Workers, 1)))
	}
	out = append(out, fmt.Sprintf("host: %d CPUs, GOMAXPROCS %d, %s, load average at start %s", r.Host.CPUs, r.Host.GOMAXPROCS, r.Host.Go, r.Host.Load1))
	if r.Servers != "" {
		out = append(out, "servers: "+r.Servers)
	}
	st := r.Settings
	out = append(out, fmt.Sprintf("producers %d × batch %d, consumers %d × claim %d, payload %s bytes, keys %s, %d topic(s) × %d subscription(s), durability %s",
		st.Producers, st.Batch, st.Consumers, st.ClaimMax, st.Payload, st.Keys, st.Topics, st.Subscriptions, orDefault(st.Durability, "primary")))
	if st.ProduceRate > 0 || st.ConsumeRate > 0 {
		out = append(out, fmt.Sprintf("targets: %s produced/s, %s consumed/s (open loop; latency from the intended send time)", human(st.ProduceRate), human(st.ConsumeRate)))
	}
	if st.DupShare > 0 || st.NackShare > 0 || st.RetryShare > 0 || st.DropShare > 0 {
		out = append(out, fmt.Sprintf("repeated keys %.0f %%, poison (always nacked) %.0f %%, nacked once %.0f %%, dropped once %.0f %%",
			100*st.DupShare, 100*st.NackShare, 100*st.RetryShare, 100*st.DropShare))
	}
	if st.Fault != "" {
		out = append(out, fmt.Sprintf("fault: kill -9 %s at %.0f s, restart %.0f s later", st.Fault, st.FaultAtS, st.FaultDownS))
	}
	return out
}

// Colours of the charts, one per meaning throughout the page.
const (
	colProduced = "#4e79a7"
	colConsumed = "#f28e2b"
	colE2E      = "#59a14f"
	colErrors   = "#e15759"
	colFault    = "#c0392b"
	colRestart  = "#2e7d32"
	colSchedule = "#555"
)

var cpuColours = map[string]string{"machine": "#7f7f7f", "router": "#4e79a7", "primary": "#f28e2b", "replica": "#b07aa1",
	"mariadbd": "#f28e2b", "loadtest": "#59a14f", "coordinator": "#76b7b2"}

// phaseHTML writes one phase: its charts, clusters, errors and fault.
func (r *Report) phaseHTML(b *strings.Builder, idx int, p PhaseReport) {
	esc := html.EscapeString
	fmt.Fprintf(b, "<section class=\"phase\" data-phase=%q><h2>Phase %s <span class=\"muted\">(%s, %s)</span></h2>\n", p.Name, esc(p.Name), esc(p.Kind), esc(p.Target))
	xmax := math.Max(p.ElapsedS, float64(len(p.Timeline)))
	marks, spans := r.phaseMarks(p)
	id := func(what string) string { return fmt.Sprintf("%s-%d", what, idx) }
	sec := func(pt Point) float64 { return float64(pt.Second) + 0.5 } // a second's count at its middle
	nan := math.NaN()

	var prod, cons chartSeries
	prod = chartSeries{Name: "produced/s", Colour: colProduced}
	cons = chartSeries{Name: "consumed/s", Colour: colConsumed}
	for _, pt := range p.Timeline {
		prod.Pts = append(prod.Pts, chartPt{sec(pt), float64(pt.Produced)})
		cons.Pts = append(cons.Pts, chartPt{sec(pt), float64(pt.Consumed)})
	}
	var series []chartSeries
	if p.Produce != nil {
		series = append(series, prod)
	}
	if p.Consume != nil {
		series = append(series, cons)
	}
	end := r.Settings.DurationS
	if end <= 0 || end > xmax {
		end = xmax
	}
	if p.Produce != nil && p.Produce.Target > 0 {
		series = append(series, chartSeries{Name: "produce target", Colour: colProduced, Dash: true, Pts: []chartPt{{0, p.Produce.Target}, {end, p.Produce.Target}}})
	}
	if p.Consume != nil && p.Consume.Target > 0 {
		series = append(series, chartSeries{Name: "consume target", Colour: colConsumed, Dash: true, Pts: []chartPt{{0, p.Consume.Target}, {end, p.Consume.Target}}})
	}
	b.WriteString(lineChart{ID: id("throughput"), Title: "Throughput per second",
		YLabel: "messages/s", XMax: xmax, Series: series, Marks: marks, Spans: spans, YMinMax: 1}.SVG())
	caption(b, "Messages answered created or duplicate (produced) and acks the router confirmed (consumed), in each second; dashed: the targets of the open-loop schedule.")

	lat := func(name, colour string, dash bool, get func(Point) float64) chartSeries {
		s := chartSeries{Name: name, Colour: colour, Dash: dash}
		for _, pt := range p.Timeline {
			v := get(pt)
			if v <= 0 {
				v = nan
			}
			s.Pts = append(s.Pts, chartPt{sec(pt), v})
		}
		return s
	}
	var ls []chartSeries
	if p.Produce != nil {
		ls = append(ls, lat("produce p50", colProduced, true, func(pt Point) float64 { return pt.ProduceP50 }),
			lat("produce p99", colProduced, false, func(pt Point) float64 { return pt.ProduceP99 }))
	}
	if p.Consume != nil {
		ls = append(ls, lat("claim p50", colConsumed, true, func(pt Point) float64 { return pt.ClaimP50 }),
			lat("claim p99", colConsumed, false, func(pt Point) float64 { return pt.ClaimP99 }),
			lat("end-to-end p50", colE2E, true, func(pt Point) float64 { return pt.E2EP50 }),
			lat("end-to-end p99", colE2E, false, func(pt Point) float64 { return pt.E2EP99 }))
	}
	b.WriteString(lineChart{ID: id("latency"), Title: "Latency per second, p50 (dashed) and p99",
		YLabel: "ms (log)", XMax: xmax, LogY: true, YFmt: millis, Series: ls, Marks: marks, Spans: spans}.SVG())
	caption(b, "Of the answers that came in each second: produce and claim from their intended send time (a schedule fallen behind shows here), end to end from the message's production to its first delivery; to within 6 %.")

	errs := chartSeries{Name: "errors/s", Colour: colErrors}
	var total int64
	for _, pt := range p.Timeline {
		errs.Pts = append(errs.Pts, chartPt{float64(pt.Second), float64(pt.Errors)})
		total += pt.Errors
	}
	b.WriteString(lineChart{ID: id("errors"), Title: fmt.Sprintf("Errors per second (%d in all)", total),
		YLabel: "errors/s", XMax: xmax, Bars: true, Series: []chartSeries{errs}, Marks: marks, Spans: spans, YMinMax: 1}.SVG())
	caption(b, "Requests refused as a whole, items answered unavailable, claims and acks that failed, and requests that got no answer (counted per item); the codes are in the table below.")

	if len(p.CPUTimeline) > 0 {
		by := map[string]*chartSeries{}
		var names []string
		for _, cp := range p.CPUTimeline {
			for n, v := range cp.Cores {
				s := by[n]
				if s == nil {
					colour := cpuColours[n]
					if colour == "" {
						colour = "#9c755f"
					}
					s = &chartSeries{Name: n, Colour: colour}
					by[n] = s
					names = append(names, n)
				}
				s.Pts = append(s.Pts, chartPt{float64(cp.Second) + 0.5, v})
			}
		}
		sort.Slice(names, func(i, j int) bool {
			if (names[i] == "machine") != (names[j] == "machine") {
				return names[i] == "machine"
			}
			return names[i] < names[j]
		})
		var cs []chartSeries
		for _, n := range names {
			cs = append(cs, *by[n])
		}
		if r.Host.CPUs > 0 {
			cs = append(cs, chartSeries{Name: fmt.Sprintf("the machine's %d cores", r.Host.CPUs), Colour: "#bbb", Dash: true,
				Pts: []chartPt{{0, float64(r.Host.CPUs)}, {xmax, float64(r.Host.CPUs)}}})
		}
		b.WriteString(lineChart{ID: id("cpu"), Title: "CPU per part: cores busy",
			YLabel: "cores", XMax: xmax, Series: cs, Marks: marks, Spans: spans}.SVG())
		caption(b, "Each part's CPU time (user and system, from /proc) in each second; machine is every process and the kernel.")
	}

	if len(p.Clusters) > 0 {
		var rows []barRow
		for _, c := range p.Clusters {
			rows = append(rows, barRow{Label: c.Cluster, Values: []float64{float64(c.Produced), float64(c.Consumed)}})
		}
		b.WriteString(barChart(id("clusters"), "Each cluster's share: messages produced and consumed", []string{"produced", "consumed"},
			[]string{colProduced, colConsumed}, rows, count))
		b.WriteString("\n")
		clustersTable(p).html(b, "clusters")
	}
	if hot := hotText(p); hot != "" {
		fmt.Fprintf(b, "<p>%s</p>\n", esc(hot))
	}
	for _, n := range phaseNotes(p) {
		fmt.Fprintf(b, "<p>%s</p>\n", esc(n))
	}
	if len(p.Errors) > 0 {
		errorsTable(p).html(b, "errors")
	}
	if len(p.Faults) > 0 {
		faultsTable(p).html(b, "faults")
		b.WriteString("<ul>")
		for _, l := range recoveryLines(p) {
			fmt.Fprintf(b, "<li>%s</li>", esc(l))
		}
		b.WriteString("</ul>\n")
	}
	b.WriteString("</section>\n")
}

// caption writes the sentence under a chart.
func caption(b *strings.Builder, text string) {
	fmt.Fprintf(b, "\n<p class=\"caption\">%s</p>\n", html.EscapeString(text))
}

// phaseMarks are what every chart of a phase marks: the warm-up, the end
// of the schedule (the drain after it), each fault's kill and restart and
// the time the faulty part was down.
func (r *Report) phaseMarks(p PhaseReport) ([]chartMark, []chartSpan) {
	var marks []chartMark
	var spans []chartSpan
	if w := r.Settings.WarmupS; w > 0 && p.Kind != "consume" {
		spans = append(spans, chartSpan{From: 0, To: w, Label: "warm-up", Colour: "#888"})
	}
	if d := r.Settings.DurationS; d > 0 && p.Kind != "consume" && d < p.ElapsedS {
		marks = append(marks, chartMark{X: d, Label: "schedule ends: drain", Colour: colSchedule})
	}
	kill := -1.0
	for _, f := range p.Faults {
		switch {
		case f.Error != "":
			marks = append(marks, chartMark{X: f.At, Label: f.Action + " failed", Colour: colFault})
		case f.Action == "kill -9":
			kill = f.At
			marks = append(marks, chartMark{X: f.At, Label: "kill -9 " + f.Target, Colour: colFault})
		case f.Action == "restart":
			up := f.At + f.Took
			marks = append(marks, chartMark{X: up, Label: f.Target + " back", Colour: colRestart})
			if kill >= 0 {
				spans = append(spans, chartSpan{From: kill, To: up, Label: f.Target + " down", Colour: colFault})
			}
		}
	}
	return marks, spans
}

const reportCSS = `
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 960px; color: #1d1d1f; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
.muted { color: #6b6b70; font-weight: normal; }
ul.facts { color: #333; padding-left: 1.2em; }
.verdict { padding: .6em .9em; border-radius: 4px; font-size: 1.05em; }
.verdict.pass { background: #e6f4ea; border: 1px solid #2e7d32; }
.verdict.fail { background: #fde8e6; border: 1px solid #b3261e; }
table { border-collapse: collapse; margin: .6em 0; font-size: 13px; display: block; max-width: 100%; overflow-x: auto; }
th, td { border-bottom: 1px solid #ddd; padding: .2em .55em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.caption { color: #555; font-size: 12.5px; margin: -.4em 0 1.2em; }
svg.chart { display: block; margin: .8em 0; background: #fff; border: 1px solid #e4e4e4; max-width: 100%; height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg text.t { font-size: 12.5px; font-weight: 600; }
svg text.y { text-anchor: end; }
svg text.x { text-anchor: middle; }
svg text.s { fill: #666; font-size: 10.5px; }
svg text.m { font-size: 10.5px; }
svg line.g { stroke: #eee; }
svg line.a { stroke: #999; }
`
