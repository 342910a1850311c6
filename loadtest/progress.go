package loadtest

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// progress prints the live line of a running phase: rates achieved in the
// last second against the targets, errors, p99s, and the open-loop
// backlog. On a terminal it rewrites one line in place every second;
// otherwise (make output piped to a log) it prints a line every 5 s. A
// plain line rather than a progress bar: an open-loop run's interest is
// rate against target and latency, not completion, and a bar library
// would fight with the fault and phase messages printed in between.
type progress struct {
	w    io.Writer
	live bool
}

func (pr *progress) follow(ctx context.Context, p *phase, stop <-chan struct{}) {
	if pr == nil || pr.w == nil {
		return
	}
	every := time.Second
	printEvery := 5
	if pr.live {
		printEvery = 1
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastProd, lastCons, lastErr int64
	lastAt := time.Now()
	tick := 0
	for {
		select {
		case <-stop:
			if pr.live {
				fmt.Fprintln(pr.w)
			}
			return
		case <-ctx.Done():
			return
		case now := <-t.C:
			if tick++; tick%printEvery != 0 {
				continue
			}
			dt := now.Sub(lastAt).Seconds()
			prod, cons, errs := p.produced.Load(), p.consumed.Load(), p.errs.Total()
			line := p.statusLine(now, float64(prod-lastProd)/dt, float64(cons-lastCons)/dt, errs-lastErr, errs)
			lastProd, lastCons, lastErr, lastAt = prod, cons, errs, now
			if pr.live {
				fmt.Fprintf(pr.w, "\r\033[K%s", line)
			} else {
				fmt.Fprintln(pr.w, line)
			}
		}
	}
}

func (p *phase) statusLine(now time.Time, prodRate, consRate float64, newErrs, errs int64) string {
	s := p.spec
	var b strings.Builder
	el := now.Sub(p.start)
	stage := ""
	switch {
	case el < s.Warmup:
		stage = " warm-up"
	case now.After(p.end):
		stage = " drain"
	}
	fmt.Fprintf(&b, "%s %3.0fs/%.0fs%s", s.Name, el.Seconds(), s.Duration.Seconds(), stage)
	if s.Kind != "consume" {
		fmt.Fprintf(&b, " | produced %s/s", human(prodRate))
		if s.ProduceRate > 0 {
			fmt.Fprintf(&b, " of %s", human(s.ProduceRate))
		}
		if v, ok := p.produceLat.IntervalP99(); ok {
			fmt.Fprintf(&b, " p99 %s", ms(v))
		}
	}
	if s.Kind != "produce" {
		fmt.Fprintf(&b, " | consumed %s/s", human(consRate))
		if s.ConsumeRate > 0 && s.Kind == "mixed" {
			fmt.Fprintf(&b, " of %s", human(s.ConsumeRate))
		}
		if v, ok := p.claimLat.IntervalP99(); ok {
			fmt.Fprintf(&b, " claim p99 %s", ms(v))
		}
		fmt.Fprintf(&b, " | outstanding %s", human(float64(p.wl.v.Outstanding())))
	}
	fmt.Fprintf(&b, " | errors %d (+%d)", errs, newErrs)
	if n := p.prodPacer.Behind(); n > 0 {
		fmt.Fprintf(&b, " | behind %s req", human(float64(n)))
	}
	if n := p.retry.len(); n > 0 {
		fmt.Fprintf(&b, " | retrying %d", n)
	}
	return b.String()
}

// human formats a count: 950, 12.3k, 1.20M.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1fs", v/1000)
	}
	return fmt.Sprintf("%.1fms", v)
}
