package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/replica"
)

// replicaWaiter confirms replicated durability: it waits until at least one
// replica of a cluster has applied a GTID position. It opens no pool of its
// own: it waits on the replica pools the router shares (pools.replicas),
// taking a wait slot of each (replica.Pools.Hold) so that waits never take
// the connections the lag checks and replica reads need. A replica that
// cannot be reached is tried again on a later call.
type replicaWaiter struct {
	pools *replica.Pools
}

var _ broker.ReplicaWaiter = replicaWaiter{}

// WaitReplicated implements broker.ReplicaWaiter: the first replica to
// apply gtid within timeout answers; if none does, the error says why.
func (w replicaWaiter) WaitReplicated(ctx context.Context, cluster, gtid string, timeout time.Duration) error {
	dsns := w.pools.Replicas(cluster)
	if len(dsns) == 0 {
		return fmt.Errorf("cluster %s has no replica", cluster)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	errc := make(chan error, len(dsns))
	for _, dsn := range dsns {
		go func() {
			st, release, err := w.pools.Hold(ctx, dsn)
			if err != nil {
				errc <- err
				return
			}
			defer release()
			errc <- st.WaitGTID(ctx, gtid, timeout)
		}()
	}
	var errs []error
	for range dsns {
		err := <-errc
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
