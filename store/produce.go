package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/domain"
)

// ProduceStatus is the outcome of one produced item.
type ProduceStatus = domain.ProduceStatus

// The outcomes a produce's transaction decides (see domain.ProduceStatus).
const (
	Created   = domain.ProduceCreated
	Duplicate = domain.ProduceDuplicate
	Conflict  = domain.ProduceConflict
)

// ProduceItem is one message to store. The caller sets the message's id,
// creation time and vshard, the payload hash used to tell a duplicate from
// a conflict, when the deliveries become available, and the subscriptions
// to deliver to.
type ProduceItem struct {
	Msg           *Message
	Hash          []byte // 16 bytes
	AvailableAt   time.Time
	Subscriptions []string
	// WantGTID asks for the GTID of the batch's transaction (replicated
	// durability); one such item makes the batch read it.
	WantGTID bool
	// MapVersion is the shard map the item was routed with; the batch is
	// fenced (WithFence) with its items' oldest. Zero: not fenced by it.
	MapVersion int64
}

// ProduceResult is one item's outcome and the id that holds its key.
type ProduceResult struct {
	Status ProduceStatus
	ID     uint64
	// VShard of the message holding the key (duplicate, conflict): where
	// its trace lives.
	VShard uint16
	// GTID of the transaction that committed the batch, when an item asked.
	GTID string
}

