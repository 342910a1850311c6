package loadtest

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// keyID names one generated message key: the producer worker in the high
// bits, its sequence number in the low 40. Everything about a message —
// its key text, payload, order key, whether consumers treat it as poison —
// is derived from its keyID, so a retry or a deliberate repeat carries the
// same bytes and is deduplicated, never a conflict.
type keyID uint64

const (
	seqBits    = 40
	maxWorkers = 1 << 16
)

// foreignKey stands for a delivered key this run did not make.
const foreignKey = keyID(1<<63 - 1)

func newKeyID(worker int, seq uint64) keyID { return keyID(uint64(worker)<<seqBits | seq) }

func (k keyID) worker() int { return int(uint64(k) >> seqBits) }
func (k keyID) seq() uint64 { return uint64(k) & (1<<seqBits - 1) }

// mix is splitmix64: a cheap, well-spread hash of a key id, the source of
// every per-key random choice.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// unit maps a key id and a salt to a uniform number in [0, 1).
func (k keyID) unit(salt uint64) float64 {
	return float64(mix(uint64(k)^salt*0x2545f4914f6cdd1d)>>11) / (1 << 53)
}

// Salts for the independent per-key choices.
const (
	saltPayload = 1 + iota
	saltHot
	saltHotPick
	saltPoison
	saltRetry
	saltDrop
)

// keyspace turns key ids into the bytes sent for them. Keys are
// "<run>.<worker>.<seq>" with a zero-padded sequence, so that one worker's
// keys are inserted in index order.
type keyspace struct {
	run     string
	payload Dist
	keys    KeyDist
	pad     string
}

func newKeyspace(run string, payload Dist, keys KeyDist) *keyspace {
	return &keyspace{run: run, payload: payload, keys: keys, pad: strings.Repeat("abcdefghijklmnopqrstuvwxyz0123456789", payload.Max()/36+1)}
}

func (ks *keyspace) key(k keyID) string {
	b := make([]byte, 0, len(ks.run)+20)
	b = append(b, ks.run...)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(k.worker()), 10)
	b = append(b, '.')
	s := strconv.FormatUint(k.seq(), 10)
	for i := len(s); i < 10; i++ {
		b = append(b, '0')
	}
	return string(append(b, s...))
}

var errForeignKey = errors.New("key not made by this run")

// parse returns the key id of a key made by ks.
func (ks *keyspace) parse(key string) (keyID, error) {
	rest, ok := strings.CutPrefix(key, ks.run+".")
	if !ok {
		return 0, errForeignKey
	}
	w, s, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, errForeignKey
	}
	wn, err := strconv.ParseUint(w, 10, 16)
	if err != nil {
		return 0, errForeignKey
	}
	sn, err := strconv.ParseUint(s, 10, seqBits)
	if err != nil {
		return 0, errForeignKey
	}
	return newKeyID(int(wn), sn), nil
}

// orderKey is the message's order key: empty for the uniform share, or one
// of a few hot order keys, which pins the message to that key's vshard.
func (ks *keyspace) orderKey(k keyID) string {
	if ks.keys.HotVShards <= 0 || k.unit(saltHot) >= ks.keys.HotShare {
		return ""
	}
	return ks.run + ".hot" + strconv.Itoa(int(k.unit(saltHotPick)*float64(ks.keys.HotVShards)))
}

// payloadJSON is the message's payload, a JSON object of about the size the
// payload distribution draws for k.
func (ks *keyspace) payloadJSON(key string, k keyID) []byte {
	n := ks.payload.size(k.unit(saltPayload))
	pad := max(0, n-len(key)-len(`{"k":"","p":""}`))
	b := make([]byte, 0, len(key)+pad+16)
	b = append(b, `{"k":"`...)
	b = append(b, key...)
	b = append(b, `","p":"`...)
	b = append(b, ks.pad[:pad]...)
	return append(b, `"}`...)
}

// Dist is a payload size distribution in bytes.
type Dist struct {
	Kind string // "fixed", "uniform" or "exp"
	A, B int    // fixed: A; uniform: A..B; exp: mean A, capped at B
}

// ParseDist reads "N" or "fixed:N", "uniform:A:B", "exp:MEAN[:CAP]" (the
// cap defaults to 16×MEAN).
func ParseDist(s string) (Dist, error) {
	parts := strings.Split(s, ":")
	nums := make([]int, 0, 2)
	for _, p := range parts[1:] {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return Dist{}, fmt.Errorf("payload size %q: %q is not a byte count", s, p)
		}
		nums = append(nums, n)
	}
	switch {
	case len(parts) == 1:
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return Dist{}, fmt.Errorf("payload size %q: want N, fixed:N, uniform:A:B or exp:MEAN[:CAP]", s)
		}
		return Dist{Kind: "fixed", A: n}, nil
	case parts[0] == "fixed" && len(nums) == 1:
		return Dist{Kind: "fixed", A: nums[0]}, nil
	case parts[0] == "uniform" && len(nums) == 2 && nums[0] <= nums[1]:
		return Dist{Kind: "uniform", A: nums[0], B: nums[1]}, nil
	case parts[0] == "exp" && (len(nums) == 1 || len(nums) == 2):
		d := Dist{Kind: "exp", A: nums[0], B: 16 * nums[0]}
		if len(nums) == 2 {
			d.B = nums[1]
		}
		return d, nil
	}
	return Dist{}, fmt.Errorf("payload size %q: want N, fixed:N, uniform:A:B (A ≤ B) or exp:MEAN[:CAP]", s)
}

func (d Dist) String() string {
	switch d.Kind {
	case "uniform":
		return fmt.Sprintf("uniform:%d:%d", d.A, d.B)
	case "exp":
		return fmt.Sprintf("exp:%d:%d", d.A, d.B)
	}
	return strconv.Itoa(d.A)
}

// Max is the largest size d draws.
func (d Dist) Max() int {
	if d.Kind == "fixed" || d.Kind == "" {
		return d.A
	}
	return d.B
}

// size draws a size from u, uniform in [0, 1).
func (d Dist) size(u float64) int {
	switch d.Kind {
	case "uniform":
		return d.A + int(u*float64(d.B-d.A+1))
	case "exp":
		return min(d.B, int(-math.Log(1-u)*float64(d.A)))
	}
	return d.A
}

// KeyDist is how messages spread over vshards: uniformly (the zero value),
// or with HotShare of them on HotVShards hot vshards (through a few shared
// order keys, since a message lives on its order key's vshard).
type KeyDist struct {
	HotVShards int
	HotShare   float64
}

// ParseKeyDist reads "uniform" or "hot:N:SHARE" (N hot vshards take SHARE
// of the messages, e.g. hot:8:0.8).
func ParseKeyDist(s string) (KeyDist, error) {
	if s == "" || s == "uniform" {
		return KeyDist{}, nil
	}
	parts := strings.Split(s, ":")
	if len(parts) == 3 && parts[0] == "hot" {
		n, err1 := strconv.Atoi(parts[1])
		share, err2 := strconv.ParseFloat(parts[2], 64)
		if err1 == nil && err2 == nil && n > 0 && share >= 0 && share <= 1 {
			return KeyDist{HotVShards: n, HotShare: share}, nil
		}
	}
	return KeyDist{}, fmt.Errorf("key distribution %q: want uniform or hot:N:SHARE (N ≥ 1, 0 ≤ SHARE ≤ 1)", s)
}

func (k KeyDist) String() string {
	if k.HotVShards <= 0 {
		return "uniform"
	}
	return fmt.Sprintf("hot:%d:%g", k.HotVShards, k.HotShare)
}
