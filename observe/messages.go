package observe

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// Messages counts the message flow by topic and subscription, with label
// values bounded by Labels. The broker wrapper (Broker) and the store's
// OnDeliveries hook (Delivered) feed it. Beside the metrics it keeps exact
// totals of messages created per topic and acks per subscription (Flow),
// whatever the label bound, for the operators' page's rates.
type Messages struct {
	labels       *Labels
	produced     *prometheus.CounterVec
	claimed      *prometheus.CounterVec
	acked        *prometheus.CounterVec
	nacked       *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	leaseExpired *prometheus.CounterVec
	results      *prometheus.CounterVec

	created sync.Map // topic → *atomic.Int64
	acks    sync.Map // [2]string{topic, subscription} → *atomic.Int64
}

// total returns m's counter for k, made on first use.
func total(m *sync.Map, k any) *atomic.Int64 {
	if v, ok := m.Load(k); ok {
		return v.(*atomic.Int64)
	}
	v, _ := m.LoadOrStore(k, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// Flow is what this router counted since it started: messages created on
// topic (each one a delivery for every subscription) and acks of the
// subscription. Only this router's requests: with several routers each
// counts its own.
func (m *Messages) Flow(topic, sub string) (created, acked int64) {
	if v, ok := m.created.Load(topic); ok {
		created = v.(*atomic.Int64).Load()
	}
	if v, ok := m.acks.Load([2]string{topic, sub}); ok {
		acked = v.(*atomic.Int64).Load()
	}
	return created, acked
}

// NewMessages returns the counters, registered on reg.
func NewMessages(reg prometheus.Registerer, labels *Labels) *Messages {
	pair := []string{"topic", "subscription"}
	m := &Messages{
		labels: labels,
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_produced_total",
			Help: "Messages answered by produce, by topic and status (created, duplicate, conflict, unavailable)."}, []string{"topic", "status"}),
		claimed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_claimed_total",
			Help: "Deliveries leased to consumers (not counting the dead-letter channel)."}, pair),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_acked_total",
			Help: "Deliveries acknowledged (their lease held)."}, pair),
		nacked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_nacked_total",
			Help: "Deliveries failed by their consumer (retried or dead-lettered)."}, pair),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_dead_lettered_total",
			Help: "Deliveries that became dead letters (by a nack or a lease lapsed on the last attempt)."}, pair),
		leaseExpired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_messages_lease_expired_total",
			Help: "Leases that lapsed without an ack or nack (found by the next claim): consumers that died or took too long."}, pair),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardmq_receipt_results_total",
			Help: "Per-receipt outcomes of ack, nack and extend (ok, retry_scheduled, dead, lease_lost, not_found, unavailable)."}, []string{"op", "status"}),
	}
	reg.MustRegister(m.produced, m.claimed, m.acked, m.nacked, m.deadLettered, m.leaseExpired, m.results)
	return m
}

// Produced counts n produce answers of status on topic.
func (m *Messages) Produced(topic, status string, n int) {
	if n > 0 {
		m.produced.WithLabelValues(m.labels.Topic(topic), status).Add(float64(n))
		if status == domain.ProduceCreated.String() {
			total(&m.created, topic).Add(int64(n))
		}
	}
}

func (m *Messages) add(v *prometheus.CounterVec, topic, sub string, n int) {
	if n > 0 {
		t, s := m.labels.Pair(topic, sub)
		v.WithLabelValues(t, s).Add(float64(n))
	}
}

// Claimed counts n deliveries leased on topic/sub.
func (m *Messages) Claimed(topic, sub string, n int) { m.add(m.claimed, topic, sub, n) }

// Acked counts n acknowledged deliveries.
func (m *Messages) Acked(topic, sub string, n int) {
	m.add(m.acked, topic, sub, n)
	if n > 0 {
		total(&m.acks, [2]string{topic, sub}).Add(int64(n))
	}
}

// Nacked counts n failed deliveries.
func (m *Messages) Nacked(topic, sub string, n int) { m.add(m.nacked, topic, sub, n) }

// Result counts one receipt's outcome of op (ack, nack, extend).
func (m *Messages) Result(op, status string) { m.results.WithLabelValues(op, status).Inc() }

// Delivered is the store's OnDeliveries hook: dead-lettered and lapsed
// deliveries, counted where the database decided them.
func (m *Messages) Delivered(topic, sub, event string, n int) {
	switch event {
	case store.EventDeadLettered:
		m.add(m.deadLettered, topic, sub, n)
	case store.EventLeaseExpired:
		m.add(m.leaseExpired, topic, sub, n)
	}
}

// Forget removes a deleted subscription's series and frees its place.
func (m *Messages) Forget(topic, sub string) {
	m.acks.Delete([2]string{topic, sub})
	if !m.labels.Forget(topic, sub) {
		return // counted under _other (or never): nothing of its own to remove
	}
	for _, v := range []*prometheus.CounterVec{m.claimed, m.acked, m.nacked, m.deadLettered, m.leaseExpired} {
		v.DeleteLabelValues(topic, sub)
	}
}
