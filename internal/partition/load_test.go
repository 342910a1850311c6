package partition

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardmq/shardmq/shard"
)

// answer is what the router said about one key.
type answer struct {
	status string // created, duplicate, unavailable, …; "" when the request failed
	id     string
	at     time.Time     // when the request was sent
	took   time.Duration // until its answer came
}

// load produces known keys through a router and consumes them: every
// answer is recorded, so the checks know which keys were acknowledged.
type load struct {
	w     *world
	topic string
	url   string
	extra map[string]any // added to every produce body (durability)
	// resend: producers send acknowledged keys again now and then
	// (newLoad sets it).
	resend bool

	mu      sync.Mutex
	answers map[string][]answer // per key, in order
	acked   map[string]string   // key → id of its created/duplicate answer
	acks    map[string]int      // message id → acks answered ok
	// ackUnknown: message ids whose ack got no answer (it may have been
	// applied).
	ackUnknown map[string]bool
	claims     int
	stop       chan struct{}
	wg         sync.WaitGroup
}

func (w *world) newLoad(url, topic string, extra map[string]any) *load {
	return &load{w: w, topic: topic, url: url, extra: extra, resend: true, answers: map[string][]answer{}, acked: map[string]string{},
		acks: map[string]int{}, ackUnknown: map[string]bool{}, stop: make(chan struct{})}
}

// produce sends keys in one request and records each item's answer.
func (l *load) produce(keys []string) {
	var msgs []any
	for _, k := range keys {
		msgs = append(msgs, map[string]any{"key": k, "payload": map[string]any{"k": k}})
	}
	body := map[string]any{"messages": msgs}
	for k, v := range l.extra {
		body[k] = v
	}
	began := time.Now()
	st, out := l.w.call("POST", l.url+"/v1/topics/"+l.topic+"/messages", body)
	took := time.Since(began)
	res, _ := out["results"].([]any)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, k := range keys {
		a := answer{at: began, took: took}
		if st == 200 && i < len(res) {
			r, _ := res[i].(map[string]any)
			a.status, _ = r["status"].(string)
			a.id, _ = r["id"].(string)
		}
		l.answers[k] = append(l.answers[k], a)
		if a.status == "created" || a.status == "duplicate" {
			if prev, ok := l.acked[k]; ok && prev != a.id {
				l.w.errorf("key %s answered %s with id %s, acknowledged earlier with id %s (stored twice)", k, a.status, a.id, prev)
			} else if ok && a.status == "created" {
				l.w.errorf("key %s answered created again (acknowledged earlier with id %s)", k, prev)
			}
			l.acked[k] = a.id
		}
	}
}

// start runs producers and consumers until Stop: per cluster (c1, c2)
// producers whose keys all live there (so a cluster's trouble holds only
// its own producers), each its own key sequence in batches of batch keys
// paced by every. With resend, every fifth batch also sends again two
// keys the producer had acknowledged: they must answer duplicate with
// their id, never created.
func (l *load) start(producers, batch int, every time.Duration, consumers int) {
	for p := 0; p < 2*producers; p++ {
		c1 := p%2 == 0
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			var sent []string
			for seq, round := 0, 0; ; round++ {
				var keys []string
				for len(keys) < batch {
					k := fmt.Sprintf("%s-%d-%d", l.topic, p, seq)
					seq++
					if onC1(k) == c1 {
						keys = append(keys, k)
					}
				}
				if l.resend && round%5 == 4 {
					keys = append(keys, l.ackedAmong(sent, 2)...)
				}
				sent = append(sent, keys[:batch]...)
				l.produce(keys)
				select {
				case <-l.stop:
					return
				case <-l.w.ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	for c := 0; c < consumers; c++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				case <-l.w.ctx.Done():
					return
				default:
				}
				l.consumeOnce(fmt.Sprintf("w%d", c))
			}
		}()
	}
}

// ackedAmong picks up to n keys of sent that were acknowledged, spread
// over its length.
func (l *load) ackedAmong(sent []string, n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for i := len(sent) - 1; i >= 0 && len(out) < n; i -= 1 + len(sent)/(2*n+1) {
		if _, ok := l.acked[sent[i]]; ok {
			out = append(out, sent[i])
		}
	}
	return out
}

// claimLease is the visibility timeout the load's claims ask for.
const claimLease = 5 * time.Second

