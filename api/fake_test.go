package api

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/subscription"
)

// recordingBroker is a Broker that stores nothing and records every call,
// so that a test can tell whether a request reached the broker and with
// what. It stands in for the broker, not for MySQL: the real-database
// properties are tested in server/.
type recordingBroker struct {
	mu    sync.Mutex
	calls []call
	// claimErr, when set, is what every claim fails with.
	claimErr error
}

type call struct {
	op   string
	args []any
}

var _ Broker = (*recordingBroker)(nil)

func (b *recordingBroker) record(op string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, call{op, args})
}

// taken returns the calls so far and forgets them.
func (b *recordingBroker) taken() []call {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.calls
	b.calls = nil
	return c
}

func (b *recordingBroker) Produce(_ context.Context, topic string, msgs []broker.Message, dur broker.Durability) ([]broker.ProduceResult, error) {
	b.record("produce", topic, msgs, dur)
	out := make([]broker.ProduceResult, len(msgs))
	for i, m := range msgs {
		out[i] = broker.ProduceResult{Key: m.Key, ID: uint64(i + 1), Status: "created"}
	}
	return out, nil
}

func (b *recordingBroker) Claim(_ context.Context, req broker.ClaimRequest) ([]broker.Delivery, error) {
	b.record("claim", req)
	return nil, b.claimErr
}

func (b *recordingBroker) Ack(_ context.Context, rs []broker.Receipt) []broker.LeaseResult {
	b.record("ack", rs)
	return make([]broker.LeaseResult, len(rs))
}

func (b *recordingBroker) Nack(_ context.Context, items []broker.NackItem) []broker.NackResult {
	b.record("nack", items)
	return make([]broker.NackResult, len(items))
}

func (b *recordingBroker) Extend(_ context.Context, rs []broker.Receipt, lease time.Duration) []broker.LeaseResult {
	b.record("extend", rs, lease)
	return make([]broker.LeaseResult, len(rs))
}

func (b *recordingBroker) ClaimCluster(_ context.Context, cluster string, req broker.ClaimRequest) ([]broker.Delivery, error) {
	b.record("claim_cluster", cluster, req)
	return nil, nil
}

func (b *recordingBroker) AckHere(_ context.Context, rs []broker.Receipt) []broker.LeaseResult {
	b.record("ack_here", rs)
	return make([]broker.LeaseResult, len(rs))
}

func (b *recordingBroker) NackHere(_ context.Context, items []broker.NackItem) []broker.NackResult {
	b.record("nack_here", items)
	return make([]broker.NackResult, len(items))
}

func (b *recordingBroker) ExtendHere(_ context.Context, rs []broker.Receipt, lease time.Duration) []broker.LeaseResult {
	b.record("extend_here", rs, lease)
	return make([]broker.LeaseResult, len(rs))
}

func (b *recordingBroker) GetSubscription(_ context.Context, topic, name string) (subscription.Subscription, error) {
	b.record("get_subscription", topic, name)
	return subscription.Subscription{Topic: topic, Name: name}, nil
}

func (b *recordingBroker) PutSubscription(_ context.Context, s subscription.Subscription) (subscription.Subscription, bool, error) {
	b.record("put_subscription", s)
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return s, false, err
	}
	return s, true, nil
}

func (b *recordingBroker) DeleteSubscription(_ context.Context, topic, name string) error {
	b.record("delete_subscription", topic, name)
	return nil
}

func (b *recordingBroker) ListDead(_ context.Context, topic, sub, errorCode, cursor string, limit int) (broker.DeadPage, error) {
	b.record("list_dead", topic, sub, errorCode, cursor, limit)
	return broker.DeadPage{}, nil
}

func (b *recordingBroker) Redrive(_ context.Context, topic, sub string, ids []uint64, errorCode string) (int64, error) {
	b.record("redrive", topic, sub, ids, errorCode)
	return 0, nil
}

func (b *recordingBroker) PurgeDead(_ context.Context, topic, sub, errorCode string) (int64, error) {
	b.record("purge_dead", topic, sub, errorCode)
	return 0, nil
}

func (b *recordingBroker) DeleteDead(_ context.Context, topic, sub string, ids []uint64) (int64, error) {
	b.record("delete_dead", topic, sub, ids)
	return 0, nil
}

func (b *recordingBroker) Consumers(_ context.Context, topic, sub string) ([]broker.Consumer, []string, error) {
	b.record("consumers", topic, sub)
	return nil, nil, nil
}

func (b *recordingBroker) DeadByCode(_ context.Context, topic, sub string, ids []uint64, errorCode string) (map[string]int64, error) {
	b.record("dead_by_code", topic, sub, ids, errorCode)
	return map[string]int64{}, nil
}

func (b *recordingBroker) ShardMap() *routing.Map { return nil }

func (b *recordingBroker) Stats(context.Context) broker.Stats { return broker.Stats{} }

func (b *recordingBroker) Trace(_ context.Context, topic, key, orderKey string) (*lookup.Trace, error) {
	b.record("trace", topic, key, orderKey)
	return nil, domain.ErrNotFound
}

func (b *recordingBroker) Transaction(_ context.Context, txID string) (*lookup.TransactionResult, error) {
	b.record("transaction", txID)
	return &lookup.TransactionResult{}, nil
}

// newTestServer is an API over a recording broker.
func newTestServer(t testing.TB) (*Server, *recordingBroker) {
	t.Helper()
	b := &recordingBroker{}
	s := New(b, Limits{}, nil, nil)
	s.RouteOps(b, nil)
	return s, b
}

// do serves one request in process and returns the recorder.
func do(s *Server, method, target string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

var _ = http.StatusOK
