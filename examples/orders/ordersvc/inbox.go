package ordersvc

import (
	"context"
	"database/sql"

	"github.com/shardmq/shardmq/client/inbox"
)

func inboxMigrate(ctx context.Context, db *sql.DB) error { return inbox.Migrate(ctx, db) }
