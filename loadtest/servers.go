package loadtest

import (
	"context"
	"database/sql"
	"fmt"
)

// ServerSettingsOf reads the sizing a server runs with (the sandbox's are
// set in internal/testbed's DeploymentSettings), as every benchmark report
// prints it: what the servers really had, not what was asked.
func ServerSettingsOf(ctx context.Context, db *sql.DB) (string, error) {
	var version, format, image string
	var pool, redo, conns, flush, syncBinlog int64
	err := db.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_buffer_pool_size, @@innodb_log_file_size, @@max_connections,
  @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@binlog_format, @@binlog_row_image`).Scan(&version, &pool, &redo, &conns, &flush, &syncBinlog,
		&format, &image)
	if err != nil {
		return "", fmt.Errorf("read the server's settings: %w", err)
	}
	out := fmt.Sprintf("MariaDB %s, innodb_buffer_pool_size %s, innodb_log_file_size %s, max_connections %d, innodb_flush_log_at_trx_commit %d, sync_binlog %d, binlog_format %s, binlog_row_image %s",
		version, size(pool), size(redo), conns, flush, syncBinlog, format, image)
	// MariaDB only (MySQL 8 has no such variable).
	var annotate int64
	if err := db.QueryRowContext(ctx, "SELECT @@binlog_annotate_row_events").Scan(&annotate); err == nil {
		out += fmt.Sprintf(", binlog_annotate_row_events %d", annotate)
	}
	return out, nil
}

func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprint(n)
}
