package loadtest

import (
	"os"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/procstat"
	"github.com/shardmq/shardmq/internal/testbed"
)

// fakeProcs drives a cpuTracker through readings given per step: CPU
// per pid (a pid missing from a step is not running) and the machine's.
type fakeProcs struct {
	step  int
	procs []map[int]time.Duration
	mach  []time.Duration
}

func (f *fakeProcs) tracker(names ...string) *cpuTracker {
	var sources []CPUSource
	for _, n := range names {
		want := map[string]func(int) bool{"router": func(pid int) bool { return pid < 10 }, "mariadbd": func(pid int) bool { return pid >= 10 }}[n]
		sources = append(sources, CPUSource{Name: n, PIDs: func() []int {
			var pids []int
			for pid := range f.procs[f.step] {
				if want(pid) {
					pids = append(pids, pid)
				}
			}
			return pids
		}})
	}
	t := newCPUTracker(sources)
	t.read = func(pid int) (time.Duration, bool) { d, ok := f.procs[f.step][pid]; return d, ok }
	t.machine = func() time.Duration { return f.mach[f.step] }
	t.now = func() time.Time { return time.Unix(1000+int64(f.step)*5, 0) } // 5 s a step
	return t
}

func TestCPUTracker(t *testing.T) {
	testbed.Need(t)
	s := time.Second
	tests := []struct {
		name  string
		procs []map[int]time.Duration // per step: start, samples…, finish
		mach  []time.Duration
		msgs  int64
		want  []CPUUse
	}{{
		name:  "steady",
		procs: []map[int]time.Duration{{1: s, 10: 0, 11: s}, {1: 3 * s, 10: 2 * s, 11: 3 * s}, {1: 6 * s, 10: 4 * s, 11: 5 * s}},
		mach:  []time.Duration{100 * s, 109 * s, 118 * s},
		msgs:  50000,
		want: []CPUUse{
			{Name: "machine", Seconds: 18, Cores: 1.8, PerMessageUS: 360},
			{Name: "router", Seconds: 5, Cores: 0.5, PerMessageUS: 100},
			{Name: "mariadbd", Seconds: 8, Cores: 0.8, PerMessageUS: 160},
		},
	}, {
		// Server 11 is killed after the first sample and comes back as 12:
		// 11 counts up to its last reading, 12 from its start.
		name:  "a server restarted",
		procs: []map[int]time.Duration{{1: 0, 10: 0, 11: 0}, {1: s, 10: s, 11: 2 * s}, {1: 2 * s, 10: 2 * s, 12: s / 2}},
		mach:  []time.Duration{s, 6 * s, 11 * s},
		msgs:  1000,
		want: []CPUUse{
			{Name: "machine", Seconds: 10, Cores: 1, PerMessageUS: 10000},
			{Name: "router", Seconds: 2, Cores: 0.2, PerMessageUS: 2000},
			{Name: "mariadbd", Seconds: 4.5, Cores: 0.45, PerMessageUS: 4500, Partial: true},
		},
	}, {
		name:  "no router running, no messages",
		procs: []map[int]time.Duration{{10: 0}, {10: s}, {10: 2 * s}},
		mach:  []time.Duration{s, 2 * s, 3 * s},
		want: []CPUUse{
			{Name: "machine", Seconds: 2, Cores: 0.2},
			{Name: "mariadbd", Seconds: 2, Cores: 0.2},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeProcs{procs: tc.procs, mach: tc.mach}
			tr := f.tracker("router", "mariadbd")
			tr.start()
			for f.step = 1; f.step < len(tc.procs)-1; f.step++ {
				tr.sample()
			}
			got := tr.finish(tc.msgs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%d: got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// The figures come from the real /proc: burning CPU in this process shows
// up in its own time and in the machine's.
func TestCPUFromProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	self := SelfCPU()
	tr := newCPUTracker([]CPUSource{self})
	tr.start()
	start, _ := procstat.Process(os.Getpid())
	x, deadline := 0, time.Now().Add(10*time.Second)
	for time.Now().Before(deadline) { // until 0.2 s of CPU, however busy the machine
		x++
		if x%1000000 == 0 {
			if now, _ := procstat.Process(os.Getpid()); now-start >= 200*time.Millisecond {
				break
			}
		}
	}
	u := tr.finish(1)
	if len(u) != 2 || u[1].Seconds < 0.2 || u[0].Seconds < u[1].Seconds*0.9 {
		t.Fatalf("after a busy loop (%d turns): %+v", x, u)
	}
}

// The timeline puts each sample's interval on the second of its middle,
// as cores busy in it, per source and for the machine.
func TestCPUTimeline(t *testing.T) {
	testbed.Need(t)
	s := time.Second
	f := &fakeProcs{procs: []map[int]time.Duration{{1: 0}, {1: 2 * s}, {1: 3 * s}}, mach: []time.Duration{10 * s, 18 * s, 21 * s}}
	tr := f.tracker("router")
	tr.start()
	f.step = 1
	tr.sample() // 0-5 s: middle at 2.5 s
	f.step = 2
	tr.sample() // 5-10 s: middle at 7.5 s
	got := tr.timeline()
	if len(got) != 2 || got[0].Second != 2 || got[1].Second != 7 {
		t.Fatalf("timeline %+v", got)
	}
	if got[0].Cores["router"] != 0.4 || got[0].Cores["machine"] != 1.6 || got[1].Cores["router"] != 0.2 || got[1].Cores["machine"] != 0.6 {
		t.Fatalf("cores %+v", got)
	}
}
