package consul_test

import (
	"os"
	"testing"

	"github.com/shardmq/shardmq/topology/topologytest"
)

// The jobs' document is replaced only by a writer that read its revision.
func TestReshardStateOnDouble(t *testing.T) {
	t.Parallel()
	topologytest.RunDoc(t, func(t *testing.T) topologytest.Doc {
		e := newDoubleEnv(t)
		return e.source(t, e.config(t)).ReshardState()
	})
}

func TestReshardStateOnAgent(t *testing.T) {
	if os.Getenv("CONSUL_HTTP_ADDR") == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: no real Consul agent to test against")
	}
	t.Parallel()
	topologytest.RunDoc(t, func(t *testing.T) topologytest.Doc {
		e := newAgentEnv(t)
		return e.source(t, e.config(t)).ReshardState()
	})
}
