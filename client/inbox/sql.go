package inbox

// Every statement on the inbox table, in one place. Lock times come from
// the database's clock (NOW(6)). Valid on MariaDB 10.6+ and MySQL 8.

// Table is the inbox table's name in the consumer's database.
const Table = "shardmq_inbox"

const sqlCreate = `CREATE TABLE IF NOT EXISTS shardmq_inbox (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  subscription    VARCHAR(257) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'topic/subscription',
  msg_key         VARBINARY(256) NOT NULL COMMENT 'the message key: what makes two deliveries the same message',
  message_id      VARCHAR(32) NULL,
  status          ENUM('processing','processed') NOT NULL,
  locked_by       VARCHAR(128) NULL,
  claim_token     BIGINT UNSIGNED NULL,
  lock_expires_at DATETIME(6) NULL,
  attempts        INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'handler runs; observation, the router schedules retries',
  last_error      VARCHAR(2048) NULL,
  created_at      DATETIME(6) NOT NULL,
  updated_at      DATETIME(6) NOT NULL,
  processed_at    DATETIME(6) NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_inbox (subscription, msg_key),
  KEY idx_inbox_processed (status, processed_at)
) ENGINE=InnoDB`

// sqlClaimNew registers a message seen for the first time, claimed.
const sqlClaimNew = `INSERT IGNORE INTO shardmq_inbox
  (subscription, msg_key, message_id, status, locked_by, claim_token, lock_expires_at, attempts, created_at, updated_at)
VALUES (?, ?, ?, 'processing', ?, ?, NOW(6) + INTERVAL ? MICROSECOND, 1, NOW(6), NOW(6))`

// sqlClaimAgain claims a known message that is not processed and whose
// lock is free or expired.
const sqlClaimAgain = `UPDATE shardmq_inbox
SET locked_by = ?, claim_token = ?, lock_expires_at = NOW(6) + INTERVAL ? MICROSECOND,
    attempts = attempts + 1, message_id = ?, updated_at = NOW(6)
WHERE subscription = ? AND msg_key = ? AND status = 'processing'
  AND (claim_token IS NULL OR lock_expires_at < NOW(6))`

// sqlState reads why a claim failed: processed, or locked until when.
const sqlState = `SELECT status, GREATEST(TIMESTAMPDIFF(MICROSECOND, NOW(6), COALESCE(lock_expires_at, NOW(6))), 0)
FROM shardmq_inbox WHERE subscription = ? AND msg_key = ?`

// sqlProcessed runs in the business transaction: only the claim's holder
// can mark the message processed.
const sqlProcessed = `UPDATE shardmq_inbox
SET status = 'processed', processed_at = NOW(6), updated_at = NOW(6), last_error = NULL,
    locked_by = NULL, claim_token = NULL, lock_expires_at = NULL
WHERE subscription = ? AND msg_key = ? AND claim_token = ? AND status = 'processing'`

// sqlFailed records a handler's failure and frees the lock for the
// redelivery.
const sqlFailed = `UPDATE shardmq_inbox
SET last_error = ?, updated_at = NOW(6), locked_by = NULL, claim_token = NULL, lock_expires_at = NULL
WHERE subscription = ? AND msg_key = ? AND claim_token = ? AND status = 'processing'`

// sqlPurge deletes processed rows older than a number of microseconds.
// Keep them at least as long as a message can be redelivered.
const sqlPurge = `DELETE FROM shardmq_inbox
WHERE status = 'processed' AND processed_at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY id LIMIT ?`
