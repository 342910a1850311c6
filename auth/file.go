package auth

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"gopkg.in/yaml.v3"
)

// File is the token file's shape (YAML; JSON is YAML too):
//
//	tokens:
//	  - name: billing                  # [a-zA-Z0-9._-]{1,64}, unique
//	    sha256: 9f86d081884c7d65…      # auth.Hash(token), unique
//	    scopes:                        # scope → topic patterns
//	      produce: ["orders.*"]
//	      consume: ["payments"]
//	    rate: {per_second: 200, burst: 400}   # optional; default unlimited
type File struct {
	Tokens []FileToken `yaml:"tokens" json:"tokens"`
}

// FileToken is one entry of the token file.
type FileToken struct {
	Name   string             `yaml:"name" json:"name"`
	SHA256 string             `yaml:"sha256" json:"sha256"`
	Scopes map[Scope][]string `yaml:"scopes" json:"scopes"`
	Rate   *Rate              `yaml:"rate,omitempty" json:"rate,omitempty"`
}

var (
	nameRE    = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,64}$`)
	patternRE = regexp.MustCompile(`^[a-zA-Z0-9._*-]{1,128}$`)
)

// Parse reads a token file's content; errors name the file and the entry.
func Parse(path string, data []byte) (*Set, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Build(path)
}

// Build validates the entries and makes the token set.
func (f File) Build(path string) (*Set, error) {
	s := &Set{}
	names, hashes := map[string]bool{}, map[string]bool{}
	for i, ft := range f.Tokens {
		where := fmt.Sprintf("%s: tokens[%d]", path, i)
		if !nameRE.MatchString(ft.Name) {
			return nil, fmt.Errorf("%s: name %q must match %s", where, ft.Name, nameRE)
		}
		where += " (" + ft.Name + ")"
		if names[ft.Name] {
			return nil, fmt.Errorf("%s: name is used twice", where)
		}
		names[ft.Name] = true
		raw, err := hex.DecodeString(ft.SHA256)
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("%s: sha256 must be 64 hex digits (auth.Hash of the token)", where)
		}
		if hashes[ft.SHA256] {
			return nil, fmt.Errorf("%s: sha256 is used by another token", where)
		}
		hashes[ft.SHA256] = true
		t := &Token{Name: ft.Name, grants: map[Scope][]string{}}
		copy(t.hash[:], raw)
		if len(ft.Scopes) == 0 {
			return nil, fmt.Errorf("%s: scopes must grant at least one of produce, consume, admin", where)
		}
		for sc, pats := range ft.Scopes {
			if sc != Produce && sc != Consume && sc != Admin {
				return nil, fmt.Errorf("%s: unknown scope %q (produce, consume or admin)", where, sc)
			}
			if len(pats) == 0 {
				return nil, fmt.Errorf("%s: scopes.%s names no topic pattern", where, sc)
			}
			for _, p := range pats {
				if !patternRE.MatchString(p) {
					return nil, fmt.Errorf("%s: scopes.%s: pattern %q must be a topic name in which * stands for any characters", where, sc, p)
				}
			}
			t.grants[sc] = append([]string(nil), pats...)
		}
		if r := ft.Rate; r != nil {
			if !(r.PerSecond > 0) || math.IsInf(r.PerSecond, 0) || r.Burst < 0 {
				return nil, fmt.Errorf("%s: rate.per_second must be above 0 and rate.burst not below 0", where)
			}
			t.rate = *r
			if t.rate.Burst == 0 {
				t.rate.Burst = int(math.Ceil(r.PerSecond))
			}
		}
		s.tokens = append(s.tokens, t)
	}
	return s, nil
}

// withLimiters gives every rate-limited token of s a limiter, taking over
// the limiter of prev's token of the same name and rate so that a reload
// does not hand out a fresh burst.
func (s *Set) withLimiters(prev *Set) {
	old := map[string]*Token{}
	if prev != nil {
		for _, t := range prev.tokens {
			old[t.Name] = t
		}
	}
	for _, t := range s.tokens {
		if t.rate.PerSecond == 0 {
			continue
		}
		if o, ok := old[t.Name]; ok && o.rate == t.rate && o.limiter != nil {
			t.limiter = o.limiter
			continue
		}
		t.limiter = rate.NewLimiter(rate.Limit(t.rate.PerSecond), t.rate.Burst)
	}
}

// Store is the token file in use, reloaded when it changes: a valid new
// version replaces the set at once (requests in flight finish with the
// one they started with); an invalid one is logged and the last good set
// stays. The file lives on disk (Open) or in a Consul KV key (OpenConsul).
type Store struct {
	name string // the file or key, for messages
	log  *slog.Logger
	read func(ctx context.Context) ([]byte, error)
	// follow calls apply with each new version until ctx ends.
	follow func(ctx context.Context)

	set atomic.Pointer[Set]

	reload sync.Mutex // serializes apply
	loaded []byte     // the content as last read

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Open loads the token file at path; Start follows its changes, checked
// every every (1s when zero).
func Open(path string, every time.Duration, log *slog.Logger) (*Store, error) {
	if every <= 0 {
		every = time.Second
	}
	read := func(context.Context) ([]byte, error) { return os.ReadFile(path) }
	s, err := newStore(context.Background(), path, read, log)
	if err != nil {
		return nil, err
	}
	s.follow = func(ctx context.Context) {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.Reload()
		}
	}
	return s, nil
}

func newStore(ctx context.Context, name string, read func(context.Context) ([]byte, error), log *slog.Logger) (*Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	data, err := read(ctx)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	set, err := Parse(name, data)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	set.withLimiters(nil)
	s := &Store{name: name, log: log, read: read, loaded: data}
	s.set.Store(set)
	return s, nil
}

// Set is the token set in use.
func (s *Store) Set() *Set { return s.set.Load() }

// Lookup finds the token with this secret in the set in use.
func (s *Store) Lookup(secret string) (*Token, error) { return s.set.Load().Lookup(secret) }

// Start follows the file until Stop. Calling it twice is harmless.
func (s *Store) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		return
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		s.follow(ctx)
	}()
}

// Stop ends the watch and waits for it. Safe to call twice, or without
// Start.
func (s *Store) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Reload reads the file now and applies it if it changed and is valid. It
// reports whether a new set is in use.
func (s *Store) Reload() bool {
	data, err := s.read(context.Background())
	if err != nil {
		s.log.Error("token file unreadable; keeping the tokens in use", "file", s.name, "err", err)
		return false
	}
	return s.apply(data)
}

// apply makes data the set in use if it changed and is valid.
func (s *Store) apply(data []byte) bool {
	s.reload.Lock()
	defer s.reload.Unlock()
	if bytes.Equal(data, s.loaded) {
		return false
	}
	set, err := Parse(s.name, data)
	if err != nil {
		s.log.Error("token file invalid; keeping the tokens in use", "err", err)
		s.loaded = data // logged once per bad version
		return false
	}
	set.withLimiters(s.set.Load())
	s.set.Store(set)
	s.loaded = data
	s.log.Info("token file reloaded", "file", s.name, "tokens", set.Len())
	return true
}

// PutEntry adds ft to the token file at path, replacing an entry of the
// same name, and creates the file when missing. The file is replaced in
// one rename, so a router watching it never reads half of it. Comments in
// the file are not kept.
func PutEntry(path string, ft FileToken) error {
	var f File
	if err := readYAML(path, "token file", &f); err != nil {
		return err
	}
	kept := f.Tokens[:0]
	for _, t := range f.Tokens {
		if t.Name != ft.Name {
			kept = append(kept, t)
		}
	}
	f.Tokens = append(kept, ft)
	if _, err := f.Build(path); err != nil {
		return err
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	out = append([]byte("# shardmq API tokens: only SHA-256 hashes (docs/security.md)\n"), out...)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("token file: %w", err)
	}
	return nil
}
