package store

import "testing"

// BenchmarkPlaceholders measures building the multi-row VALUES list of a
// 500-message batch, which every produce statement does.
func BenchmarkPlaceholders(b *testing.B) {
	for i := 0; i < b.N; i++ {
		placeholders(500, 11)
	}
}
