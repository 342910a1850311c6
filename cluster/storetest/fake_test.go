package storetest

import (
	"testing"

	"github.com/shardmq/shardmq/cluster/clustertest"
)

// The fake the broker's and the cluster's tests run on keeps the
// contract: no database needed.
func TestFake(t *testing.T) {
	t.Parallel()
	Run(t, clustertest.NewStore())
}
