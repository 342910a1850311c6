package loadtest

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// The report's charts are SVG drawn here by hand and written inline into
// report.html: the page then needs no script, no font and no network, and
// a chart can carry what a run needs marked (warm-up, the end of the
// schedule, a fault's kill and restart) on a linear or logarithmic axis.
// A charting library would have brought either JavaScript to load
// (go-echarts) or a large dependency for a few lines and axes
// (gonum/plot); this is about 250 lines.

// chartPt is one point of a series; Y NaN leaves a gap.
type chartPt struct{ X, Y float64 }

type chartSeries struct {
	Name   string
	Colour string
	Dash   bool
	Pts    []chartPt
}

// chartMark is a vertical line at X (a fault, the end of the schedule).
type chartMark struct {
	X      float64
	Label  string
	Colour string
}

// chartSpan shades X from From to To (warm-up, the time a fault was down).
type chartSpan struct {
	From, To float64
	Label    string
	Colour   string
}

// lineChart draws series over a phase's seconds.
type lineChart struct {
	ID     string // data-chart, for tests and links
	Title  string
	YLabel string
	XMax   float64
	LogY   bool
	Bars   bool // the series as bars, one per second
	YFmt   func(float64) string
	Series []chartSeries
	Marks  []chartMark
	Spans  []chartSpan
	// YMinMax, when above 0, is the least top of the y axis (so that a
	// flat line at 0 still has an axis).
	YMinMax float64
}

const (
	chartW, chartH                     = 880, 260
	chartL, chartR, chartTop, chartBot = 70, 20, 44, 36
)

