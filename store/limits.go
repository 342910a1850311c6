package store

// Column capacities: the most each column of the schema holds, in bytes.
// The API's limits never exceed them (api.Limits.WithDefaults clamps to
// them), so that a value the router accepts always fits and a too-long
// value is refused before SQL instead of failing in it. TestColumnCapacities
// checks them against the tables of a migrated database.
const (
	MaxTopicBytes     = 128       // topic, subscription: VARBINARY(128)
	MaxKeyBytes       = 256       // msg_key, order_key, transaction_id: VARBINARY(256)
	MaxHeadersBytes   = 65535     // message_store.headers: BLOB
	MaxPayloadBytes   = 1<<24 - 1 // message_store.payload: MEDIUMBLOB
	MaxConsumerBytes  = 128       // message_queue.locked_by, message_trace.consumer: VARBINARY(128)
	MaxErrorCodeBytes = 64        // error_code: VARBINARY(64)
	MaxLastErrorBytes = 2048      // message_queue.last_error, message_trace.error: VARBINARY(2048)
)
