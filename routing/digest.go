package routing

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Digest identifies the map's assignment (its ranges, frozen flags
// included, not its version): two maps with the same digest route every
// vshard alike. Routers publish it beside the version they apply, so that a
// map rewritten under a version already in use is caught.
func (m *Map) Digest() string {
	var b strings.Builder
	for _, r := range m.Ranges() {
		fmt.Fprintf(&b, "%d-%d:%s:%t;", r.From, r.To, r.Cluster, r.Frozen)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}
