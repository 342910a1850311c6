package store

// archive_message is the warm tier of message_store: the messages of months
// past the hot window, copied from every hot cluster to the archive
// cluster's own database (DESIGN §8). It holds message_store's columns
// unchanged, keyed by the router-generated id alone (ids are unique across
// clusters and months), with the indexes the lookups need: (topic, msg_key)
// for a trace by key after the dedup registry forgot the key, and
// transaction_id. It is not partitioned: the cold export removes a month
// and vshard range by id range (ids start with their creation time).
// Every cluster gets the (empty) table from the migrations; only the
// archive cluster fills it.
const createArchiveMessage = `CREATE TABLE IF NOT EXISTS archive_message (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(3) NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  topic VARBINARY(128) NOT NULL,
  msg_key VARBINARY(256) NOT NULL,
  order_key VARBINARY(256) NULL,
  transaction_id VARBINARY(256) NULL,
  priority TINYINT UNSIGNED NOT NULL,
  headers BLOB NULL,
  payload_json TINYINT(1) NOT NULL,
  payload MEDIUMBLOB NOT NULL,
  msg_status TINYINT UNSIGNED NOT NULL DEFAULT 0,
  status_at DATETIME(6) NULL,
  PRIMARY KEY (id),
  KEY idx_key (topic, msg_key),
  KEY idx_transaction (transaction_id),
  KEY idx_vshard (vshard, id)
) ENGINE=InnoDB`

// archiveMessageTier describes archive_message for the tier statements
// (archive.go): message_store's columns, spanned by id.
var archiveMessageTier = tierTable{
	name:     "archive_message",
	cols:     messageStoreMove.cols,
	kinds:    messageKinds,
	msgCol:   "id",
	required: messageColsBeforeAcks,
	defaults: messageColDefaults,
}

// messageStoreTier describes message_store as the source of the warm copy:
// spanned by its partitioning column.
var messageStoreTier = tierTable{
	name:        "message_store",
	cols:        messageStoreMove.cols,
	kinds:       messageKinds,
	msgCol:      "id",
	partitioned: true,
	required:    messageColsBeforeAcks,
	defaults:    messageColDefaults,
}

// messageColsBeforeAcks is how many columns message rows had before the
// final ack's (migration 18): cold files written before have only those.
const messageColsBeforeAcks = 13

// messageColDefaults are the values of the message columns, added since,
// that a cold file written before lacks and that are not NULL: the final
// ack's slot (migration 19), empty.
var messageColDefaults = map[string]any{"ack_slot": emptyAckSlot}

// messageKinds says how each message_store column is written to a cold
// file (see tierTable.kinds).
var messageKinds = []byte("itissssibibitssitsb")

// selectArchivedByKey reads the newest archived message with (topic, key).
const selectArchivedByKey = `SELECT ` + messageBodyCols + ` FROM archive_message WHERE topic = ? AND msg_key = ? ORDER BY id DESC LIMIT 1`
