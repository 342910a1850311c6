package loadtest

import (
	"os"
	"sync"
	"time"

	"github.com/shardmq/shardmq/internal/procstat"
)

// CPUSource is a set of processes whose CPU time each phase reports per
// message: the router, the sandbox's servers, the generator itself. The
// machine as a whole is always reported. On one shared box this is what
// says where the cores went, and whether they were all busy (a closed
// loop that leaves cores idle is bound by latency, not by CPU).
type CPUSource struct {
	Name string
	// PIDs is asked at every sample: a restarted server has a new pid.
	PIDs func() []int
}

// CPUUse is one source's (or the machine's) CPU over a phase, warm-up and
// drain included, per message moved in that time (a message produced and
// consumed in the phase counts twice).
type CPUUse struct {
	Name         string  `json:"name"` // "machine": every core, the kernel included
	Seconds      float64 `json:"cpu_s"`
	Cores        float64 `json:"cores"` // mean cores busy
	PerMessageUS float64 `json:"us_per_message"`
	// Partial: a process of the source ended during the phase (a fault):
	// up to a second of its time is missing.
	Partial bool `json:"partial,omitempty"`
	// MixSeconds is the part of Seconds spent before the mixed phase's
	// producers stopped (the rest went on the drain, consumers only):
	// what splits a message's cost between producing and consuming.
	MixSeconds float64 `json:"mix_cpu_s,omitempty"`
}

// cpuTracker follows the CPU time of a phase's sources. It samples every
// second as well as at the ends, keeping each process's first and last
// reading, so a process that is killed loses at most a second and one
// started during the phase (a restart) counts from its start.
type cpuTracker struct {
	sources []CPUSource
	read    func(pid int) (time.Duration, bool) // procstat.Process
	machine func() time.Duration                // procstat.Machine
	now     func() time.Time

	mu       sync.Mutex
	at       time.Time
	machine0 time.Duration
	first    []map[int]time.Duration // per source and pid: CPU when first seen (0 if it started later)
	last     []map[int]time.Duration // and when last seen
	gone     []bool                  // a process of the source ended
	// At the mark: the machine's CPU and each source's since the start.
	marked      bool
	markMachine time.Duration
	markSources []time.Duration
	// The timeline: at each sample, the cores each source (and the
	// machine) kept busy since the one before, put on the second of the
	// interval's middle.
	prevAt      time.Time
	prevMachine time.Duration
	prevUsed    []time.Duration
	series      map[string]map[int]float64
}

// CPUPoint is one second of a phase's CPU: the cores each part of the
// machine kept busy, by source name ("machine": all of it).
type CPUPoint struct {
	Second int                `json:"t"`
	Cores  map[string]float64 `json:"cores"`
}

func newCPUTracker(sources []CPUSource) *cpuTracker {
	return &cpuTracker{sources: sources, read: procstat.Process, machine: procstat.Machine, now: time.Now}
}

// start takes the first reading.
func (t *cpuTracker) start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.at, t.machine0 = t.now(), t.machine()
	t.first = make([]map[int]time.Duration, len(t.sources))
	t.last = make([]map[int]time.Duration, len(t.sources))
	t.gone = make([]bool, len(t.sources))
	t.prevAt, t.prevMachine, t.prevUsed = t.at, t.machine0, make([]time.Duration, len(t.sources))
	t.series = map[string]map[int]float64{}
	for i, src := range t.sources {
		t.first[i], t.last[i] = map[int]time.Duration{}, map[int]time.Duration{}
		for _, pid := range src.PIDs() {
			if d, ok := t.read(pid); ok {
				t.first[i][pid], t.last[i][pid] = d, d
			}
		}
	}
}

// sample takes a reading between start and finish.
func (t *cpuTracker) sample() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, src := range t.sources {
		seen := map[int]bool{}
		for _, pid := range src.PIDs() {
			d, ok := t.read(pid)
			if !ok {
				continue
			}
			seen[pid] = true
			if _, known := t.first[i][pid]; !known {
				t.first[i][pid] = 0 // started during the phase
			}
			t.last[i][pid] = d
		}
		for pid := range t.last[i] {
			if !seen[pid] {
				t.gone[i] = true
			}
		}
	}
	t.point()
}

