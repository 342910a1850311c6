// Package procstat reads CPU time from Linux's /proc: of a process and of
// the whole machine. Load tests and benchmarks use it to say where the
// cores of a shared box went.
package procstat

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// Process is the user and system time pid has used, from /proc/PID/stat;
// false when it cannot be read (no such process, not Linux).
func Process(pid int) (time.Duration, bool) {
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

// Machine is the time every CPU spent not idle (user, nice, system,
// irq, softirq, steal) since boot, from /proc/stat; 0 when unreadable.
func Machine() time.Duration {
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
