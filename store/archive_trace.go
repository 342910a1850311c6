package store

// archive_trace is the warm tier of message_trace: the trace events of
// months past the hot window, on the archive cluster. Same columns, keyed
// by the event id alone, found by message id.
const createArchiveTrace = `CREATE TABLE IF NOT EXISTS archive_trace (
  id BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(6) NOT NULL,
  message_id BIGINT UNSIGNED NOT NULL,
  vshard SMALLINT UNSIGNED NOT NULL,
  subscription VARBINARY(128) NULL,
  event VARCHAR(24) NOT NULL,
  consumer VARBINARY(128) NULL,
  attempt SMALLINT UNSIGNED NOT NULL DEFAULT 0,
  claimed_at DATETIME(6) NULL,
  error_code VARBINARY(64) NULL,
  error VARBINARY(2048) NULL,
  request_id VARBINARY(64) NULL,
  PRIMARY KEY (id),
  KEY idx_message (message_id),
  KEY idx_vshard (vshard, message_id),
  KEY idx_vshard_time (vshard, created_at)
) ENGINE=InnoDB`

// archiveTraceTier describes archive_trace for the tier statements. Its
// cold export spans it ByMessage (message_id), so that a cold file holds a
// message with every event of it, whenever the event happened.
var archiveTraceTier = tierTable{
	name:   "archive_trace",
	cols:   messageTraceMove.cols,
	kinds:  traceKinds,
	msgCol: "message_id",
}

// messageTraceTier describes message_trace as the source of the warm copy:
// spanned by its partitioning column (the event time).
var messageTraceTier = tierTable{
	name:        "message_trace",
	cols:        messageTraceMove.cols,
	kinds:       traceKinds,
	msgCol:      "message_id",
	partitioned: true,
}

// traceKinds says how each message_trace column is written to a cold file.
var traceKinds = []byte("itiisssitsss")

// selectArchivedEvents reads archived events of messages, in time order
// (the final acks kept on their archive_message rows are merged in by
// archivedEvents).
func selectArchivedEvents(n int) string {
	return `SELECT id, created_at, message_id, vshard, COALESCE(subscription, ''), event, COALESCE(consumer, ''), attempt, claimed_at,
  COALESCE(error_code, ''), COALESCE(error, ''), COALESCE(request_id, '') FROM archive_trace WHERE message_id IN (` + inList(n) + `) ORDER BY created_at, id`
}
