package loadtest

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
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
// drain included, per message moved (produced plus consumed) in that time.
type CPUUse struct {
	Name         string  `json:"name"` // "machine": every core, the kernel included
	Seconds      float64 `json:"cpu_s"`
	Cores        float64 `json:"cores"` // mean cores busy
	PerMessageUS float64 `json:"us_per_message"`
	// Partial: a process of the source ended during the phase (a fault),
	// so its time is missing.
	Partial bool `json:"partial,omitempty"`
}

// userHZ is the unit of /proc CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

type cpuSample struct {
	at      time.Time
	machine time.Duration
	procs   []map[int]time.Duration // per source, per pid
}

func sampleCPU(sources []CPUSource) cpuSample {
	s := cpuSample{at: time.Now(), machine: machineBusy(), procs: make([]map[int]time.Duration, len(sources))}
	for i, src := range sources {
		s.procs[i] = map[int]time.Duration{}
		for _, pid := range src.PIDs() {
			if d, ok := processCPU(pid); ok {
				s.procs[i][pid] = d
			}
		}
	}
	return s
}

// cpuUse compares two samples; messages is what the phase moved between
// them. Nothing is reported where /proc cannot be read.
func cpuUse(sources []CPUSource, a, b cpuSample, messages int64) []CPUUse {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 || a.machine == 0 {
		return nil
	}
	use := func(name string, d time.Duration) CPUUse {
		u := CPUUse{Name: name, Seconds: d.Seconds(), Cores: d.Seconds() / wall}
		if messages > 0 {
			u.PerMessageUS = float64(d.Microseconds()) / float64(messages)
		}
		return u
	}
	out := []CPUUse{use("machine", b.machine-a.machine)}
	for i, src := range sources {
		var d time.Duration
		partial := false
		for pid, t0 := range a.procs[i] {
			t1, ok := b.procs[i][pid]
			if !ok {
				partial = true
				continue
			}
			d += t1 - t0
		}
		for pid := range b.procs[i] {
			if _, ok := a.procs[i][pid]; !ok {
				partial = true // started during the phase: its time before is unknown
			}
		}
		if len(a.procs[i]) == 0 && len(b.procs[i]) == 0 {
			continue
		}
		u := use(src.Name, d)
		u.Partial = partial
		out = append(out, u)
	}
	return out
}

// processCPU is the user and system time pid has used, from /proc/PID/stat.
func processCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name is in parentheses and may hold spaces; utime and
	// stime are the 12th and 13th fields after it.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+k) * time.Second / userHZ, true
}

// machineBusy is the time every CPU spent not idle (user, nice, system,
// irq, softirq, steal) since boot, from /proc/stat; 0 when unreadable.
func machineBusy() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / userHZ
}

// SelfCPU is the generator's own process.
func SelfCPU() CPUSource {
	pid := os.Getpid()
	return CPUSource{Name: "loadtest", PIDs: func() []int { return []int{pid} }}
}