// niceStep is a round step (1, 2 or 5 times a power of ten) that cuts span
// into about n parts.
func niceStep(span float64, n int) float64 {
	if span <= 0 {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// count formats a count or rate: 950, 12k, 1.5M.
func count(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case a >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	case a >= 10 || a == 0:
		return fmt.Sprintf("%.0f", v)
	}
	return trimZero(fmt.Sprintf("%.2f", v))
}

// millis formats a latency in ms: 0.5 ms, 12 ms, 1.5 s.
func millis(v float64) string {
	if v >= 1000 {
		return trimZero(fmt.Sprintf("%.1f", v/1000)) + " s"
	}
	if v >= 1 {
		return trimZero(fmt.Sprintf("%.0f", v)) + " ms"
	}
	return trimZero(fmt.Sprintf("%.2f", v)) + " ms"
}

func trimZero(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// SVG draws the chart.
func (c lineChart) SVG() string {
	yfmt := c.YFmt
	if yfmt == nil {
		yfmt = count
	}
	xmax := math.Max(c.XMax, 1)
	var lo, hi = math.Inf(1), 0.0
	for _, s := range c.Series {
		for _, p := range s.Pts {
			if math.IsNaN(p.Y) || (c.LogY && p.Y <= 0) {
				continue
			}
			lo, hi = math.Min(lo, p.Y), math.Max(hi, p.Y)
		}
	}
	hi = math.Max(hi, c.YMinMax)
	// The y axis: its ticks and a mapping to pixels.
	var ticks []float64
	var ymap func(float64) float64
	plotH := float64(chartH - chartTop - chartBot)
	if c.LogY {
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		a, b := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if b <= a {
			b = a + 1
		}
		for e := a; e <= b; e++ {
			ticks = append(ticks, math.Pow(10, e))
		}
		ymap = func(v float64) float64 { return chartTop + plotH*(1-(math.Log10(v)-a)/(b-a)) }
	} else {
		if hi <= 0 {
			hi = 1
		}
		step := niceStep(hi, 5)
		top := math.Ceil(hi/step) * step
		for v := 0.0; v <= top+step/2; v += step {
			ticks = append(ticks, v)
		}
		ymap = func(v float64) float64 { return chartTop + plotH*(1-v/top) }
	}
	plotW := float64(chartW - chartL - chartR)
	xmap := func(x float64) float64 { return chartL + plotW*x/xmax }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart=%q viewBox="0 0 %d %d" width="%d" height="%d" role="img">`,
		c.ID, chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(c.Title))
	fmt.Fprintf(&b, `<text x="%d" y="16" class="t">%s</text>`, chartL-60, html.EscapeString(c.Title))
	// The legend, after the title.
	lx := float64(chartL - 60)
	for _, s := range c.Series {
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(&b, `<line x1="%.0f" y1="32" x2="%.0f" y2="32" stroke="%s" stroke-width="2.5"%s/>`, lx, lx+18, s.Colour, dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="36" class="l">%s</text>`, lx+22, html.EscapeString(s.Name))
		lx += 30 + 6.5*float64(len(s.Name))
	}
	for i, sp := range c.Spans {
		x1, x2 := xmap(math.Max(sp.From, 0)), xmap(math.Min(sp.To, xmax))
		if x2 <= x1 {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%.0f" fill="%s" opacity="0.13"/>`, x1, chartTop, x2-x1, plotH, sp.Colour)
		// Labels under the plot's top edge, alternating lines: spans next
		// to each other keep theirs apart.
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="s">%s</text>`, x1+3, chartTop+12+12*(i%2), html.EscapeString(sp.Label))
	}
	for _, v := range ticks {
		y := ymap(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" class="g"/>`, chartL, y, chartW-chartR, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="y">%s</text>`, chartL-6, y+4, html.EscapeString(yfmt(v)))
	}
	xstep := niceStep(xmax, 10)
	for x := 0.0; x <= xmax+xstep/100; x += xstep {
		px := xmap(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" class="a"/>`, px, chartH-chartBot, px, chartH-chartBot+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="x">%s</text>`, px, chartH-chartBot+16, count(x))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" class="x">s since the phase started</text>`, chartL+int(plotW/2), chartH-4)
	fmt.Fprintf(&b, `<text x="12" y="%d" class="y" transform="rotate(-90 12 %d)">%s</text>`, chartTop+int(plotH/2), chartTop+int(plotH/2), html.EscapeString(c.YLabel))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="a"/>`, chartL, chartH-chartBot, chartW-chartR, chartH-chartBot)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" class="a"/>`, chartL, chartTop, chartL, chartH-chartBot)
	base := ymap(ticks[0])
	for _, s := range c.Series {
		if c.Bars {
			w := math.Max(plotW/xmax*0.8, 1)
			for _, p := range s.Pts {
				if math.IsNaN(p.Y) || p.Y <= 0 {
					continue
				}
				y := ymap(p.Y)
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s s: %s</title></rect>`,
					xmap(p.X), y, w, base-y, s.Colour, count(p.X), html.EscapeString(yfmt(p.Y)))
			}
			continue
		}
		var d strings.Builder
		pen := false
		for _, p := range s.Pts {
			if math.IsNaN(p.Y) || (c.LogY && p.Y <= 0) {
				pen = false
				continue
			}
			op := "L"
			if !pen {
				op = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f ", op, xmap(p.X), ymap(p.Y))
			pen = true
		}
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="1.8"%s><title>%s</title></path>`,
			strings.TrimSpace(d.String()), s.Colour, dash, html.EscapeString(s.Name))
	}
	for i, m := range c.Marks {
		if m.X < 0 || m.X > xmax {
			continue
		}
		x := xmap(m.X)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="1.5" stroke-dasharray="2 2" class="mark"/>`,
			x, chartTop, x, chartH-chartBot, m.Colour)
		// Labels step down, so that marks close together stay readable.
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="m" fill="%s">%s</text>`, x+3, chartTop+38+13*(i%3), m.Colour, html.EscapeString(m.Label))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// barRow is one labelled group of horizontal bars.
type barRow struct {
	Label  string
	Values []float64
}

// barChart draws horizontal bars: a group per row, a bar per value, with
// the value written at its end.
func barChart(id, title string, names, colours []string, rows []barRow, vfmt func(float64) string) string {
	const w, left, right, barH, gap = 880, 110, 90, 14, 10
	h := 44 + len(rows)*(len(names)*barH+gap) + 10
	var hi float64
	for _, r := range rows {
		for _, v := range r.Values {
			hi = math.Max(hi, v)
		}
	}
	if hi <= 0 {
		hi = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart=%q viewBox="0 0 %d %d" width="%d" height="%d" role="img">`, id, w, h, w, h)
	fmt.Fprintf(&b, `<title>%s</title><text x="10" y="16" class="t">%s</text>`, html.EscapeString(title), html.EscapeString(title))
	lx := 10.0
	for i, n := range names {
		fmt.Fprintf(&b, `<rect x="%.0f" y="26" width="14" height="10" fill="%s"/><text x="%.0f" y="35" class="l">%s</text>`, lx, colours[i], lx+18, html.EscapeString(n))
		lx += 30 + 6.5*float64(len(n))
	}
	y := 44
	for _, r := range rows {
		fmt.Fprintf(&b, `<text x="%d" y="%d" class="y">%s</text>`, left-8, y+len(names)*barH/2+4, html.EscapeString(r.Label))
		for i, v := range r.Values {
			bw := float64(w-left-right) * v / hi
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, left, y, bw, barH-2, colours[i%len(colours)])
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="l">%s</text>`, float64(left)+bw+4, y+barH-4, html.EscapeString(vfmt(v)))
			y += barH
		}
		y += gap
	}
	b.WriteString(`</svg>`)
	return b.String()
}
