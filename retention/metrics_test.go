package retention

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// testutilCounter reads shardmq_retention_items_total{job, what}.
func testutilCounter(t *testing.T, j *Job, job, what string) float64 {
	t.Helper()
	return testutil.ToFloat64(j.items.WithLabelValues(job, what))
}
