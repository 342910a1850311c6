package store

import "errors"

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

// ErrInvalidData: the database refused a value of the row itself (too long
// for its column, out of range, not a valid value). Sending the same item
// again fails the same way, so it is never reported as unavailable; the
// API's limits keep such values from reaching SQL in the first place.
var ErrInvalidData = errors.New("value refused by the database")

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
