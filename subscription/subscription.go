// Package subscription defines subscriptions — consumer groups on a topic
// with their own retry policy, ordering flag and dead-letter alarm — and the
// interface of the place they are kept so that every router sees them.
package subscription

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
	"github.com/shardmq/shardmq/topology"
)

// Default is the implicit subscription of a topic that has none.
const Default = "default"

// Backoff is the retry wait: initial × multiplier^(attempt-1), capped at
// max, spread by ±jitter.
type Backoff struct {
	InitialMS  int64   `json:"initial_ms"`
	MaxMS      int64   `json:"max_ms"`
	Multiplier float64 `json:"multiplier"`
	Jitter     float64 `json:"jitter"`
}

// Alarm raises an alert when dead letters grow by more than GrowthPercent
// within Window (a Go duration such as "1h").
type Alarm struct {
	GrowthPercent float64 `json:"growth_percent"`
	Window        string  `json:"window"`
}

// Subscription is one consumer group's configuration.
type Subscription struct {
	Topic           string    `json:"topic"`
	Name            string    `json:"name"`
	MaxAttempts     int       `json:"max_attempts"`
	Backoff         Backoff   `json:"backoff"`
	Ordered         bool      `json:"ordered"`
	DeadLetterAlarm Alarm     `json:"dead_letter_alarm"`
	CreatedAt       time.Time `json:"created_at"`
	// CreatedBy names the token that made the subscription (none on an
	// open router, or for a global admin), for the per-token topic quota
	// (Limits.MaxTopicsPerCreator).
	CreatedBy string `json:"created_by,omitempty"`
	// Queue is what the SQS API (package sqs) keeps of a subscription it
	// serves as a queue — its attributes, tags and move tasks — in that
	// package's own JSON, kept verbatim here so that every router sees it.
	// Nil for a subscription never configured through SQS. The native PUT
	// cannot set it and keeps the stored one (Registry.Put).
	Queue json.RawMessage `json:"queue,omitempty"`
}

// Implicit reports whether s is the implicit default subscription of a
// topic that has no stored one (such a subscription has no creation time).
func (s Subscription) Implicit() bool { return s.CreatedAt.IsZero() }

// WithDefaults fills unset fields: 5 attempts, backoff 1s ×2 up to 10m with
// 20 % jitter, alarm at 50 % growth within 1h.
func (s Subscription) WithDefaults() Subscription {
	if s.MaxAttempts == 0 {
		s.MaxAttempts = domain.DefaultMaxAttempts
	}
	if s.Backoff.InitialMS == 0 {
		s.Backoff.InitialMS = domain.DefaultBackoffInitial.Milliseconds()
	}
	if s.Backoff.MaxMS == 0 {
		s.Backoff.MaxMS = domain.DefaultBackoffMax.Milliseconds()
	}
	if s.Backoff.Multiplier == 0 {
		s.Backoff.Multiplier = domain.DefaultBackoffMultiplier
	}
	if s.DeadLetterAlarm.GrowthPercent == 0 {
		s.DeadLetterAlarm.GrowthPercent = 50
	}
	if s.DeadLetterAlarm.Window == "" {
		s.DeadLetterAlarm.Window = "1h"
	}
	return s
}

// MaxQueueBytes bounds a subscription's SQS queue state (Queue), so that
// the stored configuration stays small in every place that keeps it.
const MaxQueueBytes = 32 << 10

// ErrInvalid marks a subscription that fails validation.
var ErrInvalid = errors.New("invalid subscription")

// Validate checks a subscription after WithDefaults.
func (s Subscription) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	switch {
	case !topology.NameRE.MatchString(s.Topic):
		return bad("topic %q must match %s", s.Topic, topology.NameRE)
	case !topology.NameRE.MatchString(s.Name):
		return bad("name %q must match %s", s.Name, topology.NameRE)
	case s.MaxAttempts < 1 || s.MaxAttempts > 1000:
		return bad("max_attempts must be 1-1000, got %d", s.MaxAttempts)
	case s.Backoff.InitialMS < 1 || s.Backoff.InitialMS > 86400000:
		return bad("backoff.initial_ms must be 1-86400000, got %d", s.Backoff.InitialMS)
	case s.Backoff.MaxMS < s.Backoff.InitialMS || s.Backoff.MaxMS > 7*86400000:
		return bad("backoff.max_ms must be between initial_ms and 604800000, got %d", s.Backoff.MaxMS)
	case s.Backoff.Multiplier < 1 || s.Backoff.Multiplier > 100:
		return bad("backoff.multiplier must be 1-100, got %g", s.Backoff.Multiplier)
	case s.Backoff.Jitter < 0 || s.Backoff.Jitter > 1:
		return bad("backoff.jitter must be 0-1, got %g", s.Backoff.Jitter)
	case s.DeadLetterAlarm.GrowthPercent <= 0:
		return bad("dead_letter_alarm.growth_percent must be above 0, got %g", s.DeadLetterAlarm.GrowthPercent)
	case len(s.Queue) > MaxQueueBytes:
		return bad("queue state is %d bytes, more than %d", len(s.Queue), MaxQueueBytes)
	case len(s.Queue) > 0 && !json.Valid(s.Queue):
		return bad("queue state is not JSON")
	}
	w, err := time.ParseDuration(s.DeadLetterAlarm.Window)
	if err != nil || w < time.Minute {
		return bad("dead_letter_alarm.window must be a duration of at least 1m, got %q", s.DeadLetterAlarm.Window)
	}
	return nil
}

// Policy is the subscription's retry policy for the store.
func (s Subscription) Policy() store.RetryPolicy {
	return store.RetryPolicy{
		MaxAttempts: s.MaxAttempts,
		Initial:     time.Duration(s.Backoff.InitialMS) * time.Millisecond,
		Max:         time.Duration(s.Backoff.MaxMS) * time.Millisecond,
		Multiplier:  s.Backoff.Multiplier,
		Jitter:      s.Backoff.Jitter,
	}.WithDefaults()
}

// Store keeps subscriptions where every router sees them and they survive
// restarts: MySQL tables on the static topology, Consul KV with Consul.
type Store interface {
	// List returns every subscription of every topic.
	List(ctx context.Context) ([]Subscription, error)
	// Put creates or replaces a subscription.
	Put(ctx context.Context, s Subscription) error
	// Delete removes a subscription; false when there was none.
	Delete(ctx context.Context, topic, name string) (bool, error)
}