// consumeOnce claims and acks one batch, counting the acks answered ok.
// An ack answered not_found or lease_lost before claimLease had passed
// since its claim was sent is a violation: the lease was valid when the
// ack was applied (it began after the claim was sent, and the answer came
// before its end).
func (l *load) consumeOnce(consumer string) int {
	began := time.Now()
	st, out := l.w.call("POST", l.url+"/v1/topics/"+l.topic+"/subscriptions/default/claim",
		map[string]any{"max": 50, "visibility_timeout_ms": claimLease.Milliseconds(), "wait_ms": 200, "consumer": consumer})
	msgs, _ := out["messages"].([]any)
	if st != 200 || len(msgs) == 0 {
		if st != 200 {
			time.Sleep(100 * time.Millisecond)
		}
		return 0
	}
	var receipts []any
	var ids []string
	for _, m := range msgs {
		mm := m.(map[string]any)
		receipts = append(receipts, mm["receipt"])
		ids = append(ids, mm["id"].(string))
	}
	st, out = l.w.call("POST", l.url+"/v1/ack", map[string]any{"receipts": receipts})
	within := time.Since(began) < claimLease
	res, _ := out["results"].([]any)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claims += len(msgs)
	if st != 200 || len(res) != len(ids) {
		// The answer was lost (the router stopped, the request timed
		// out): the acks may still have been applied.
		for _, id := range ids {
			l.ackUnknown[id] = true
		}
	}
	n := 0
	for i, r := range res {
		rr, _ := r.(map[string]any)
		if st == 200 && rr["status"] == "unavailable" && i < len(ids) {
			// Its outcome is unknown (a flush cut short, say while the
			// router was stopped): it may have been applied.
			l.ackUnknown[ids[i]] = true
		}
		if st == 200 && rr["status"] == "ok" && i < len(ids) {
			l.acks[ids[i]]++
			n++
		}
		if st == 200 && within && (rr["status"] == "not_found" || rr["status"] == "lease_lost") && i < len(ids) {
			l.w.errorf("ack of message %s answered %s %v after its claim was sent, within its %v lease", ids[i], rr["status"], time.Since(began).Round(time.Millisecond), claimLease)
		}
	}
	return n
}

// Stop ends the producers and consumers.
func (l *load) Stop() {
	close(l.stop)
	l.wg.Wait()
}

// settle sends every key not yet acknowledged again until it is (the
// links healed), within d.
func (l *load) settle(d time.Duration) {
	l.w.t.Helper()
	deadline := time.Now().Add(d)
	for {
		l.mu.Lock()
		var missing []string
		for k := range l.answers {
			if _, ok := l.acked[k]; !ok {
				missing = append(missing, k)
			}
		}
		l.mu.Unlock()
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			l.w.fatalf("%d keys still unacknowledged %v after the links healed (e.g. %s: %+v)", len(missing), d, missing[0], l.answers[missing[0]])
		}
		sort.Strings(missing)
		for i := 0; i < len(missing); i += 50 {
			l.produce(missing[i:min(i+50, len(missing))])
		}
	}
}

