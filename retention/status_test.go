package retention

import (
	"fmt"
	"testing"
	"time"

	"github.com/shardmq/shardmq/store"
)

// The tiers are the windows' months, as docs/retention.md says them: on
// 15 July with the defaults April to July are hot, last July to March
// warm, anything older cold.
func TestStatusTiersAndArchiveState(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 7, 15, 12, 0, 0, 0, time.UTC)
	named := false
	j, err := New(Config{Now: func() time.Time { return now }, ColdDir: "var/archive"}, Deps{
		Hot: func() map[string]*store.Store { return nil }, ArchiveNamed: func() bool { return named }})
	if err != nil {
		t.Fatal(err)
	}
	st := j.Status()
	want := `[{hot 2026-04 2026-07 each message's cluster} {warm 2025-07 2026-03 the archive cluster} {cold  2025-06 files under var/archive}]`
	if got := fmt.Sprint(st.Tiers); got != want {
		t.Fatalf("tiers %s, want %s", got, want)
	}
	if st.ArchiveState != "none" || st.Archive {
		t.Fatalf("no archive cluster named: %q %v", st.ArchiveState, st.Archive)
	}
	named = true
	if st := j.Status(); st.ArchiveState != "unreachable" {
		t.Fatalf("named but not connected: %q", st.ArchiveState)
	}
}
