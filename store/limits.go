package store

import "github.com/shardmq/shardmq/domain"

// Column capacities: the most each column of the schema holds, in bytes.
// They are domain's capacities, which the API's limits never exceed
// (api.Limits.WithDefaults clamps to them), so that a value the router
// accepts always fits and a too-long value is refused before SQL instead of
// failing in it. TestColumnCapacities checks them against the tables of a
// migrated database.
const (
	MaxTopicBytes     = domain.MaxTopicBytes     // topic, subscription: VARBINARY(128)
	MaxKeyBytes       = domain.MaxKeyBytes       // msg_key, order_key, transaction_id: VARBINARY(256)
	MaxHeadersBytes   = domain.MaxHeadersBytes   // message_store.headers: BLOB
	MaxPayloadBytes   = domain.MaxPayloadBytes   // message_store.payload: MEDIUMBLOB
	MaxConsumerBytes  = domain.MaxConsumerBytes  // message_queue.locked_by, message_trace.consumer: VARBINARY(128)
	MaxErrorCodeBytes = domain.MaxErrorCodeBytes // error_code: VARBINARY(64)
	MaxLastErrorBytes = domain.MaxLastErrorBytes // message_queue.last_error, message_trace.error: VARBINARY(2048)
)

// ErrInvalidData: the database refused a value of the row itself (see
// domain.ErrInvalidData).
var ErrInvalidData = domain.ErrInvalidData

// MySQL/MariaDB errors about a value, not about the server or the
// connection.
const (
	errBadNull          = 1048 // ER_BAD_NULL_ERROR
	errOutOfRange       = 1264 // ER_WARN_DATA_OUT_OF_RANGE
	errDataTruncated    = 1265 // WARN_DATA_TRUNCATED
	errWrongValue       = 1292 // ER_TRUNCATED_WRONG_VALUE
	errWrongValueForCol = 1366 // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD
	errDataTooLong      = 1406 // ER_DATA_TOO_LONG
)

func invalidData(number uint16) bool {
	switch number {
	case errBadNull, errOutOfRange, errDataTruncated, errWrongValue, errWrongValueForCol, errDataTooLong:
		return true
	}
	return false
}
