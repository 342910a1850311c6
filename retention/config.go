// Package retention keeps the message tables the size of their use
// (DESIGN §8, docs/retention.md): month partitions created ahead of time;
// months past the hot window copied to the archive cluster (warm), checked
// by counts and checksums, and dropped from the hot clusters; months past
// the warm window exported to compressed, checksummed files (cold) that a
// command restores; and table upkeep (statistics monthly, rebuilds of
// fragmented partitions off-peak). Every job runs on the leading router
// only, in throttled batches, and records what it finished so that a job
// cut short resumes where it stopped.
package retention

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Config tunes the retention jobs. Zero fields take the defaults named.
type Config struct {
	// AheadMonths is how many months after the current one have their
	// partitions. Defaults to 3.
	AheadMonths int
	// HotMonths is how many whole months before the current one stay on
	// the hot clusters; older months move to the archive cluster.
	// Defaults to 3.
	HotMonths int
	// WarmMonths is how many whole months before the current one are
	// kept as rows (hot or warm); older months are exported to files.
	// Defaults to 12. It must exceed HotMonths.
	WarmMonths int
	// ColdDir is where cold files are written. Defaults to var/archive.
	ColdDir string
	// RangeSize is how many vshards one copy, check and file covers.
	// Defaults to 64.
	RangeSize int
	// BatchRows is how many rows one read, write or delete moves.
	// Defaults to 1000.
	BatchRows int
	// Pause is the wait between two batches (the throttle). Defaults to
	// 10ms.
	Pause time.Duration
	// Every is how often the jobs run. Defaults to 1h.
	Every time.Duration
	// AnalyzeEvery is how often a table's statistics are refreshed.
	// Defaults to 30 days.
	AnalyzeEvery time.Duration
	// FreeRatio is the share of a partition's space that, when free,
	// makes the upkeep rebuild it. Defaults to 0.4.
	FreeRatio float64
	// MinFreeBytes is the free space below which a partition is not
	// rebuilt whatever its ratio. Defaults to 64 MiB.
	MinFreeBytes int64
	// OffPeak is the daily window (UTC, "HH:MM-HH:MM", may wrap past
	// midnight) in which partitions are rebuilt. Defaults to 02:00-05:00.
	OffPeak string
	// Disabled turns the jobs off (the partition upkeep too).
	Disabled bool
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Log defaults to discarding.
	Log *slog.Logger

	offFrom, offTo time.Duration
}

// WithDefaults fills the defaults and checks the fields.
func (c Config) WithDefaults() (Config, error) {
	if c.AheadMonths <= 0 {
		c.AheadMonths = 3
	}
	if c.HotMonths <= 0 {
		c.HotMonths = 3
	}
	if c.WarmMonths <= 0 {
		c.WarmMonths = 12
	}
	if c.ColdDir == "" {
		c.ColdDir = "var/archive"
	}
	if c.RangeSize <= 0 {
		c.RangeSize = 64
	}
	if c.BatchRows <= 0 {
		c.BatchRows = 1000
	}
	if c.Pause == 0 {
		c.Pause = 10 * time.Millisecond
	}
	if c.Every <= 0 {
		c.Every = time.Hour
	}
	if c.AnalyzeEvery <= 0 {
		c.AnalyzeEvery = 30 * 24 * time.Hour
	}
	if c.FreeRatio <= 0 {
		c.FreeRatio = 0.4
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = 64 << 20
	}
	if c.OffPeak == "" {
		c.OffPeak = "02:00-05:00"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.WarmMonths <= c.HotMonths:
		return c, fmt.Errorf("retention: WarmMonths (%d) must exceed HotMonths (%d)", c.WarmMonths, c.HotMonths)
	case c.FreeRatio >= 1:
		return c, fmt.Errorf("retention: FreeRatio %v must be below 1", c.FreeRatio)
	case c.RangeSize > 1024:
		return c, fmt.Errorf("retention: RangeSize %d exceeds the 1024 vshards", c.RangeSize)
	}
	var err error
	if c.offFrom, c.offTo, err = parseWindow(c.OffPeak); err != nil {
		return c, fmt.Errorf("retention: OffPeak: %w", err)
	}
	return c, nil
}

// parseWindow reads "HH:MM-HH:MM" as offsets from midnight.
func parseWindow(s string) (from, to time.Duration, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not HH:MM-HH:MM", s)
	}
	parse := func(x string) (time.Duration, error) {
		t, err := time.Parse("15:04", strings.TrimSpace(x))
		if err != nil {
			return 0, fmt.Errorf("%q is not HH:MM-HH:MM", s)
		}
		return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute, nil
	}
	if from, err = parse(a); err != nil {
		return 0, 0, err
	}
	if to, err = parse(b); err != nil {
		return 0, 0, err
	}
	if from == to {
		return 0, 0, fmt.Errorf("%q is an empty window", s)
	}
	return from, to, nil
}

// offPeak says whether t (UTC) is inside the off-peak window.
func (c Config) offPeak(t time.Time) bool {
	t = t.UTC()
	d := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second
	if c.offFrom < c.offTo {
		return d >= c.offFrom && d < c.offTo
	}
	return d >= c.offFrom || d < c.offTo // wraps past midnight
}

// ranges splits the vshards into RangeSize ranges.
func (c Config) ranges() [][2]uint16 {
	var out [][2]uint16
	for from := 0; from < 1024; from += c.RangeSize {
		out = append(out, [2]uint16{uint16(from), uint16(min(from+c.RangeSize, 1024) - 1)})
	}
	return out
}
