package procstat

import (
	"os"
	"runtime"
	"testing"
)

func TestReadsProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("no /proc")
	}
	if _, ok := Process(os.Getpid()); !ok {
		t.Fatal("own CPU time unreadable")
	}
	if _, ok := Process(-1); ok {
		t.Fatal("a pid that cannot exist was read")
	}
	if Machine() <= 0 {
		t.Fatal("machine busy time unreadable")
	}
}
