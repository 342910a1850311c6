package retention

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/store"
)

func TestOffPeakWindow(t *testing.T) {
	t.Parallel()
	cases := []struct {
		window string
		at     string
		want   bool
	}{
		{"02:00-05:00", "02:00", true},
		{"02:00-05:00", "04:59", true},
		{"02:00-05:00", "05:00", false},
		{"02:00-05:00", "01:59", false},
		{"22:00-03:00", "23:30", true},
		{"22:00-03:00", "00:10", true},
		{"22:00-03:00", "03:00", false},
		{"22:00-03:00", "12:00", false},
	}
	for _, c := range cases {
		cfg, err := Config{OffPeak: c.window}.WithDefaults()
		if err != nil {
			t.Fatal(err)
		}
		at, _ := time.Parse("15:04", c.at)
		if got := cfg.offPeak(at); got != c.want {
			t.Errorf("%s at %s: %v, want %v", c.window, c.at, got, c.want)
		}
	}
	for _, bad := range []string{"2-5", "02:00", "05:00-05:00", "25:00-01:00"} {
		if _, err := (Config{OffPeak: bad}).WithDefaults(); err == nil || !strings.Contains(err.Error(), "OffPeak") {
			t.Errorf("window %q accepted (%v)", bad, err)
		}
	}
	if _, err := (Config{HotMonths: 12, WarmMonths: 6}).WithDefaults(); err == nil {
		t.Error("a warm window shorter than the hot one was accepted")
	}
}

// TestUpkeepAnalyzesMonthlyAndRebuildsOffPeak: statistics are refreshed
// once per AnalyzeEvery whatever the hour; a partition most of whose space
// is free is rebuilt only inside the off-peak window, and gives it back.
func TestUpkeepAnalyzesMonthlyAndRebuildsOffPeak(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	ctx := context.Background()
	// The thresholds are lowered to what a test can fragment quickly: the
	// server counts deleted rows' pages as data until its purge runs.
	f := setup(t, date(2024, 5, 10), Config{OffPeak: "02:00-04:00", MinFreeBytes: 1 << 20, FreeRatio: 0.1})
	st := f.hot["c1"]
	// About 12 MB of messages in May on c1, then most of them deleted.
	payload := strings.Repeat("x", 2000)
	for batch := 0; batch < 12; batch++ {
		var items []store.ProduceItem
		for i := 0; i < 500; i++ {
			id := f.ids.Next()
			items = append(items, store.ProduceItem{Msg: &store.Message{ID: id, VShard: 9, Topic: "bulk", Key: fmt.Sprintf("b%d-%d", batch, i),
				PayloadJSON: false, Payload: []byte(payload), CreatedAt: idgen.Time(id)}, Hash: make([]byte, 16), AvailableAt: f.clock.Now(),
				Subscriptions: []string{"default"}})
		}
		if _, err := st.Produce(ctx, items); err != nil {
			t.Fatal(err)
		}
	}
	may := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	if _, err := st.TierDelete(ctx, store.TableMessages, store.Span{From: may, To: may.AddDate(0, 1, 0), VFrom: 0, VTo: 1023}, 1000, 0); err != nil {
		t.Fatal(err)
	}
	if err := st.Analyze(ctx, store.TableMessages); err != nil {
		t.Fatal(err)
	}
	free := func() store.Partition {
		t.Helper()
		parts, err := st.Partitions(ctx, store.TableMessages)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if p.Name == "p202405" {
				return p
			}
		}
		t.Fatal("no p202405")
		return store.Partition{}
	}
	before := free()
	if before.DataFree < 1<<20 || before.FreeRatio() <= 0.1 {
		t.Fatalf("the server reports %d bytes free (%.2f) after the delete: the test made nothing to rebuild", before.DataFree, before.FreeRatio())
	}
	items := func(what string) float64 {
		return testutilCounter(t, f.job, JobUpkeep, what)
	}

	f.clock.Set(time.Date(2024, 5, 10, 12, 0, 0, 0, time.UTC)) // peak hours
	if err := f.job.Upkeep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := items("table_analyzed"); got != 4 {
		t.Fatalf("analyzed %v tables, want 4 (2 tables on 2 clusters)", got)
	}
	if got := items("partition_rebuilt"); got != 0 {
		t.Fatalf("rebuilt %v partitions at noon", got)
	}
	f.clock.Set(time.Date(2024, 5, 11, 3, 0, 0, 0, time.UTC)) // off-peak, a day later
	if err := f.job.Upkeep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := items("table_analyzed"); got != 4 {
		t.Fatalf("analyzed again after a day: %v", got)
	}
	if got := items("partition_rebuilt"); got < 1 {
		t.Fatalf("the fragmented partition was not rebuilt off-peak (free %d, ratio %.2f)", before.DataFree, before.FreeRatio())
	}
	if after := free(); after.DataFree >= before.DataFree {
		t.Errorf("rebuild left %d bytes free, %d before", after.DataFree, before.DataFree)
	}
	f.clock.Set(time.Date(2024, 6, 12, 12, 0, 0, 0, time.UTC)) // a month later
	if err := f.job.Upkeep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := items("table_analyzed"); got != 8 {
		t.Fatalf("analyzed %v tables after a month, want 8", got)
	}
}
