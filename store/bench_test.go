package store

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkPlaceholders measures building the multi-row VALUES list of a
// 500-message batch, which every produce statement does.
func BenchmarkPlaceholders(b *testing.B) {
	for i := 0; i < b.N; i++ {
		placeholders(500, 11)
	}
}

// BenchmarkProduceBatch commits batches of 1, 20 and 100 new messages, one
// transaction at a time, into the test bed's primary, and reports the
// primary's CPU per transaction and per message (from /proc, on Linux).
// It is what group commit rests on: a commit costs the server far more
// than a message in it, so fewer, larger transactions are cheaper. Run it
// with `make bench`; compare the per-transaction and per-message figures,
// not the absolute rates, across machines.
func BenchmarkProduceBatch(b *testing.B) {
	f := setup(b)
	pid := bed.Clusters[0].Primary.PID
	payload := `{"order":"` + strings.Repeat("x", 180) + `"}`
	for _, size := range []int{1, 20, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			ctx := context.Background()
			items := make([]ProduceItem, size)
			cpu0, okCPU := processCPU(pid)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				for j := range items {
					items[j] = f.item("bench", fmt.Sprintf("b%d-%d-%d", size, i, j), payload)
				}
				if _, err := f.st.Produce(ctx, items); err != nil {
					b.Fatal(err)
				}
			}
			elapsed := time.Since(start)
			msgs := float64(b.N * size)
			b.ReportMetric(msgs/elapsed.Seconds(), "msgs/s")
			if cpu1, ok := processCPU(pid); ok && okCPU {
				used := float64((cpu1 - cpu0).Microseconds())
				b.ReportMetric(used/float64(b.N), "server-cpu-µs/tx")
				b.ReportMetric(used/msgs, "server-cpu-µs/msg")
			}
		})
	}
}

// processCPU is the user+system CPU time pid has used, read from
// /proc/PID/stat (clock ticks of 10 ms, the Linux default USER_HZ).
func processCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil || pid == 0 {
		return 0, false
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: utime and stime are the 12th and 13th of them.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(fields[11], 10, 64)
	k, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+k) * 10 * time.Millisecond, true
}