// Produce stores a batch in one local transaction: it registers the keys
// (the primary key of message_key decides what is new), then inserts the
// new messages and one delivery per subscription each, with one multi-row
// statement per table. Nothing is answered before the commit. A key that
// repeats inside the batch is created once and duplicate for the rest. On
// deadlock or lock wait the whole transaction runs again with the same ids.
func (s *Store) Produce(ctx context.Context, items []ProduceItem) ([]ProduceResult, error) {
	if len(items) == 0 {
		return nil, nil
	}
	for _, it := range items {
		ctx = WithFence(ctx, Fence{MapVersion: it.MapVersion})
	}
	// Register keys in one order across batches so that concurrent batches
	// lock rows in the same order.
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		ma, mb := items[order[a]].Msg, items[order[b]].Msg
		if ma.Topic != mb.Topic {
			return ma.Topic < mb.Topic
		}
		return ma.Key < mb.Key
	})
	keys := make([]keyRow, len(items))
	for i, idx := range order {
		m := items[idx].Msg
		keys[i] = keyRow{topic: m.Topic, key: m.Key, vshard: m.VShard, messageID: m.ID, hash: items[idx].Hash, createdAt: m.CreatedAt}
	}

	wantGTID := false
	for _, it := range items {
		wantGTID = wantGTID || it.WantGTID
	}
	if !repeatsKey(keys) {
		gtid, ok, err := s.produceFast(ctx, keys, items, wantGTID)
		if err != nil {
			return nil, err
		}
		if ok {
			results := make([]ProduceResult, len(items))
			for i, it := range items {
				results[i] = ProduceResult{Status: Created, ID: it.Msg.ID, GTID: gtid}
			}
			return results, nil
		}
	}
	results := make([]ProduceResult, len(items))
	gtid, err := s.inTxGTID(ctx, txAttempts, s.retryHook("produce"), wantGTID, func(tx *sql.Tx) error {
		n, err := insertKeys(ctx, tx, keys)
		if err != nil {
			return err
		}
		var held map[[2]string]registeredKey
		var committed map[uint64]bool
		if n < int64(len(keys)) {
			if held, err = selectKeys(ctx, tx, keys); err != nil {
				return err
			}
			if committed, err = s.ownEarlierCommits(ctx, tx, items, held, n); err != nil {
				return err
			}
		}
		var created []*Message
		var rejected []Event
		at := make(map[uint64]time.Time, len(items))
		bySubs := map[string][]*Message{}
		subsOf := map[string][]string{}
		for i, it := range items {
			results[i] = ProduceResult{Status: Created, ID: it.Msg.ID}
			if held != nil {
				h, ok := held[[2]string{it.Msg.Topic, it.Msg.Key}]
				switch {
				case !ok:
					// The key was neither new nor found: only possible if a
					// purge raced us. Fail the batch; it is retried whole.
					return errKeyVanished
				case h.messageID != it.Msg.ID && bytes.Equal(h.hash, it.Hash):
					results[i] = ProduceResult{Status: Duplicate, ID: h.messageID, VShard: h.vshard}
					rejected = append(rejected, RejectedEvent(it, Duplicate, h.messageID, h.vshard))
					continue
				case h.messageID != it.Msg.ID:
					results[i] = ProduceResult{Status: Conflict, ID: h.messageID, VShard: h.vshard}
					rejected = append(rejected, RejectedEvent(it, Conflict, h.messageID, h.vshard))
					continue
				case committed[it.Msg.ID]:
					// This very batch committed before (a retry after a
					// failover found the commit): created, nothing to write.
					continue
				}
			}
			created = append(created, it.Msg)
			at[it.Msg.ID] = it.AvailableAt
			sk := subsKey(it.Subscriptions)
			bySubs[sk] = append(bySubs[sk], it.Msg)
			subsOf[sk] = it.Subscriptions
		}
		// The rejected attempts are traced on the holder's vshard in the
		// same transaction, so an answer of duplicate or conflict is never
		// given without its event. Only this path writes them: the fast
		// path is for batches whose keys are all new.
		if err := insertEventsOnce(ctx, tx, rejected); err != nil {
			return err
		}
		if len(created) == 0 {
			return nil
		}
		if err := insertMessages(ctx, tx, created); err != nil {
			return err
		}
		for sk, msgs := range bySubs {
			if len(subsOf[sk]) == 0 {
				continue
			}
			if err := insertDeliveries(ctx, tx, msgs, subsOf[sk], at); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if gtid != "" {
		for i := range results {
			results[i].GTID = gtid
		}
	}
	return results, nil
}

// repeatsKey reports a (topic, key) that occurs twice in sorted keys.
func repeatsKey(keys []keyRow) bool {
	for i := 1; i < len(keys); i++ {
		if keys[i].topic == keys[i-1].topic && keys[i].key == keys[i-1].key {
			return true
		}
	}
	return false
}

// produceFast is the common case — every key new — in one round trip
// instead of five: START TRANSACTION, the three multi-row inserts and
// COMMIT as one multi-statement. The key insert has no IGNORE, so a key
// already registered (or an id already stored) fails it with error 1062;
// the server then runs nothing after it, COMMIT included, and this rolls
// back and reports ok=false: the caller takes the general path, which
// tells duplicates from conflicts. Deadlocks and lock waits run it again,
// like inTx.
func (s *Store) produceFast(ctx context.Context, keys []keyRow, items []ProduceItem, wantGTID bool) (gtid string, ok bool, err error) {
	fence, fenced := FenceFrom(ctx)
	query, args := produceFastSQL(keys, items, fence, fenced)
	gtid, err = retry(txAttempts, s.retryHook("produce"), func() (string, error) {
		var g string
		g, ok, err = s.tryProduceFast(ctx, query, args, len(keys), wantGTID)
		return g, err
	})
	if fenced && probeFailed(err) {
		return "", false, s.fenceRefusal(ctx, fence)
	}
	return gtid, ok, err
}

// produceFastSQL is produceFast's multi-statement and its arguments,
// fenced by fence when fenced. The arguments of all its statements go
// into one slice sized for them up front.
func produceFastSQL(keys []keyRow, items []ProduceItem, fence Fence, fenced bool) (string, []any) {
	var b strings.Builder
	b.WriteString("START TRANSACTION;\n")
	n := 1 + 6*len(keys) + 11*len(items)
	for _, it := range items {
		n += 7 * len(it.Subscriptions)
	}
	args := make([]any, 0, n)
	if fenced {
		b.WriteString(fenceProbeSQL + ";\n")
		args = append(args, fence.MapVersion)
	}
	q, args := insertKeysSQL(args, keys, false)
	b.WriteString(q)
	msgs := make([]*Message, len(items))
	at := make(map[uint64]time.Time, len(items))
	bySubs := map[string][]*Message{}
	subsOf := map[string][]string{}
	for i, it := range items {
		msgs[i] = it.Msg
		at[it.Msg.ID] = it.AvailableAt
		sk := subsKey(it.Subscriptions)
		bySubs[sk] = append(bySubs[sk], it.Msg)
		subsOf[sk] = it.Subscriptions
	}
	q, args = insertMessagesSQL(args, msgs)
	b.WriteString(";\n")
	b.WriteString(q)
	for sk, ms := range bySubs {
		if len(subsOf[sk]) == 0 {
			continue
		}
		q, args = insertDeliveriesSQL(args, ms, subsOf[sk], at)
		b.WriteString(";\n")
		b.WriteString(q)
		var ok bool
		if q, args, ok = insertOrderRowsSQL(args, ms, subsOf[sk]); ok {
			b.WriteString(";\n")
			b.WriteString(q)
		}
	}
	b.WriteString(";\nCOMMIT")
	return b.String(), args
}

// fenceRefusal is the FenceError of a failed fence probe, with the fence
// read again to name it.
func (s *Store) fenceRefusal(ctx context.Context, f Fence) error {
	need, err := s.ShardFence(ctx)
	if err != nil {
		return fmt.Errorf("%w: the fast produce was refused by the fence (%w)", ErrUnavailable, err)
	}
	return &FenceError{Have: f.MapVersion, Need: need}
}

func (s *Store) tryProduceFast(ctx context.Context, query string, args []any, keys int, wantGTID bool) (string, bool, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return "", false, err
	}
	defer conn.Close()
	// Whatever happens after START TRANSACTION, the connection must not
	// go back to the pool inside a transaction.
	rollback := func() { rollbackConn(ctx, conn) }
	if err := ctx.Err(); err != nil {
		return "", false, err // nothing sent
	}
	affected, err := execMulti(ctx, conn, query, args)
	if err != nil {
		rollback()
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errDupEntry {
			// A key already registered, or an id already stored (this
			// batch committed before and its answer was lost): the
			// general path finds out which and says so.
			return "", false, nil
		}
		// The statements ran up to their COMMIT in one round trip: an
		// answer that never came may hide a commit.
		return "", false, uncertain(err)
	}
	first := 1 // START TRANSACTION, then the fence probe when there is one
	if _, ok := FenceFrom(ctx); ok {
		first = 2
	}
	if len(affected) <= first || affected[first] != int64(keys) {
		// Cannot happen after a COMMIT without error; refuse to guess.
		return "", false, fmt.Errorf("produce: message_key took %v rows of %d", affected, keys)
	}
	if !wantGTID {
		return "", true, nil
	}
	gtid, err := s.committedGTID(ctx, conn)
	return gtid, err == nil, err
}

// ownEarlierCommits finds the items whose key is held by their own id but
// was not inserted now: an earlier run of this same batch committed (the
// caller retried after losing the answer, e.g. across a failover). Only
// then is message_store read; usually the count of new keys already says
// that every own-held key is new.
func (s *Store) ownEarlierCommits(ctx context.Context, tx *sql.Tx, items []ProduceItem, held map[[2]string]registeredKey, inserted int64) (map[uint64]bool, error) {
	var own []uint64
	for _, it := range items {
		if h, ok := held[[2]string{it.Msg.Topic, it.Msg.Key}]; ok && h.messageID == it.Msg.ID {
			own = append(own, it.Msg.ID)
		}
	}
	if int64(len(own)) <= inserted {
		return nil, nil
	}
	msgs, err := selectMessages(ctx, tx, own)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool, len(msgs))
	for id := range msgs {
		out[id] = true
	}
	return out, nil
}

// RejectedEvent is the trace event of a produce attempt answered
// duplicate or conflict: on the message holding the key (holder, on
// vshard), at the attempt's time, with the attempt's own message id as the
// event id (that id is never stored otherwise), so that tracing the same
// attempt twice writes one row. A conflict's event names the payload hash
// that was refused.
func RejectedEvent(it ProduceItem, status ProduceStatus, holder uint64, vshard uint16) Event {
	e := Event{ID: it.Msg.ID, At: it.Msg.CreatedAt, MessageID: holder, VShard: vshard, Type: EventDuplicate}
	if status == Conflict {
		e.Type = EventConflict
		e.ErrorCode = "payload_differs"
		e.Error = fmt.Sprintf("key reused with another payload (hash %x); the stored message is unchanged", it.Hash)
	}
	return e
}

type storeError string

func (e storeError) Error() string { return string(e) }

const errKeyVanished = storeError("message_key row neither inserted nor found")

func subsKey(subs []string) string {
	var b bytes.Buffer
	for _, s := range subs {
		b.WriteString(s)
		b.WriteByte(0)
	}
	return b.String()
}
