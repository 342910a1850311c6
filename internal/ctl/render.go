package ctl

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
)

// The default (non -json) renderings of the answers.

func num(v any) string {
	switch x := v.(type) {
	case float64:
		return fmt.Sprintf("%.0f", x)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func list(v any) []map[string]any {
	var out []map[string]any
	xs, _ := v.([]any)
	for _, x := range xs {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func (c *cmd) table(head string, rows [][]string) error {
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func (c *cmd) topologyTable(m map[string]any) error {
	var rows [][]string
	for _, cl := range list(m["clusters"]) {
		eps := list(cl["endpoints"])
		if len(eps) == 0 {
			eps = []map[string]any{{}}
		}
		for i, ep := range eps {
			name, state, vs := "", "", ""
			if i == 0 {
				name, state, vs = str(cl["name"]), str(cl["state"]), num(cl["vshards"])
			}
			rows = append(rows, []string{name, state, vs, str(ep["role"]), str(ep["endpoint"]), str(ep["health"]), str(ep["breaker"]), num(ep["lag_ms"])})
		}
	}
	if err := c.table("CLUSTER\tSTATE\tVSHARDS\tROLE\tENDPOINT\tHEALTH\tBREAKER\tLAG_MS", rows); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(c.out, "shard map version %s\n", num(m["shard_map_version"])); err != nil {
		return err
	}
	return c.missing(m, "their primary does not answer; requests for their vshards fail until it is back")
}

func (c *cmd) shardMapTable(m map[string]any) error {
	var rows [][]string
	for _, r := range list(m["ranges"]) {
		rows = append(rows, []string{num(r["from"]), num(r["to"]), str(r["cluster"]), str(r["state"])})
	}
	if err := c.table("FROM\tTO\tCLUSTER\tSTATE", rows); err != nil {
		return err
	}
	_, err := fmt.Fprintf(c.out, "shard map version %s\n", num(m["version"]))
	return err
}

func (c *cmd) statsTable(m map[string]any) error {
	var rows [][]string
	for _, s := range list(m["subscriptions"]) {
		rows = append(rows, []string{str(s["topic"]), str(s["subscription"]), num(s["depth"]), num(s["ready"]), num(s["delayed"]),
			num(s["in_flight"]), num(s["parked"]), num(s["dead"])})
	}
	if err := c.table("TOPIC\tSUBSCRIPTION\tDEPTH\tREADY\tDELAYED\tIN_FLIGHT\tPARKED\tDEAD", rows); err != nil {
		return err
	}
	return c.missing(m, "their deliveries are not counted")
}

// missing prints the clusters an answer gathered from several clusters
// lacks (missing_clusters), and what that means for it; nothing when
// none is missing.
func (c *cmd) missing(m map[string]any, meaning string) error {
	var names []string
	for _, v := range asList(m["missing_clusters"]) {
		names = append(names, str(v))
	}
	if len(names) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(c.errw, "MISSING: %s did not answer: %s\n", strings.Join(names, ", "), meaning)
	return err
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func (c *cmd) deadTable(m map[string]any) error {
	var rows [][]string
	for _, d := range list(m["dead_letters"]) {
		rows = append(rows, []string{str(d["id"]), str(d["key"]), str(d["error_code"]), num(d["attempts"]), str(d["dead_at"]), str(d["last_error"])})
	}
	if err := c.table("ID\tKEY\tERROR_CODE\tATTEMPTS\tDEAD_AT\tLAST_ERROR", rows); err != nil {
		return err
	}
	if next := str(m["next_cursor"]); next != "" {
		fmt.Fprintf(c.out, "more: -cursor %s\n", next)
	}
	return c.missing(m, "their dead letters are not listed")
}

func (c *cmd) codesTable(m map[string]any) error {
	var rows [][]string
	for _, x := range list(m["codes"]) {
		rows = append(rows, []string{str(x["error_code"]), num(x["count"])})
	}
	rows = append(rows, []string{"(total)", num(m["total"])})
	if err := c.table("ERROR_CODE\tDEAD_LETTERS", rows); err != nil {
		return err
	}
	return c.missing(m, "their dead letters are not counted")
}

func (c *cmd) redriveText(m map[string]any) error {
	if m["dry_run"] != true {
		_, err := fmt.Fprintf(c.out, "redriven: %s\n", num(m["redriven"]))
		return err
	}
	var parts []string
	for _, x := range list(m["by_error_code"]) {
		code := str(x["error_code"])
		if code == "" {
			code = "(none)"
		}
		parts = append(parts, code+" "+num(x["count"]))
	}
	detail := ""
	if len(parts) > 0 {
		detail = " (" + strings.Join(parts, ", ") + ")"
	}
	_, err := fmt.Fprintf(c.out, "dry run: %s dead letters would be redriven%s; nothing changed\n", num(m["would_redrive"]), detail)
	return err
}

func rangesText(v any) string {
	var parts []string
	for _, r := range list(v) {
		s := num(r["from"])
		if num(r["to"]) != s {
			s += "-" + num(r["to"])
		}
		parts = append(parts, s+"→"+str(r["target"]))
	}
	return strings.Join(parts, ",")
}

func (c *cmd) planTable(m map[string]any) error {
	var rows [][]string
	for _, mv := range list(m["moves"]) {
		vs, _ := mv["vshards"].([]any)
		rows = append(rows, []string{str(mv["source"]), str(mv["target"]), fmt.Sprint(len(vs))})
	}
	if err := c.table("SOURCE\tTARGET\tVSHARDS", rows); err != nil {
		return err
	}
	_, err := fmt.Fprintf(c.out, "ranges: %s\nnothing started (a plan); start it with: reshard start …\n", rangesText(m["ranges"]))
	return err
}

func jobRow(j map[string]any) []string {
	jb := job{State: str(j["state"])}
	if v, ok := j["rows_copied"].(float64); ok {
		jb.RowsCopied = int64(v)
	}
	if v, ok := j["rows_total"].(float64); ok {
		jb.RowsTotal = int64(v)
	}
	return []string{str(j["job"]), jb.State, fmt.Sprintf("%d%%", progress(jb)), num(j["rows_copied"]) + "/" + num(j["rows_total"]),
		num(j["max_pause_ms"]), rangesText(j["ranges"]), str(j["error"])}
}

const jobHead = "JOB\tSTATE\tPROGRESS\tROWS\tMAX_PAUSE_MS\tRANGES\tERROR"

func (c *cmd) jobTable(j map[string]any) error { return c.table(jobHead, [][]string{jobRow(j)}) }

func (c *cmd) jobsTable(m map[string]any) error {
	var rows [][]string
	for _, j := range list(m["jobs"]) {
		rows = append(rows, jobRow(j))
	}
	return c.table(jobHead, rows)
}

// heatMap prints the 1024 vshards as 16 lines of 64: one letter per
// cluster (legend below), lowercase while a running job moves the vshard
// (it is still served by that cluster), '*' while it is frozen.
func (c *cmd) heatMap() error {
	var sm, jobs map[string]any
	data, err := c.fetch("GET", "/v1/admin/shardmap", nil)
	if err != nil {
		return err
	}
	if err := jsonObject(data, &sm); err != nil {
		return err
	}
	var owner [1024]string
	var frozen, moving [1024]bool
	count := map[string]int{}
	for _, r := range list(sm["ranges"]) {
		from, _ := r["from"].(float64)
		to, _ := r["to"].(float64)
		for v := int(from); v <= int(to) && v < 1024; v++ {
			owner[v] = str(r["cluster"])
			frozen[v] = r["state"] == "frozen"
			count[owner[v]]++
		}
	}
	// The jobs: a router without resharding answers 404; the map is
	// drawn without them.
	if data, err := c.fetchQuiet("GET", "/v1/admin/reshard"); err == nil && jsonObject(data, &jobs) == nil {
		for _, j := range list(jobs["jobs"]) {
			if terminal(str(j["state"])) {
				continue
			}
			for _, r := range list(j["ranges"]) {
				from, _ := r["from"].(float64)
				to, _ := r["to"].(float64)
				for v := int(from); v <= int(to) && v < 1024; v++ {
					moving[v] = true
				}
			}
		}
	}
	names := make([]string, 0, len(count))
	for n := range count {
		names = append(names, n)
	}
	sort.Strings(names)
	const letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
	letter := map[string]byte{}
	for i, n := range names {
		letter[n] = letters[i%len(letters)]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "shard map version %s (64 vshards a line)\n", num(sm["version"]))
	for row := 0; row < 16; row++ {
		fmt.Fprintf(&b, "%4d ", row*64)
		for v := row * 64; v < row*64+64; v++ {
			ch := letter[owner[v]]
			switch {
			case owner[v] == "":
				ch = '?'
			case frozen[v]:
				ch = '*'
			case moving[v]:
				ch = ch + 'a' - 'A'
			}
			b.WriteByte(ch)
		}
		b.WriteByte('\n')
	}
	var legend []string
	for _, n := range names {
		legend = append(legend, fmt.Sprintf("%c %s (%d vshards)", letter[n], n, count[n]))
	}
	b.WriteString(strings.Join(legend, "  "))
	b.WriteString("\nlowercase: moving (a running job); *: frozen (writes held)\n")
	_, err = c.out.Write([]byte(b.String()))
	return err
}
