package loadtest

import (
	"os"
	"testing"
	"time"
)

func TestCPUUse(t *testing.T) {
	src := []CPUSource{{Name: "router"}, {Name: "mariadbd"}}
	at := time.Unix(1000, 0)
	sample := func(after time.Duration, machine time.Duration, router, servers map[int]time.Duration) cpuSample {
		return cpuSample{at: at.Add(after), machine: machine, procs: []map[int]time.Duration{router, servers}}
	}
	tests := []struct {
		name string
		a, b cpuSample
		msgs int64
		want []CPUUse
	}{{
		name: "steady",
		a:    sample(0, 100*time.Second, map[int]time.Duration{1: time.Second}, map[int]time.Duration{2: 0, 3: time.Second}),
		b:    sample(10*time.Second, 118*time.Second, map[int]time.Duration{1: 6 * time.Second}, map[int]time.Duration{2: 4 * time.Second, 3: 5 * time.Second}),
		msgs: 50000,
		want: []CPUUse{
			{Name: "machine", Seconds: 18, Cores: 1.8, PerMessageUS: 360},
			{Name: "router", Seconds: 5, Cores: 0.5, PerMessageUS: 100},
			{Name: "mariadbd", Seconds: 8, Cores: 0.8, PerMessageUS: 160},
		},
	}, {
		name: "a server restarted: partial",
		a:    sample(0, 0+time.Second, map[int]time.Duration{1: 0}, map[int]time.Duration{2: 0, 3: 0}),
		b:    sample(time.Second, 2*time.Second, map[int]time.Duration{1: time.Second / 2}, map[int]time.Duration{2: time.Second / 4, 9: time.Second / 10}),
		msgs: 1000,
		want: []CPUUse{
			{Name: "machine", Seconds: 1, Cores: 1, PerMessageUS: 1000},
			{Name: "router", Seconds: 0.5, Cores: 0.5, PerMessageUS: 500},
			{Name: "mariadbd", Seconds: 0.25, Cores: 0.25, PerMessageUS: 250, Partial: true},
		},
	}, {
		name: "no router measured, no messages",
		a:    sample(0, time.Second, map[int]time.Duration{}, map[int]time.Duration{2: 0}),
		b:    sample(time.Second, 2*time.Second, map[int]time.Duration{}, map[int]time.Duration{2: time.Second}),
		want: []CPUUse{
			{Name: "machine", Seconds: 1, Cores: 1},
			{Name: "mariadbd", Seconds: 1, Cores: 1},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := cpuUse(src, tc.a, tc.b, tc.msgs)
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
	a := sampleCPU([]CPUSource{self})
	start, _ := processCPU(os.Getpid())
	x, deadline := 0, time.Now().Add(10*time.Second)
	for time.Now().Before(deadline) { // until 0.2 s of CPU, however busy the machine
		x++
		if x%1000000 == 0 {
			if now, _ := processCPU(os.Getpid()); now-start >= 200*time.Millisecond {
				break
			}
		}
	}
	b := sampleCPU([]CPUSource{self})
	u := cpuUse([]CPUSource{self}, a, b, 1)
	if len(u) != 2 || u[1].Seconds < 0.2 || u[0].Seconds < u[1].Seconds*0.9 {
		t.Fatalf("after a busy loop (%d turns): %+v", x, u)
	}
}
