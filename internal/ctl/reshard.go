package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// reshard: plan, start, status (with -watch), pause, resume, abort; and
// the older move|add-cluster|drain [-dry-run] forms.
func (c *cmd) reshard(args []string) error {
	if len(args) == 0 {
		return usageError("reshard takes plan|start|status|pause|resume|abort")
	}
	switch sub := args[0]; sub {
	case "plan", "start":
		body, rest, err := what(args[1:])
		if err != nil {
			return err
		}
		fs := newFlags("reshard " + sub)
		follow := fs.Bool("follow", false, "start: follow the job to its end with a progress bar")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		if sub == "plan" {
			return c.plan(body)
		}
		return c.start(body, *follow)
	case "move", "add-cluster", "drain":
		body, rest, err := what(args)
		if err != nil {
			return err
		}
		fs := newFlags("reshard " + sub)
		dry := fs.Bool("dry-run", false, "show the plan, start nothing")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		if *dry {
			return c.plan(body)
		}
		return c.start(body, false)
	case "status":
		job, rest := "", args[1:]
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			job, rest = rest[0], rest[1:]
		}
		fs := newFlags("reshard status")
		watch := fs.Bool("watch", false, "follow the job to its end with a progress bar")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		switch {
		case job == "" && *watch:
			return usageError("reshard status -watch needs a job")
		case job == "":
			return c.show("GET", "/v1/admin/reshard", nil, c.jobsTable)
		case *watch:
			return c.follow(job)
		}
		return c.show("GET", "/v1/admin/reshard/"+url.PathEscape(job), nil, c.jobTable)
	case "pause", "resume", "abort":
		if len(args) != 2 {
			return usageError("reshard " + sub + " takes a job id")
		}
		if sub == "abort" {
			if err := c.confirm("abort reshard job " + args[1]); err != nil {
				return err
			}
		}
		return c.show("POST", "/v1/admin/reshard/"+url.PathEscape(args[1])+"/"+sub, nil, c.jobTable)
	}
	return usageError("reshard takes plan, start, status, pause, resume or abort")
}

// what reads "move FROM-TO:TARGET[,…]", "add-cluster NAME" or "drain
// NAME" into a POST /v1/admin/reshard body.
func what(args []string) (map[string]any, []string, error) {
	if len(args) < 2 {
		return nil, nil, usageError("say what to move: move FROM-TO:TARGET[,…] | add-cluster NAME | drain NAME")
	}
	switch args[0] {
	case "add-cluster":
		return map[string]any{"add_cluster": args[1]}, args[2:], nil
	case "drain":
		return map[string]any{"drain": args[1]}, args[2:], nil
	case "move":
		var ranges []any
		for _, part := range strings.Split(args[1], ",") {
			var from, to int
			span, target, ok := strings.Cut(part, ":")
			if !ok || target == "" {
				return nil, nil, usageError(fmt.Sprintf("reshard move: %q is not FROM-TO:TARGET", part))
			}
			lo, hi, isRange := strings.Cut(span, "-")
			if !isRange {
				hi = lo
			}
			if _, err := fmt.Sscan(lo, &from); err != nil {
				return nil, nil, usageError(fmt.Sprintf("reshard move: %q: from is not a number", part))
			}
			if _, err := fmt.Sscan(hi, &to); err != nil {
				return nil, nil, usageError(fmt.Sprintf("reshard move: %q: to is not a number", part))
			}
			ranges = append(ranges, map[string]any{"from": from, "to": to, "target": target})
		}
		return map[string]any{"ranges": ranges}, args[2:], nil
	}
	return nil, nil, usageError("reshard: " + args[0] + " is not move, add-cluster or drain")
}

func (c *cmd) plan(body map[string]any) error {
	body["dry_run"] = true
	return c.show("POST", "/v1/admin/reshard", body, c.planTable)
}

func (c *cmd) start(body map[string]any, follow bool) error {
	data, err := c.fetch("POST", "/v1/admin/reshard", body)
	if err != nil {
		return err
	}
	var r struct {
		Job   string `json:"job"`
		State string `json:"state"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("POST /v1/admin/reshard: %w", err)
	}
	if c.json {
		c.out.Write(indent(data))
	} else {
		fmt.Fprintf(c.out, "started %s (%s)\n", r.Job, r.State)
	}
	if follow {
		return c.follow(r.Job)
	}
	return nil
}

// job is a resharding job as GET /v1/admin/reshard/{job} shows it.
type job struct {
	Job        string `json:"job"`
	State      string `json:"state"`
	RowsCopied int64  `json:"rows_copied"`
	RowsTotal  int64  `json:"rows_total"`
	MaxPauseMS int64  `json:"max_pause_ms"`
	Error      string `json:"error"`
}

func terminal(state string) bool { return state == "done" || state == "aborted" || state == "failed" }

// follow asks for the job every c.every and draws its progress until it
// ends: nil when done, an error when it ended aborted or failed.
func (c *cmd) follow(id string) error {
	bar := newBar(c.out)
	start := time.Now()
	for {
		data, err := c.fetch("GET", "/v1/admin/reshard/"+url.PathEscape(id), nil)
		if err != nil {
			bar.end()
			return err
		}
		var j job
		if err := json.Unmarshal(data, &j); err != nil {
			bar.end()
			return fmt.Errorf("GET job %s: %w", id, err)
		}
		if !c.json {
			bar.draw(j, time.Since(start))
		}
		if terminal(j.State) {
			bar.end()
			if c.json {
				c.out.Write(indent(data))
			} else {
				fmt.Fprintf(c.out, "%s %s: %d/%d rows copied, longest write pause %d ms\n", j.Job, j.State, j.RowsCopied, j.RowsTotal, j.MaxPauseMS)
			}
			if j.State != "done" {
				msg := "job " + j.Job + " ended " + j.State
				if j.Error != "" {
					msg += ": " + j.Error
				}
				return errors.New(msg)
			}
			return nil
		}
		time.Sleep(c.every)
	}
}

// bar draws a job's progress: one line redrawn in place on a terminal,
// else a line each time the state or the percentage changes.
type bar struct {
	w    interface{ Write([]byte) (int, error) }
	tty  bool
	last string
	drew bool
}

func newBar(w interface{ Write([]byte) (int, error) }) *bar {
	b := &bar{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			b.tty = true
		}
	}
	return b
}

const barWidth = 30

func progress(j job) int {
	switch {
	case j.State == "done":
		return 100
	case j.RowsTotal > 0:
		return int(min(100, j.RowsCopied*100/j.RowsTotal))
	}
	return 0
}

func (b *bar) draw(j job, elapsed time.Duration) {
	pct := progress(j)
	filled := pct * barWidth / 100
	line := fmt.Sprintf("%-11s [%s%s] %3d%%  %d/%d rows", j.State, strings.Repeat("#", filled), strings.Repeat("-", barWidth-filled), pct, j.RowsCopied, j.RowsTotal)
	if b.tty {
		fmt.Fprintf(b.w, "\r%s  %s\x1b[K", line, elapsed.Round(time.Second))
		b.drew = true
		return
	}
	if line != b.last {
		fmt.Fprintln(b.w, line)
		b.last = line
	}
}

func (b *bar) end() {
	if b.tty && b.drew {
		fmt.Fprintln(b.w)
		b.drew = false
	}
}
