package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/store"
)

// replicaWaiter confirms replicated durability: it waits until at least one
// replica of a cluster has applied a GTID position. Replica pools are opened
// on first use and kept; a replica that cannot be reached is tried again on
// a later call.
type replicaWaiter struct {
	dsns func(cluster string) []string // a cluster's replicas in the topology in use
	mu   sync.Mutex
	// pools by replica DSN
	pools map[string]*store.Store
}

var _ broker.ReplicaWaiter = (*replicaWaiter)(nil)

func newReplicaWaiter(dsns func(cluster string) []string) *replicaWaiter {
	return &replicaWaiter{dsns: dsns, pools: map[string]*store.Store{}}
}

func (w *replicaWaiter) pool(ctx context.Context, dsn string) (*store.Store, error) {
	w.mu.Lock()
	st, ok := w.pools[dsn]
	w.mu.Unlock()
	if ok {
		return st, nil
	}
	st, err := store.Open(ctx, dsn, store.Options{MaxOpen: 16})
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.pools[dsn]; ok {
		st.Close()
		return prev, nil
	}
	w.pools[dsn] = st
	return st, nil
}

// WaitReplicated implements broker.ReplicaWaiter: the first replica to
// apply gtid within timeout answers; if none does, the error says why.
func (w *replicaWaiter) WaitReplicated(ctx context.Context, cluster, gtid string, timeout time.Duration) error {
	dsns := w.dsns(cluster)
	if len(dsns) == 0 {
		return fmt.Errorf("cluster %s has no replica", cluster)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	errc := make(chan error, len(dsns))
	for _, dsn := range dsns {
		go func() {
			st, err := w.pool(ctx, dsn)
			if err != nil {
				errc <- err
				return
			}
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

func (w *replicaWaiter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, st := range w.pools {
		st.Close()
	}
	w.pools = map[string]*store.Store{}
}
