package store

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/shard"
)

// crc32Keys are keys of every shape a client may send: empty, control
// bytes, combining marks, CJK, emoji, long, and not valid UTF-8.
func crc32Keys() []string {
	keys := []string{"", " ", "a", "A", "\x00", "a\x00", "\x00a", "é", "e\u0301", "日本語", "订单-42", "🙂", "order-42-paid",
		strings.Repeat("x", 256), strings.Repeat("é", 128), "\xff\xfe"}
	for i := 0; i < 1200; i++ {
		switch i % 4 {
		case 0:
			keys = append(keys, fmt.Sprintf("order-%d", i))
		case 1:
			keys = append(keys, fmt.Sprintf("用户-%d-支付", i))
		case 2:
			keys = append(keys, fmt.Sprintf("%d🙂%s", i, strings.Repeat("ß", i%7)))
		default:
			keys = append(keys, fmt.Sprintf("k%x", i*2654435761))
		}
	}
	return keys
}

// TestVShardMatchesServerCRC32 checks the promise operators rely on: the
// vshard the router computes (shard.Of) equals CRC32(key) % 1024 on the
// server, so a vshard can be computed in SQL.
func TestVShardMatchesServerCRC32(t *testing.T) {
	testbed.Need(t)
	t.Parallel()
	f := setup(t)
	keys := crc32Keys()
	const per = 200
	for start := 0; start < len(keys); start += per {
		chunk := keys[start:min(start+per, len(keys))]
		q := "SELECT " + strings.TrimSuffix(strings.Repeat("CRC32(CAST(? AS BINARY)) % 1024,", len(chunk)), ",")
		args := make([]any, len(chunk))
		dest := make([]any, len(chunk))
		got := make([]int, len(chunk))
		for i, k := range chunk {
			args[i] = []byte(k)
			dest[i] = &got[i]
		}
		if err := f.db.QueryRowContext(context.Background(), q, args...).Scan(dest...); err != nil {
			t.Fatal(err)
		}
		for i, k := range chunk {
			if int(shard.Of(k)) != got[i] {
				t.Errorf("shard.Of(%q) = %d, server says %d", k, shard.Of(k), got[i])
			}
		}
	}
	if len(keys) < 1000 {
		t.Fatalf("only %d keys checked", len(keys))
	}
}
