// Package topology describes the clusters, their endpoints and the shard map
// that the router serves, and loads them from a static YAML file (the
// embedded default) with validation that names the offending line.
package topology

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/shardmq/shardmq/routing"
)

// Cluster is one MySQL replication group.
type Cluster struct {
	Name     string
	Primary  string   // DSN of the primary (go-sql-driver form)
	Replicas []string // DSNs of the replicas
}

// Topology is one consistent view of where everything is. It is immutable
// once built; a change produces a new Topology.
type Topology struct {
	Clusters map[string]Cluster
	Map      *routing.Map
	// Archive is the archive cluster (the warm tier of retention,
	// docs/retention.md), nil when there is none. It holds no vshards and
	// is not among Clusters.
	Archive *Cluster
}

// NameRE is the pattern of topic and subscription names.
var NameRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,128}$`)

// ErrInvalid marks a topology that failed validation.
var ErrInvalid = errors.New("invalid topology")

// fieldError names the file, line and field of a validation failure.
type fieldError struct {
	file  string
	line  int
	field string
	msg   string
}

func (e *fieldError) Error() string {
	loc := e.file
	if e.line > 0 {
		loc = fmt.Sprintf("%s:%d", e.file, e.line)
	}
	if e.field != "" {
		return fmt.Sprintf("%s: %s: %s", loc, e.field, e.msg)
	}
	return fmt.Sprintf("%s: %s", loc, e.msg)
}

func (e *fieldError) Unwrap() error { return ErrInvalid }

// Source is where a router learns its topology: the static file (the
// embedded default) or Consul.
type Source interface {
	// Load returns the current topology, validated.
	Load(ctx context.Context) (*Topology, error)
	// Watch calls apply with every new valid topology until ctx is done.
	// An invalid update is logged and skipped: the router keeps the last
	// good topology.
	Watch(ctx context.Context, apply func(*Topology))
}
