package loadtest

import (
	"fmt"
	"html"
	"strings"
)

// table is one of the report's tables, written as Markdown (report.md) and
// as HTML (report.html) from the same rows.
type table struct {
	head  []string
	right []bool // columns aligned right (numbers)
	rows  [][]string
}

// markdown writes t; cells may carry Markdown (bold).
func (t table) markdown(w func(string, ...any)) {
	w("| %s |\n|", strings.Join(t.head, " | "))
	for i := range t.head {
		if i < len(t.right) && t.right[i] {
			w("---:|")
		} else {
			w("---|")
		}
	}
	w("\n")
	for _, r := range t.rows {
		w("| %s |\n", strings.Join(r, " | "))
	}
}

// html writes t with its cells escaped; **bold** cells become <strong>.
func (t table) html(b *strings.Builder, class string) {
	fmt.Fprintf(b, "<table class=%q><thead><tr>", class)
	for _, h := range t.head {
		fmt.Fprintf(b, "<th>%s</th>", html.EscapeString(h))
	}
	b.WriteString("</tr></thead><tbody>\n")
	for _, r := range t.rows {
		b.WriteString("<tr>")
		for i, c := range r {
			cls := ""
			if i < len(t.right) && t.right[i] {
				cls = ` class="num"`
			}
			text := html.EscapeString(c)
			if strings.HasPrefix(c, "**") && strings.HasSuffix(c, "**") && len(c) > 4 {
				text = "<strong>" + html.EscapeString(c[2:len(c)-2]) + "</strong>"
			}
			fmt.Fprintf(b, "<td%s>%s</td>", cls, text)
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</tbody></table>\n")
}

func resultsTable(rs []Result) table {
	t := table{head: []string{"figure", "target", "messages", "seconds", "messages/s"}, right: []bool{false, false, true, true, true}}
	for _, res := range rs {
		t.rows = append(t.rows, []string{res.Name, res.Target, fmt.Sprint(res.Messages), fmt.Sprintf("%.1f", res.Seconds), fmt.Sprintf("%.0f", res.PerSecond)})
	}
	return t
}

func ratiosTable(m map[string]float64) table {
	t := table{head: []string{"ratio", "value"}, right: []bool{false, true}}
	for _, k := range sortedKeys(m) {
		t.rows = append(t.rows, []string{k, fmt.Sprintf("%.2f", m[k])})
	}
	return t
}

func phasesTable(ps []PhaseReport) table {
	t := table{head: []string{"phase", "target", "window s", "produced/s", "produce p50 / p99 / p99.9 ms", "consumed/s", "claim p50 / p99 / p99.9 ms",
		"ack p99 ms", "end-to-end p99 ms", "errors"}, right: []bool{false, false, true, true, false, true, false, true, true, true}}
	for _, p := range ps {
		pr, pl, cr, cl, ak, e2e := "–", "–", "–", "–", "–", "–"
		if p.Produce != nil {
			pr = fmt.Sprintf("%.0f", p.Produce.PerSecond)
			if p.Produce.Target > 0 {
				pr += fmt.Sprintf(" (of %s)", human(p.Produce.Target))
			}
			pl = pct(p.Produce.Latency)
		}
		if p.Consume != nil {
			cr = fmt.Sprintf("%.0f", p.Consume.PerSecond)
			if p.Consume.Target > 0 {
				cr += fmt.Sprintf(" (of %s)", human(p.Consume.Target))
			}
			cl = pct(p.Consume.Latency)
			ak = fmt.Sprintf("%.1f", p.Consume.AckLatency.P99)
			e2e = fmt.Sprintf("%.1f", p.Consume.EndToEnd.P99)
		}
		var errs int64
		for _, n := range p.Errors {
			errs += n
		}
		name := p.Name
		if p.Preload {
			name += " (preload)"
		}
		t.rows = append(t.rows, []string{name, p.Target, fmt.Sprintf("%.1f", p.WindowS), pr, pl, cr, cl, ak, e2e, fmt.Sprint(errs)})
	}
	return t
}

// cpuNames are the CPU sources of the phases but the machine, in order of
// appearance.
func cpuNames(ps []PhaseReport) []string {
	var names []string
	seen := map[string]bool{}
	for _, p := range ps {
		for _, u := range p.CPU {
			if u.Name != "machine" && !seen[u.Name] {
				seen[u.Name] = true
				names = append(names, u.Name)
			}
		}
	}
	return names
}

func cpuTable(ps []PhaseReport) table {
	names := cpuNames(ps)
	t := table{head: []string{"phase", "cores busy", "machine µs/msg"}, right: []bool{false, true, true}}
	for _, n := range names {
		t.head = append(t.head, n+" µs/msg")
		t.right = append(t.right, true)
	}
	for _, p := range ps {
		if len(p.CPU) == 0 {
			continue
		}
		by := map[string]CPUUse{}
		for _, u := range p.CPU {
			by[u.Name] = u
		}
		m := by["machine"]
		row := []string{p.Name, fmt.Sprintf("%.2f", m.Cores), fmt.Sprintf("%.0f", m.PerMessageUS)}
		for _, n := range names {
			u, ok := by[n]
			switch {
			case !ok:
				row = append(row, "–")
			case u.Partial:
				row = append(row, fmt.Sprintf("%.0f*", u.PerMessageUS))
			default:
				row = append(row, fmt.Sprintf("%.0f", u.PerMessageUS))
			}
		}
		t.rows = append(t.rows, row)
	}
	return t
}

func verificationTable(vs []Verification) table {
	t := table{head: []string{"workload", "mode", "acknowledged", "expected deliveries", "consumed", "dead (asked)", "ack unknown", "lost", "pending",
		"duplicated", "redelivered after nack", "after lease expiry", "same attempt after its lease", "unexpected", "corrupt"}}
	for range t.head {
		t.right = append(t.right, len(t.right) >= 2)
	}
	for _, v := range vs {
		t.rows = append(t.rows, []string{v.Workload, v.Mode, fmt.Sprint(v.Acknowledged), fmt.Sprint(v.Expected), fmt.Sprint(v.Consumed),
			fmt.Sprint(v.Dead), fmt.Sprint(v.AckUnknown), fmt.Sprintf("**%d**", v.Lost), fmt.Sprint(v.Pending), fmt.Sprintf("**%d**", v.Duplicated),
			fmt.Sprint(v.RedeliveredAfterNack), fmt.Sprint(v.RedeliveredAfterExpiry), fmt.Sprint(v.RedeliveredUncounted), fmt.Sprint(v.Unexpected), fmt.Sprint(v.Corrupt)})
	}
	return t
}

// verificationNotes are what the table does not say, per workload.
func verificationNotes(v Verification) []string {
	var notes []string
	if v.Mode == "stored" {
		notes = append(notes, fmt.Sprintf("%d acknowledged keys looked up in the dedup registry", v.Checked))
	}
	if v.StoredByDuplicate > 0 {
		notes = append(notes, fmt.Sprintf("%d keys proven stored by a resend answered duplicate", v.StoredByDuplicate))
	}
	if v.DeliveredUnconfirmed > 0 {
		notes = append(notes, fmt.Sprintf("%d keys without a definite produce answer were delivered (stored after all)", v.DeliveredUnconfirmed))
	}
	if v.Unchecked > 0 {
		notes = append(notes, fmt.Sprintf("%d not consumed and not checked", v.Unchecked))
	}
	if v.DeadUnexpected > 0 {
		notes = append(notes, fmt.Sprintf("%d dead letters nobody asked for", v.DeadUnexpected))
	}
	if v.DedupViolations > 0 || v.DuplicateOfFresh > 0 || v.Conflicts > 0 {
		notes = append(notes, fmt.Sprintf("dedup violations %d, duplicate answers to fresh keys %d, conflicts %d", v.DedupViolations, v.DuplicateOfFresh, v.Conflicts))
	}
	if len(v.LostKeys) > 0 {
		notes = append(notes, "lost keys: "+strings.Join(v.LostKeys, ", "))
	}
	return notes
}

func capacityTable(c *Capacity) table {
	t := c.Target
	tb := table{head: []string{"part", "CPU µs per message", "per produced", "per consumed", "messages per CPU-second", "cores needed", "hosts"},
		right: []bool{false, true, true, true, true, true, false}}
	for _, p := range c.Inputs {
		hosts := ""
		switch p.Name {
		case "router":
			hosts = fmt.Sprintf("%s of %d cores", plural(c.Routers, "router"), t.RouterCores)
		case "primary":
			hosts = fmt.Sprintf("%s (primaries of %d cores)", plural(c.Clusters, "cluster"), t.DBCores)
		case "replica":
			hosts = fmt.Sprintf("%s of %d cores (%d per cluster)", plural(p.Hosts, "replica"), t.DBCores, c.ReplicasPerCluster)
		case "generator":
			hosts = fmt.Sprintf("%s of %d cores", plural(c.Generators, "generator machine"), t.GeneratorCores)
		}
		pr, co := "–", "–"
		if p.ProduceUS > 0 {
			pr, co = fmt.Sprintf("%.1f", p.ProduceUS), fmt.Sprintf("%.1f", p.ConsumeUS)
		}
		tb.rows = append(tb.rows, []string{p.Name, fmt.Sprintf("%.1f", p.PerMessageUS), pr, co, human(p.PerCPUSecond), fmt.Sprintf("%.1f", p.Cores), hosts})
	}
	return tb
}

func clustersTable(p PhaseReport) table {
	t := table{head: []string{"cluster", "produced", "share", "consumed"}, right: []bool{false, true, true, true}}
	for _, c := range p.Clusters {
		t.rows = append(t.rows, []string{c.Cluster, fmt.Sprint(c.Produced), fmt.Sprintf("%.1f %%", 100*c.Share), fmt.Sprint(c.Consumed)})
	}
	return t
}

func errorsTable(p PhaseReport) table {
	t := table{head: []string{"error", "count"}, right: []bool{false, true}}
	for _, k := range sortedKeys(p.Errors) {
		t.rows = append(t.rows, []string{k, fmt.Sprint(p.Errors[k])})
	}
	return t
}

func faultsTable(p PhaseReport) table {
	t := table{head: []string{"fault", "at s", "took s", "error"}, right: []bool{false, true, true, false}}
	for _, f := range p.Faults {
		t.rows = append(t.rows, []string{f.Action + " " + f.Target, fmt.Sprintf("%.1f", f.At), fmt.Sprintf("%.1f", f.Took), f.Error})
	}
	return t
}

// recoveryLines say each flow's dip and recovery around the fault.
func recoveryLines(p PhaseReport) []string {
	var out []string
	for _, rc := range p.Recovery {
		back := "did not recover before the phase ended"
		if rc.RecoveredAt >= 0 {
			back = fmt.Sprintf("back to 80 %% at %.0f s, %.0f s after the restart", rc.RecoveredAt, rc.AfterRestart)
		}
		out = append(out, fmt.Sprintf("%s: %.0f/s before the kill, lowest %.0f/s, %s", rc.Flow, rc.Before, rc.Low, back))
	}
	return out
}

func timelineTable(p PhaseReport) table {
	t := table{head: []string{"s", "produced", "consumed", "errors"}, right: []bool{true, true, true, true}}
	for _, pt := range p.Timeline {
		t.rows = append(t.rows, []string{fmt.Sprint(pt.Second), fmt.Sprint(pt.Produced), fmt.Sprint(pt.Consumed), fmt.Sprint(pt.Errors)})
	}
	return t
}