// drain consumes until every stored message has been acked once, or
// 90 s pass (leases held by a crashed router come back only after their
// end, and its units after its owner lease).
func (l *load) drain() {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) && l.w.ctx.Err() == nil {
		if l.consumeOnce("drain") > 0 {
			continue
		}
		stored := l.storedIDs()
		l.mu.Lock()
		left := 0
		for _, id := range stored {
			if l.acks[id] == 0 && !l.ackUnknown[id] {
				left++
			}
		}
		l.mu.Unlock()
		if left == 0 {
			return
		}
		if !time.Now().Before(deadline.Add(-200 * time.Millisecond)) {
			l.w.explain("drain of %s gave up after 90 s: %d stored messages never acked", l.topic, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// storedIDs lists the ids of the topic's messages on both clusters.
func (l *load) storedIDs() []string {
	var out []string
	for _, db := range l.w.checks {
		rows, err := db.QueryContext(l.w.ctx, "SELECT CAST(id AS CHAR) FROM message_store WHERE topic = ?", l.topic)
		if err != nil {
			continue
		}
		for rows.Next() {
			var id string
			rows.Scan(&id)
			out = append(out, id)
		}
		rows.Close()
	}
	return out
}

// checkStored checks every acknowledged key is stored exactly once, over
// both clusters, with the id it was answered with; no key is stored
// twice; no message was acked ok twice.
func (l *load) checkStored() {
	w := l.w
	w.t.Helper()
	stored := map[string][]string{}
	for name, db := range w.checks {
		rows, err := db.QueryContext(w.ctx, "SELECT msg_key, CAST(id AS CHAR) FROM message_store WHERE topic = ?", l.topic)
		if err != nil {
			w.fatalf("read %s: %v", name, err)
		}
		for rows.Next() {
			var k, id string
			if err := rows.Scan(&k, &id); err != nil {
				w.t.Fatal(err)
			}
			stored[k] = append(stored[k], name+":"+id)
		}
		rows.Close()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for k, id := range l.acked {
		got := stored[k]
		if len(got) != 1 || !strings.HasSuffix(got[0], ":"+id) {
			bad = append(bad, fmt.Sprintf("%s (answered %s, stored %v)", k, id, got))
		}
	}
	for k, got := range stored {
		if len(got) > 1 {
			bad = append(bad, fmt.Sprintf("%s stored %d times: %v", k, len(got), got))
		}
	}
	for k, got := range stored {
		id := got[0][strings.IndexByte(got[0], ':')+1:]
		if len(got) == 1 && l.acks[id] == 0 && !l.ackUnknown[id] {
			bad = append(bad, fmt.Sprintf("%s (%s) stored but never consumed", k, got[0]))
		}
	}
	for id, n := range l.acks {
		if n > 1 {
			bad = append(bad, fmt.Sprintf("message %s acked ok %d times", id, n))
		}
	}
	if len(bad) > 0 {
		l.explainUnconsumed(stored)
		sort.Strings(bad)
		w.fatalf("%d violations, e.g. %v", len(bad), bad[:min(len(bad), 10)])
	}
	w.t.Logf("%d keys acknowledged, each stored once; %d claims, %d acks ok, none twice", len(l.acked), l.claims, len(l.acks))
}

// onCluster says whether key lives on c1 (vshards 0–511 in the world's
// map before any move).
func onC1(key string) bool { return shard.Of(key) < 512 }

// explainUnconsumed logs where the deliveries of up to five stored but
// unconsumed messages are (for a failing test's reader).
func (l *load) explainUnconsumed(stored map[string][]string) {
	n := 0
	for k, got := range stored {
		id := got[0][strings.IndexByte(got[0], ':')+1:]
		if len(got) != 1 || l.acks[id] > 0 || l.ackUnknown[id] || n >= 5 {
			continue
		}
		n++
		// Its trace, as the router answers it: who claimed and acked it.
		st, tr := l.w.call("GET", l.url+"/v1/messages/"+k+"/trace?topic="+l.topic, nil)
		msg, _ := json.Marshal(tr["message"])
		dels, _ := json.Marshal(tr["deliveries"])
		evs, _ := json.Marshal(tr["events"])
		l.w.explain("unconsumed %s (%s): trace %d, message %s, deliveries %s, events %s", k, got[0], st, msg, dels, evs)
		for name, db := range l.w.checks {
			rows, err := db.QueryContext(l.w.ctx, "SELECT vshard, attempts, IFNULL(locked_by, ''), claim_token, available_at, is_dead, parked FROM message_queue WHERE message_id = ?", id)
			if err != nil {
				continue
			}
			for rows.Next() {
				var vshard, attempts, dead, parked int
				var by string
				var token uint64
				var avail time.Time
				rows.Scan(&vshard, &attempts, &by, &token, &avail, &dead, &parked)
				l.w.explain("unconsumed %s (id %s) on %s: vshard %d attempts %d locked_by %q token %d available_at %v dead %d parked %d",
					k, id, name, vshard, attempts, by, token, avail, dead, parked)
			}
			rows.Close()
		}
	}
	if n == 0 {
		return
	}
	// Who held the topic's units, and till when, in each cluster's
	// clock.
	for name, db := range l.w.checks {
		rows, err := db.QueryContext(l.w.ctx, `SELECT o.subscription, o.owner, o.addr, o.epoch, IFNULL(CAST(d.lease_until AS CHAR), ''), IFNULL(CAST(d.horizon AS CHAR), ''), CAST(NOW(6) AS CHAR)
FROM delivery_owner o LEFT JOIN delivery_lease d ON d.topic = o.topic AND d.subscription = o.subscription WHERE o.topic = ?`, l.topic)
		if err != nil {
			l.w.explain("read %s's owners: %v", name, err)
			continue
		}
		for rows.Next() {
			var sub, owner, addr, until, horizon, now string
			var epoch uint64
			rows.Scan(&sub, &owner, &addr, &epoch, &until, &horizon, &now)
			l.w.explain("unit %s/%s on %s: owner %s (%s) epoch %d lease_until %s horizon %s (now %s)", l.topic, sub, name, owner, addr, epoch, until, horizon, now)
		}
		rows.Close()
	}
}
