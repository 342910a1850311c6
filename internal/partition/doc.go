// Package partition holds shardmq's partition tests (`make
// test-partitions`): real routers (cmd/router processes) and MariaDB
// servers, each on a test host of its own (internal/netbed), while the
// tests cut, slow and heal the links between them under a load of known
// keys, then check that every acknowledged key is stored exactly once and
// that no message was acked twice. The package has no code of its own;
// docs/testing.md describes the suite.
package partition
