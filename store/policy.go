package store

import (
	"math"
	"time"

	"github.com/shardmq/shardmq/domain"
)

// RetryPolicy is a subscription's retry rule: how many attempts a delivery
// gets and how long to wait before each retry.
type RetryPolicy struct {
	MaxAttempts int           // Defaults to 5 (domain.DefaultMaxAttempts), as do the others.
	Initial     time.Duration // first backoff; defaults to 1s
	Max         time.Duration // backoff cap; defaults to 10m
	Multiplier  float64       // growth per attempt; defaults to 2
	Jitter      float64       // ± fraction of randomness, 0..1; defaults to 0.2
}

// WithDefaults fills zero fields with domain's defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = domain.DefaultMaxAttempts
	}
	if p.Initial <= 0 {
		p.Initial = domain.DefaultBackoffInitial
	}
	if p.Max <= 0 {
		p.Max = domain.DefaultBackoffMax
	}
	if p.Multiplier < 1 {
		p.Multiplier = domain.DefaultBackoffMultiplier
	}
	if p.Jitter < 0 || p.Jitter > 1 {
		p.Jitter = domain.DefaultBackoffJitter
	}
	return p
}

// Backoff is the wait before the retry that follows attempt (1-based):
// Initial × Multiplier^(attempt-1), capped at Max, spread by ±Jitter using
// r, a uniform random number in [0, 1).
func (p RetryPolicy) Backoff(attempt int, r float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.Initial) * math.Pow(p.Multiplier, float64(attempt-1))
	if d > float64(p.Max) {
		d = float64(p.Max)
	}
	d *= 1 + p.Jitter*(2*r-1)
	return time.Duration(d)
}