// point adds the interval since the previous sample to the timeline; t.mu
// is held.
func (t *cpuTracker) point() {
	now := t.now()
	wall := now.Sub(t.prevAt)
	if wall < 100*time.Millisecond || t.series == nil {
		return
	}
	sec := int((t.prevAt.Sub(t.at) + wall/2) / time.Second)
	add := func(name string, d time.Duration) {
		if t.series[name] == nil {
			t.series[name] = map[int]float64{}
		}
		t.series[name][sec] = max(d.Seconds(), 0) / wall.Seconds()
	}
	m := t.machine()
	add("machine", m-t.prevMachine)
	t.prevMachine = m
	for i, src := range t.sources {
		if len(t.last[i]) == 0 {
			continue
		}
		u := t.used(i)
		add(src.Name, u-t.prevUsed[i])
		t.prevUsed[i] = u
	}
	t.prevAt = now
}

// timeline is the phase's CPU second by second (the seconds sampled).
func (t *cpuTracker) timeline() []CPUPoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	last := -1
	for _, by := range t.series {
		for sec := range by {
			last = max(last, sec)
		}
	}
	var out []CPUPoint
	for sec := 0; sec <= last; sec++ {
		p := CPUPoint{Second: sec, Cores: map[string]float64{}}
		for name, by := range t.series {
			if v, ok := by[sec]; ok {
				p.Cores[name] = v
			}
		}
		if len(p.Cores) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// used is a source's CPU since the start; t.mu is held.
func (t *cpuTracker) used(i int) time.Duration {
	var d time.Duration
	for pid, end := range t.last[i] {
		d += end - t.first[i][pid]
	}
	return d
}

// mark takes a reading and keeps what each source used so far.
func (t *cpuTracker) mark() {
	t.sample()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.marked = true
	t.markMachine = t.machine() - t.machine0
	t.markSources = make([]time.Duration, len(t.sources))
	for i := range t.sources {
		t.markSources[i] = t.used(i)
	}
}

// markAt marks at the given time unless stop is closed first.
func (t *cpuTracker) markAt(at time.Time, stop <-chan struct{}) {
	timer := time.NewTimer(time.Until(at))
	defer timer.Stop()
	select {
	case <-timer.C:
		t.mark()
	case <-stop:
	}
}

// run samples every interval until stop is closed.
func (t *cpuTracker) run(interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			t.sample()
		}
	}
}

// finish takes the last reading and reports the phase; messages is what
// it moved. Nothing is reported where /proc cannot be read.
func (t *cpuTracker) finish(messages int64) []CPUUse {
	t.sample()
	t.mu.Lock()
	defer t.mu.Unlock()
	wall := t.now().Sub(t.at).Seconds()
	if wall <= 0 || t.machine0 == 0 {
		return nil
	}
	use := func(name string, d time.Duration) CPUUse {
		u := CPUUse{Name: name, Seconds: d.Seconds(), Cores: d.Seconds() / wall}
		if messages > 0 {
			u.PerMessageUS = float64(d.Microseconds()) / float64(messages)
		}
		return u
	}
	out := []CPUUse{use("machine", t.machine()-t.machine0)}
	if t.marked {
		out[0].MixSeconds = t.markMachine.Seconds()
	}
	for i, src := range t.sources {
		if len(t.last[i]) == 0 {
			continue
		}
		u := use(src.Name, t.used(i))
		u.Partial = t.gone[i]
		if t.marked {
			u.MixSeconds = t.markSources[i].Seconds()
		}
		out = append(out, u)
	}
	return out
}

// SelfCPU is the generator's own process.
func SelfCPU() CPUSource {
	pid := os.Getpid()
	return CPUSource{Name: "loadtest", PIDs: func() []int { return []int{pid} }}
}
