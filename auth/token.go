// Package auth is shardmq's API tokens: who may call the router and what
// each caller may do. A token is a random secret handed to one client; the
// router keeps only its SHA-256 hash, with a name, scopes on topic patterns
// and an optional request rate (docs/security.md).
//
// SHA-256 is enough here, and bcrypt would be wrong: bcrypt and its kin
// are slow on purpose so that a stolen hash of a human-chosen password
// cannot be guessed by trying likely passwords. A token made by NewToken
// has 256 random bits, so there is nothing likely to try: inverting its
// hash costs 2^255 attempts on average, slow hash or fast. A fast hash also
// keeps checking a token at about a microsecond per request, where bcrypt
// would cost tens of milliseconds of CPU per request and let anyone with a
// wrong token burn the router's CPU.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Scope is what a token may do on the topics its patterns match.
type Scope string

const (
	// Produce: POST /v1/topics/{topic}/messages.
	Produce Scope = "produce"
	// Consume: claim, ack, nack, extend, traces, subscription and
	// dead-letter reads.
	Consume Scope = "consume"
	// Admin: subscription and dead-letter changes on its topics; with the
	// pattern "*" also the operations endpoints (topology, shard map,
	// stats, reconciliation, resharding, metrics). Admin on a topic
	// includes produce and consume on it.
	Admin Scope = "admin"
)

// Scopes lists every scope.
var Scopes = []Scope{Produce, Consume, Admin}

// tokenPrefix marks shardmq tokens, so that a leaked one is recognisable
// (secret scanners, logs).
const tokenPrefix = "smq_"

// NewToken returns a fresh secret token: "smq_" and 32 random bytes in
// URL-safe base64.
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("new token: %w", err)
	}
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Hash returns the hex SHA-256 of a token, the form the token file keeps.
func Hash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Token is one configured token: its name and what it may do.
type Token struct {
	// Name identifies the client in logs, metrics and traces.
	Name    string
	hash    [32]byte
	grants  map[Scope][]string // topic patterns per scope
	rate    Rate
	limiter *rate.Limiter // nil: unlimited
}

// Rate is a token's request budget: PerSecond on average, Burst at once.
type Rate struct {
	PerSecond float64 `yaml:"per_second" json:"per_second"`
	Burst     int     `yaml:"burst" json:"burst"`
}

// Allows reports whether the token holds scope on topic. An empty topic
// means every topic (the operations endpoints, lookups across topics):
// only the pattern "*" covers it. Admin includes produce and consume.
func (t *Token) Allows(scope Scope, topic string) bool {
	if t.covers(scope, topic) {
		return true
	}
	return scope != Admin && t.covers(Admin, topic)
}

func (t *Token) covers(scope Scope, topic string) bool {
	for _, p := range t.grants[scope] {
		if p == "*" || (topic != "" && Match(p, topic)) {
			return true
		}
	}
	return false
}

// Allow takes one request from the token's rate. When over it, it says
// how long until the next request would be allowed.
func (t *Token) Allow(now time.Time) (bool, time.Duration) {
	if t.limiter == nil {
		return true, 0
	}
	r := t.limiter.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	d := r.DelayFrom(now)
	if d == 0 {
		return true, 0
	}
	r.CancelAt(now)
	return false, d
}

// RetryAfterSeconds rounds d up to whole seconds, at least 1: the unit of
// the Retry-After header.
func RetryAfterSeconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return s
}

// Match reports whether topic matches pattern, where "*" stands for any
// run of characters (also none): "orders.*" matches "orders.eu" and
// "orders.", "*" every topic, "orders" only itself.
func Match(pattern, topic string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == topic
	}
	if !strings.HasPrefix(topic, parts[0]) {
		return false
	}
	topic = topic[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(topic, p)
		if i < 0 {
			return false
		}
		topic = topic[i+len(p):]
	}
	return strings.HasSuffix(topic, last)
}

// Set is an immutable set of tokens, as one version of the token file
// defines them.
type Set struct {
	tokens []*Token
}

// ErrUnknownToken: no configured token has this secret.
var ErrUnknownToken = errors.New("unknown token")

// Lookup finds the token whose hash matches secret's. It compares with
// every configured hash in constant time and without stopping at a match,
// so the time taken says nothing about which hash, or how much of one,
// matched.
func (s *Set) Lookup(secret string) (*Token, error) {
	if s == nil || secret == "" {
		return nil, ErrUnknownToken
	}
	h := sha256.Sum256([]byte(secret))
	var found *Token
	for _, t := range s.tokens {
		if subtle.ConstantTimeCompare(h[:], t.hash[:]) == 1 {
			found = t
		}
	}
	if found == nil {
		return nil, ErrUnknownToken
	}
	return found, nil
}

// ByName finds a token by its name (nil when none has it): an SQS access
// key names the token whose scopes it carries.
func (s *Set) ByName(name string) *Token {
	if s == nil {
		return nil
	}
	for _, t := range s.tokens {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Names lists the configured tokens' names (metric labels are bounded by
// them).
func (s *Set) Names() []string {
	out := make([]string, len(s.tokens))
	for i, t := range s.tokens {
		out[i] = t.Name
	}
	return out
}

// Len is the number of tokens.
func (s *Set) Len() int { return len(s.tokens) }
