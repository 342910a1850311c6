package outbox

// Every statement on the outbox table, in one place. Times come from the
// database's clock (NOW(6)), so relays on hosts whose clocks disagree
// still agree on who holds a lease. Valid on MariaDB 10.6+ and MySQL 8
// (SKIP LOCKED).

// Table is the outbox table's name in the service's database.
const Table = "shardmq_outbox"

const sqlCreate = `CREATE TABLE IF NOT EXISTS shardmq_outbox (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  topic           VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  msg_key         VARBINARY(256) NOT NULL COMMENT 'the row identity, sent as the message key',
  message         MEDIUMBLOB NOT NULL COMMENT 'the message as the client sends it (JSON)',
  status          ENUM('pending','published','dead') NOT NULL DEFAULT 'pending',
  attempts        INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'failed publish attempts',
  next_attempt_at DATETIME(6) NOT NULL,
  locked_by       VARCHAR(128) NULL,
  claim_token     BIGINT UNSIGNED NULL,
  locked_until    DATETIME(6) NULL,
  last_error      VARCHAR(2048) NULL,
  message_id      VARCHAR(32) NULL COMMENT 'the id the router answered',
  created_at      DATETIME(6) NOT NULL,
  published_at    DATETIME(6) NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_outbox_key (topic, msg_key),
  KEY idx_outbox_claim (status, id),
  KEY idx_outbox_token (claim_token)
) ENGINE=InnoDB`

// sqlInsert runs inside the business transaction.
const sqlInsert = `INSERT INTO shardmq_outbox (topic, msg_key, message, status, next_attempt_at, created_at)
VALUES (?, ?, ?, 'pending', NOW(6), NOW(6))`

// sqlClaimSelect picks due rows no live lease holds, skipping rows another
// relay is claiming this instant.
const sqlClaimSelect = `SELECT id FROM shardmq_outbox
WHERE status = 'pending' AND next_attempt_at <= NOW(6) AND (locked_until IS NULL OR locked_until < NOW(6))
ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`

// sqlClaimUpdate leases them (the conditions again: the database decides).
// The id list is appended as placeholders.
const sqlClaimUpdate = `UPDATE shardmq_outbox
SET locked_by = ?, claim_token = ?, locked_until = NOW(6) + INTERVAL ? MICROSECOND
WHERE status = 'pending' AND (locked_until IS NULL OR locked_until < NOW(6)) AND id IN (`

// sqlClaimed reads the rows of one lease.
const sqlClaimed = `SELECT id, topic, msg_key, message, attempts FROM shardmq_outbox
WHERE claim_token = ? AND status = 'pending' ORDER BY id`

// sqlPublished marks a row published — only by its lease holder.
const sqlPublished = `UPDATE shardmq_outbox
SET status = 'published', published_at = NOW(6), message_id = ?, last_error = NULL,
    locked_by = NULL, claim_token = NULL, locked_until = NULL
WHERE id = ? AND claim_token = ? AND status = 'pending'`

// sqlFailed counts a failed attempt: the row becomes dead at maxAttempts,
// else due again after the backoff. status is assigned before attempts,
// so it sees the old count on MariaDB and MySQL alike.
const sqlFailed = `UPDATE shardmq_outbox
SET status = IF(attempts + 1 >= ?, 'dead', 'pending'), attempts = attempts + 1, last_error = ?,
    next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND,
    locked_by = NULL, claim_token = NULL, locked_until = NULL
WHERE id = ? AND claim_token = ? AND status = 'pending'`

// sqlDead buries a row at once (a conflict: its key is stored with
// another payload, no retry can help).
const sqlDead = `UPDATE shardmq_outbox
SET status = 'dead', attempts = attempts + 1, last_error = ?,
    locked_by = NULL, claim_token = NULL, locked_until = NULL
WHERE id = ? AND claim_token = ? AND status = 'pending'`

// sqlUnlockExpired clears leases whose holder is gone (crashed between
// claim and mark). The claim also takes expired leases; this keeps the
// table telling the truth about who holds what.
const sqlUnlockExpired = `UPDATE shardmq_outbox
SET locked_by = NULL, claim_token = NULL, locked_until = NULL
WHERE status = 'pending' AND locked_until < NOW(6)`

// sqlPurge deletes published rows older than a number of microseconds.
const sqlPurge = `DELETE FROM shardmq_outbox
WHERE status = 'published' AND published_at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY id LIMIT ?`

// sqlRedrive makes dead rows pending again with attempts reset.
const sqlRedrive = `UPDATE shardmq_outbox
SET status = 'pending', attempts = 0, next_attempt_at = NOW(6), last_error = NULL
WHERE status = 'dead'`

// sqlCounts counts rows by status.
const sqlCounts = `SELECT status, COUNT(*) FROM shardmq_outbox GROUP BY status`
