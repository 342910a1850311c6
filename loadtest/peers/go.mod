module github.com/shardmq/shardmq/loadtest/peers

go 1.26.8

replace github.com/shardmq/shardmq => ../..

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/ThreeDotsLabs/watermill-sql/v4 v4.1.2
	github.com/go-sql-driver/mysql v1.10.1
	github.com/shardmq/shardmq v0.0.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/HdrHistogram/hdrhistogram-go v1.4.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.7.5 // indirect
	github.com/lib/pq v1.10.9 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.24.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
