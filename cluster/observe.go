package cluster

import (
	"context"
	"time"
)

// Observer is told every call's operation, time and outcome (metrics). The
// time covers the whole call: the breaker, the store's transaction with
// its retries and its wait for a pooled connection, and a run on the
// successor after a hand-over.
type Observer func(op string, took time.Duration, err error)

// Observe decorates the call point c: observe is told each of its calls.
// A nil observe leaves c as it is.
func Observe(c Caller, observe Observer) Caller {
	if observe == nil {
		return c
	}
	return &observed{c: c, observe: observe}
}

type observed struct {
	c       Caller
	observe Observer
}

func (o *observed) Do(ctx context.Context, op string, fn func(ctx context.Context, s Store) error) error {
	start := time.Now()
	err := o.c.Do(ctx, op, fn)
	o.observe(op, time.Since(start), err)
	return err
}
