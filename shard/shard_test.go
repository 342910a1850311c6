package shard_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/shard"
)

// Of is crc32_ieee(key) % 1024. The expected checksums are the published
// CRC-32 (IEEE 802.3) check values, not this implementation's output; that
// MySQL's CRC32 agrees on many more keys is checked on a real server in
// package store (TestVShardMatchesServerCRC32).
func TestOfIsCRC32IEEEModCount(t *testing.T) {
	t.Parallel()
	cases := []struct {
		key string
		crc uint32
	}{
		{"", 0x00000000},
		{"a", 0xe8b7be43},
		{"123456789", 0xcbf43926},
		{"The quick brown fox jumps over the lazy dog", 0x414fa339},
	}
	for _, c := range cases {
		if got, want := shard.Of(c.key), shard.ID(c.crc%1024); got != want {
			t.Errorf("Of(%q) = %d, want %d (crc32 %#x)", c.key, got, want, c.crc)
		}
	}
}

// Every key lands in [0, Count), both ends are reached, and keys spread
// over all vshards without a vshard holding a crowd: with 200 keys per
// vshard on average, none gets fewer than half or more than twice that.
func TestOfSpreadsOverEveryVShard(t *testing.T) {
	t.Parallel()
	const perShard = 200
	var n [shard.Count]int
	for i := 0; i < perShard*shard.Count; i++ {
		v := shard.Of(fmt.Sprintf("order-%d", i))
		if int(v) >= shard.Count {
			t.Fatalf("Of(order-%d) = %d, out of range", i, v)
		}
		n[v]++
	}
	for v, c := range n {
		if c < perShard/2 || c > perShard*2 {
			t.Errorf("vshard %d holds %d keys of %d×%d", v, c, perShard, shard.Count)
		}
	}
	if n[0] == 0 || n[shard.Count-1] == 0 {
		t.Fatalf("the boundary vshards are never reached: 0 holds %d, %d holds %d", n[0], shard.Count-1, n[shard.Count-1])
	}
}

// Keys are bytes: normalization-equivalent or case-different keys are
// different keys, and a key's vshard is stable.
func TestOfComparesBytes(t *testing.T) {
	t.Parallel()
	pairs := [][2]string{{"é", "e\u0301"}, {"a", "A"}, {"a", "a\x00"}, {"order-1", "order-1 "}}
	for _, p := range pairs {
		if shard.Of(p[0]) == shard.Of(p[1]) {
			t.Errorf("Of(%q) == Of(%q): distinct byte strings should differ here", p[0], p[1])
		}
	}
	long := strings.Repeat("ß", 1000)
	if shard.Of(long) != shard.Of(strings.Clone(long)) {
		t.Fatal("Of is not a function of the key's bytes")
	}
}

func TestKeyPrefersOrderKey(t *testing.T) {
	t.Parallel()
	cases := []struct{ orderKey, msgKey, want string }{
		{"order-1", "msg-9", "order-1"},
		{"", "msg-9", "msg-9"},
		{"", "", ""},
	}
	for _, c := range cases {
		if got := shard.Key(c.orderKey, c.msgKey); got != c.want {
			t.Errorf("Key(%q, %q) = %q, want %q", c.orderKey, c.msgKey, got, c.want)
		}
	}
	// Messages that share an order key share a vshard whatever their keys.
	if shard.Of(shard.Key("o", "k1")) != shard.Of(shard.Key("o", "k2")) {
		t.Fatal("an order key does not pin its messages to one vshard")
	}
}

func BenchmarkOf(b *testing.B) {
	for i := 0; i < b.N; i++ {
		shard.Of("order-42-paid")
	}
}
