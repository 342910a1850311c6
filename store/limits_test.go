package store

import (
	"github.com/shardmq/shardmq/internal/testbed"
	"testing"
)

// TestColumnCapacities checks the constants of limits.go against the
// columns of a migrated database: widening or narrowing a column without
// its constant (which the API's limits follow) fails here.
func TestColumnCapacities(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	want := []struct {
		table, column string
		max           int
	}{
		{"message_store", "topic", MaxTopicBytes},
		{"message_queue", "subscription", MaxTopicBytes},
		{"message_key", "msg_key", MaxKeyBytes},
		{"message_store", "msg_key", MaxKeyBytes},
		{"message_store", "order_key", MaxKeyBytes},
		{"message_queue", "order_key", MaxKeyBytes},
		{"message_store", "transaction_id", MaxKeyBytes},
		{"message_store", "headers", MaxHeadersBytes},
		{"message_store", "payload", MaxPayloadBytes},
		{"message_queue", "locked_by", MaxConsumerBytes},
		{"message_trace", "consumer", MaxConsumerBytes},
		{"message_queue", "error_code", MaxErrorCodeBytes},
		{"message_trace", "error_code", MaxErrorCodeBytes},
		{"message_queue", "last_error", MaxLastErrorBytes},
		{"message_trace", "error", MaxLastErrorBytes},
	}
	for _, w := range want {
		var got int64
		err := f.db.QueryRow(`SELECT CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`, w.table, w.column).Scan(&got)
		if err != nil {
			t.Fatalf("%s.%s: %v", w.table, w.column, err)
		}
		if got != int64(w.max) {
			t.Errorf("%s.%s holds %d bytes, limits.go says %d", w.table, w.column, got, w.max)
		}
	}
}
