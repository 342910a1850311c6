package server

import (
	"context"
	"sync"
)

// service is the one shape of the router's background services (the
// replica monitor, scheduled reconciliation, dead-letter upkeep, queue
// health, the shard-map recorder, the resharding job runner): Start begins
// the work until ctx ends or Stop; Stop ends it and waits for it. Both are
// safe to call twice, and Stop without Start.
type service interface {
	Start(ctx context.Context)
	Stop()
}

// services runs the router's background services: started in order,
// stopped in the reverse order.
type services struct {
	mu      sync.Mutex
	running []service
	stopped bool
}

// start starts each of svcs under ctx, unless the services were stopped.
func (s *services) start(ctx context.Context, svcs ...service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	for _, svc := range svcs {
		svc.Start(ctx)
		s.running = append(s.running, svc)
	}
}

// Stop stops every started service, the last started first. Safe to call
// twice.
func (s *services) Stop() {
	s.mu.Lock()
	running := s.running
	s.running, s.stopped = nil, true
	s.mu.Unlock()
	for i := len(running) - 1; i >= 0; i-- {
		running[i].Stop()
	}
}
