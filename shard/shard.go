// Package shard maps shard keys to virtual shards (vshards), the unit of
// placement and of moving data between clusters.
package shard

import "hash/crc32"

// Count is the fixed number of virtual shards. It never changes: a vshard
// number is stored on every row so that a vshard can be copied with
// WHERE vshard IN (…).
const Count = 1024

// ID is a virtual shard number in [0, Count).
type ID uint16

// Of returns the vshard of a shard key: crc32_ieee(key) % 1024. It equals
// MySQL's CRC32(key) % 1024, so operators can compute it in SQL.
func Of(key string) ID {
	return ID(crc32.ChecksumIEEE([]byte(key)) % Count)
}

// Key returns the shard key of a message: its order key when it has one,
// else its message key. Messages that share an order key therefore share a
// vshard, which is what makes per-key ordering a local matter.
func Key(orderKey, msgKey string) string {
	if orderKey != "" {
		return orderKey
	}
	return msgKey
}
