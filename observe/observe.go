// Package observe holds the router's metrics that answer the first
// questions of an incident: how many messages flow through each topic and
// subscription and how many fail (Messages, counted where the broker
// answers), how long each cluster's transactions take (Shards), how full
// each cluster's connection pool is (PoolCollector), how deep and how old
// every queue is (QueueHealth, refreshed at an interval, never per scrape),
// and the Go runtime, process, build and disk facts every operator expects
// (RegisterRuntime, DiskCollector).
//
// Nothing here registers itself globally: each part takes the registry it
// reports to, so routers can run side by side in one process. Topic and
// subscription labels are bounded (Labels): past a cap, series aggregate
// into the label value "_other", so /metrics stays a fixed size however
// many topics exist.
package observe

import "time"

// Config tunes the router's observability. Zero fields take the defaults
// named.
type Config struct {
	// MaxLabelValues caps the topics, and the topic/subscription pairs,
	// that get series of their own; the rest aggregate into "_other".
	// Defaults to 200.
	MaxLabelValues int
	// QueueEvery is how often queue depth and age are recounted (one
	// grouped pass over each cluster's live deliveries; see
	// docs/operations.md). Defaults to 15s.
	QueueEvery time.Duration
	// DiskPaths are directories whose file system's free and total bytes
	// are exported (the sandbox's or a data directory). Defaults to none.
	DiskPaths []string
}

// WithDefaults fills zero fields.
func (c Config) WithDefaults() Config {
	if c.MaxLabelValues <= 0 {
		c.MaxLabelValues = 200
	}
	if c.QueueEvery <= 0 {
		c.QueueEvery = 15 * time.Second
	}
	return c
}
