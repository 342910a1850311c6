module github.com/shardmq/shardmq

go 1.26.8

require (
	github.com/go-sql-driver/mysql v1.10.1
	golang.org/x/sync v0.25.0
	gopkg.in/yaml.v3 v3.0.1
)

require filippo.io/edwards25519 v1.2.0 // indirect
