package sqs

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
)

// How messages map (docs/sqs.md): a message's body is the payload, its
// attributes are headers (attributes.go), MessageGroupId is the order key
// (on a FIFO queue, an ordered subscription: one in flight per group), and
// the key that deduplicates is MessageDeduplicationId, or the body's
// SHA-256 on a ContentBasedDeduplication queue, with no time window; a
// standard queue's messages get a random key each, since SQS does not
// deduplicate them. MessageId is the message's id.

const maxBatch = 10

var batchIDRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,80}$`)

type sendEntry struct {
	ID                      string             `json:"Id"`
	MessageBody             string             `json:"MessageBody"`
	DelaySeconds            num                `json:"DelaySeconds"`
	MessageAttributes       map[string]msgAttr `json:"MessageAttributes"`
	MessageSystemAttributes map[string]msgAttr `json:"MessageSystemAttributes"`
	MessageDeduplicationID  string             `json:"MessageDeduplicationId"`
	MessageGroupID          string             `json:"MessageGroupId"`
}

type sendInput struct {
	QueueURL string `json:"QueueUrl"`
	sendEntry
}

type sendBatchInput struct {
	QueueURL string      `json:"QueueUrl"`
	Entries  []sendEntry `json:"Entries"`
}

type sendResult struct {
	ID                           string `json:"Id,omitempty" xml:"Id,omitempty"`
	MessageID                    string `json:"MessageId" xml:"MessageId"`
	MD5OfMessageBody             string `json:"MD5OfMessageBody" xml:"MD5OfMessageBody"`
	MD5OfMessageAttributes       string `json:"MD5OfMessageAttributes,omitempty" xml:"MD5OfMessageAttributes,omitempty"`
	MD5OfMessageSystemAttributes string `json:"MD5OfMessageSystemAttributes,omitempty" xml:"MD5OfMessageSystemAttributes,omitempty"`
	SequenceNumber               string `json:"SequenceNumber,omitempty" xml:"SequenceNumber,omitempty"`
}

type batchError struct {
	ID          string `json:"Id" xml:"Id"`
	SenderFault bool   `json:"SenderFault" xml:"SenderFault"`
	Code        string `json:"Code" xml:"Code"`
	Message     string `json:"Message,omitempty" xml:"Message,omitempty"`
}

func entryError(id string, e *apiError) batchError {
	return batchError{ID: id, SenderFault: e.statusCode() < 500, Code: e.code.query, Message: e.message}
}

type sendBatchResult struct {
	Successful []sendResult `json:"Successful" xml:"SendMessageBatchResultEntry"`
	Failed     []batchError `json:"Failed" xml:"BatchResultErrorEntry"`
}

// prepare validates one message for q and makes it a broker message with
// the answer's digests filled in.
func (h *Handler) prepare(q *queue, e sendEntry) (broker.Message, sendResult, *apiError) {
	var m broker.Message
	res := sendResult{ID: e.ID}
	if e.MessageBody == "" {
		return m, res, errf(codeMissingParameter, "the request must contain the parameter MessageBody")
	}
	if !validText(e.MessageBody) {
		return m, res, errf(codeInvalidMessage, "the message contains characters outside the allowed set")
	}
	size, ae := checkAttributes(e.MessageAttributes)
	if ae != nil {
		return m, res, ae
	}
	if max := q.seconds("MaximumMessageSize"); int64(len(e.MessageBody)+size) > max {
		return m, res, errf(codeInvalidParameterValue, "one or more parameters are invalid: the message must be shorter than %d bytes", max)
	}
	trace := ""
	for name, a := range e.MessageSystemAttributes {
		if name != "AWSTraceHeader" || a.DataType != "String" || a.StringValue == nil {
			return m, res, errf(codeInvalidParameterValue, "the only message system attribute is AWSTraceHeader, of type String")
		}
		trace = *a.StringValue
		res.MD5OfMessageSystemAttributes = md5OfAttributes(e.MessageSystemAttributes)
	}
	delay := time.Duration(q.seconds("DelaySeconds")) * time.Second
	if e.DelaySeconds.set {
		if q.fifo() {
			return m, res, errf(codeInvalidParameterValue, "the request includes a parameter that is not valid for this queue type: DelaySeconds per message (set it on the FIFO queue)")
		}
		if e.DelaySeconds.v < 0 || e.DelaySeconds.v > 900 {
			return m, res, errf(codeInvalidParameterValue, "DelaySeconds must be 0-900")
		}
		delay = time.Duration(e.DelaySeconds.v) * time.Second
	}
	m.Payload, m.Delay, m.OrderKey = []byte(e.MessageBody), delay, e.MessageGroupID
	if len(e.MessageGroupID) > 128 || len(e.MessageDeduplicationID) > 128 {
		return m, res, errf(codeInvalidParameterValue, "MessageGroupId and MessageDeduplicationId have at most 128 characters")
	}
	if q.fifo() {
		if e.MessageGroupID == "" {
			return m, res, errf(codeMissingParameter, "the request must contain the parameter MessageGroupId")
		}
		switch {
		case e.MessageDeduplicationID != "":
			m.Key = e.MessageDeduplicationID
		case q.attr("ContentBasedDeduplication") == "true":
			sum := sha256.Sum256([]byte(e.MessageBody))
			m.Key = hex.EncodeToString(sum[:])
		default:
			return m, res, errf(codeInvalidParameterValue, "the queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly")
		}
	} else {
		if e.MessageDeduplicationID != "" {
			return m, res, errf(codeInvalidParameterValue, "the request includes a parameter that is not valid for this queue type: MessageDeduplicationId")
		}
		var b [16]byte
		rand.Read(b[:])
		m.Key = "sqs-" + hex.EncodeToString(b[:])
	}
	hdr, err := encodeHeaders(e.MessageAttributes, trace)
	if err != nil {
		return m, res, errf(codeInternal, "encode attributes: %v", err)
	}
	if len(hdr) > domain.MaxHeadersBytes {
		return m, res, errf(codeInvalidParameterValue, "the message attributes take more than %d bytes stored", domain.MaxHeadersBytes)
	}
	m.Headers = hdr
	res.MD5OfMessageBody = md5Hex(e.MessageBody)
	res.MD5OfMessageAttributes = md5OfAttributes(e.MessageAttributes)
	return m, res, nil
}

// produced fills a result from the broker's answer: created, duplicate
// and conflict all succeed (a FIFO queue drops a repeated deduplication
// id whatever its body, as SQS does), and carry the stored message's id.
func (q *queue) produced(res sendResult, r broker.ProduceResult) (sendResult, *apiError) {
	switch r.Status {
	case domain.ProduceCreated, domain.ProduceDuplicate, domain.ProduceConflict:
		res.MessageID = messageID(r.ID)
		if q.fifo() {
			res.SequenceNumber = fmt.Sprintf("%020d", r.ID)
		}
		return res, nil
	case domain.ProduceRejected:
		return res, errf(codeInvalidParameterValue, "the message was refused: %v", r.Err)
	default:
		return res, errUnavailable("send the message", r.Err)
	}
}

// messageID is a message id in the 8-4-4-4-12 form of SQS's (its first
// 16 hex digits are the router's message id).
func messageID(id uint64) string {
	s := fmt.Sprintf("%016x", id)
	return s[:8] + "-" + s[8:12] + "-" + s[12:16] + "-8000-000000000000"
}

func (h *Handler) sendMessage(c *call) (any, *apiError) {
	var in sendInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, auth.Produce)
	if e != nil {
		return nil, e
	}
	in.sendEntry.ID = ""
	m, res, e := h.prepare(q, in.sendEntry)
	if e != nil {
		return nil, e
	}
	out, err := h.b.Produce(c.ctx, q.topic, []broker.Message{m}, broker.DurabilityPrimary)
	if err != nil {
		return nil, errUnavailable("send the message", err)
	}
	return q.produced(res, out[0])
}

// entry is a batch entry: it has an id.
type entry interface{ entryID() string }

func (e sendEntry) entryID() string { return e.ID }

// checkBatch validates a batch's entry ids.
func checkBatch[E entry](entries []E) *apiError {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.entryID()
	}
	switch {
	case len(ids) == 0:
		return errf(codeEmptyBatch, "there should be at least one entry in the request")
	case len(ids) > maxBatch:
		return errf(codeTooManyEntries, "maximum number of entries per request are %d, got %d", maxBatch, len(ids))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if !batchIDRE.MatchString(id) {
			return errf(codeInvalidBatchEntryID, "a batch entry id can only contain letters, digits, hyphens and underscores, up to 80: %q", id)
		}
		if seen[id] {
			return errf(codeBatchIDsNotDistinct, "id %s repeated", id)
		}
		seen[id] = true
	}
	return nil
}

func (h *Handler) sendMessageBatch(c *call) (any, *apiError) {
	var in sendBatchInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, auth.Produce)
	if e != nil {
		return nil, e
	}
	total := 0
	for _, en := range in.Entries {
		total += len(en.MessageBody)
	}
	if e := checkBatch(in.Entries); e != nil {
		return nil, e
	}
	if total > 262144 {
		return nil, errf(codeBatchTooLong, "the batch's messages take %d bytes, more than 262144", total)
	}
	out := sendBatchResult{Successful: []sendResult{}, Failed: []batchError{}}
	var msgs []broker.Message
	var pending []sendResult
	for _, en := range in.Entries {
		m, res, e := h.prepare(q, en)
		if e != nil {
			out.Failed = append(out.Failed, entryError(en.ID, e))
			continue
		}
		msgs, pending = append(msgs, m), append(pending, res)
	}
	if len(msgs) > 0 {
		results, err := h.b.Produce(c.ctx, q.topic, msgs, broker.DurabilityPrimary)
		if err != nil {
			return nil, errUnavailable("send the messages", err)
		}
		for i, r := range results {
			res, e := q.produced(pending[i], r)
			if e != nil {
				out.Failed = append(out.Failed, entryError(res.ID, e))
				continue
			}
			out.Successful = append(out.Successful, res)
		}
	}
	return out, nil
}

type receiveInput struct {
	QueueURL                    string   `json:"QueueUrl"`
	AttributeNames              []string `json:"AttributeNames"`
	MessageSystemAttributeNames []string `json:"MessageSystemAttributeNames"`
	MessageAttributeNames       []string `json:"MessageAttributeNames"`
	MaxNumberOfMessages         num      `json:"MaxNumberOfMessages"`
	VisibilityTimeout           num      `json:"VisibilityTimeout"`
	WaitTimeSeconds             num      `json:"WaitTimeSeconds"`
	ReceiveRequestAttemptID     string   `json:"ReceiveRequestAttemptId"`
}

type message struct {
	MessageID              string     `json:"MessageId" xml:"MessageId"`
	ReceiptHandle          string     `json:"ReceiptHandle" xml:"ReceiptHandle"`
	MD5OfBody              string     `json:"MD5OfBody" xml:"MD5OfBody"`
	Body                   string     `json:"Body" xml:"Body"`
	Attributes             attrMap    `json:"Attributes,omitempty" xml:"Attribute"`
	MD5OfMessageAttributes string     `json:"MD5OfMessageAttributes,omitempty" xml:"MD5OfMessageAttributes,omitempty"`
	MessageAttributes      msgAttrMap `json:"MessageAttributes,omitempty" xml:"MessageAttribute"`
}

type receiveResult struct {
	Messages []message `json:"Messages,omitempty" xml:"Message"`
}

// received is a delivery and the queue it was claimed from (the queue
// itself, or a source whose dead letter it is).
type received struct {
	broker.Delivery
	from *queue
	dead bool
}

// pollSources is how long a long-poll of a dead-letter queue waits on its
// own subscription before it looks at its sources' dead letters again.
const pollSources = 500 * time.Millisecond

func (h *Handler) receiveMessage(c *call) (any, *apiError) {
	var in receiveInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, auth.Consume)
	if e != nil {
		return nil, e
	}
	count := int64(1)
	if in.MaxNumberOfMessages.set {
		count = in.MaxNumberOfMessages.v
		if count < 1 || count > maxBatch {
			return nil, errf(codeInvalidParameterValue, "value %d for parameter MaxNumberOfMessages is invalid: must be between 1 and 10", count)
		}
	}
	lease := q.visibility()
	if in.VisibilityTimeout.set {
		if in.VisibilityTimeout.v < 0 || in.VisibilityTimeout.v > 43200 {
			return nil, errf(codeInvalidParameterValue, "VisibilityTimeout must be 0-43200")
		}
		lease = time.Duration(in.VisibilityTimeout.v) * time.Second
	}
	lease = max(lease, time.Millisecond) // 0: visible again at once
	wait := time.Duration(q.seconds("ReceiveMessageWaitTimeSeconds")) * time.Second
	if in.WaitTimeSeconds.set {
		if in.WaitTimeSeconds.v < 0 || in.WaitTimeSeconds.v > 20 {
			return nil, errf(codeInvalidParameterValue, "value %d for parameter WaitTimeSeconds is invalid: must be 0-20", in.WaitTimeSeconds.v)
		}
		wait = time.Duration(in.WaitTimeSeconds.v) * time.Second
	}
	var srcs []*queue
	for _, s := range h.sources(q) {
		if c.allow(auth.Consume, s.topic) == nil {
			srcs = append(srcs, s)
		}
	}
	got, e := h.claim(c, q, srcs, int(count), lease, wait)
	if e != nil {
		return nil, e
	}
	sys := append(append([]string(nil), in.AttributeNames...), in.MessageSystemAttributeNames...)
	out := receiveResult{}
	for _, d := range got {
		out.Messages = append(out.Messages, h.render(d, sys, in.MessageAttributeNames))
	}
	return out, nil
}

// claim leases up to max messages of q and, for a dead-letter queue, of
// its sources' dead letters, long-polling up to wait.
func (h *Handler) claim(c *call, q *queue, srcs []*queue, count int, lease, wait time.Duration) ([]received, *apiError) {
	deadline := time.Now().Add(wait)
	for first := true; ; first = false {
		ownWait := time.Until(deadline)
		if len(srcs) > 0 {
			// Look at the sources before the first wait, then between waits.
			ownWait = min(ownWait, pollSources)
			if first {
				ownWait = 0
			}
		}
		ds, err := h.b.Claim(c.ctx, broker.ClaimRequest{Topic: q.topic, Subscription: q.sub, Consumer: c.consumer(),
			Max: count, Lease: lease, Wait: max(ownWait, 0)})
		switch {
		case errors.Is(err, broker.ErrUnknownSubscription):
			return nil, errf(codeQueueDoesNotExist, "the specified queue %s does not exist", q.name)
		case err != nil && c.ctx.Err() == nil:
			return nil, errUnavailable("receive", err)
		}
		var out []received
		for _, d := range ds {
			out = append(out, received{Delivery: d, from: q})
		}
		for _, s := range srcs {
			if len(out) >= count {
				break
			}
			dead, err := h.b.Claim(c.ctx, broker.ClaimRequest{Topic: s.topic, Subscription: s.sub, Consumer: c.consumer(),
				Max: count - len(out), Lease: lease, Dead: true})
			if err != nil && !errors.Is(err, broker.ErrUnknownSubscription) && c.ctx.Err() == nil {
				h.cfg.Log.Warn("sqs: dead letters of a source queue not claimed", "queue", s.name, "err", err)
			}
			for _, d := range dead {
				out = append(out, received{Delivery: d, from: s, dead: true})
			}
		}
		if len(out) > 0 || time.Until(deadline) <= 0 || c.ctx.Err() != nil {
			return out, nil
		}
	}
}

// render is a delivery as SQS answers it, with the system attributes
// named by sys and the message attributes named by names.
func (h *Handler) render(d received, sys, names []string) message {
	m := d.Message
	body := string(m.Payload)
	attrs, trace := decodeHeaders(m.Headers)
	out := message{MessageID: messageID(m.ID), ReceiptHandle: d.Receipt, MD5OfBody: md5Hex(body), Body: body}
	if sel := selectAttributes(attrs, names); sel != nil {
		out.MessageAttributes = sel
		out.MD5OfMessageAttributes = md5OfAttributes(sel)
	}
	now := h.cfg.Now()
	first := now
	if d.Attempt > 1 {
		if t, ok := h.firstSeen.Get(m.ID); ok {
			first = t
		}
	} else {
		h.firstSeen.Add(m.ID, now)
	}
	all := map[string]string{
		"SenderId":                         h.cfg.Account,
		"SentTimestamp":                    strconv.FormatInt(m.CreatedAt.UnixMilli(), 10),
		"ApproximateReceiveCount":          strconv.Itoa(max(d.Attempt, 1)),
		"ApproximateFirstReceiveTimestamp": strconv.FormatInt(first.UnixMilli(), 10),
	}
	if m.OrderKey != "" {
		all["MessageGroupId"] = m.OrderKey
	}
	if d.from.fifo() {
		all["MessageDeduplicationId"] = m.Key
		all["SequenceNumber"] = fmt.Sprintf("%020d", m.ID)
	}
	if trace != "" {
		all["AWSTraceHeader"] = trace
	}
	if d.dead {
		all["DeadLetterQueueSourceArn"] = h.arn(d.from.name)
	}
	for _, n := range sys {
		if n == "All" {
			out.Attributes = attrMap(all)
			break
		}
		if v, ok := all[n]; ok {
			if out.Attributes == nil {
				out.Attributes = attrMap{}
			}
			out.Attributes[n] = v
		}
	}
	return out
}

// receipt decodes a receipt handle of q: one that q's subscription, or
// the dead-letter channel of one of its sources, handed out, on a topic
// the caller may consume.
func (h *Handler) receipt(c *call, q *queue, handle string) (broker.Receipt, *apiError) {
	if handle == "" {
		return broker.Receipt{}, errf(codeMissingParameter, "the request must contain the parameter ReceiptHandle")
	}
	r, err := h.b.DecodeReceipt(handle)
	if err != nil {
		return r, errf(codeReceiptHandleInvalid, "the input receipt handle %q is not a valid receipt handle", handle)
	}
	if r.Topic != q.topic || r.Subscription != q.sub {
		if !h.isSource(q, r.Topic, r.Subscription) {
			return r, errf(codeReceiptHandleInvalid, "the receipt handle is not one of queue %s", q.name)
		}
	}
	return r, c.allow(auth.Consume, r.Topic)
}

// handleEntry is one receipt handle of a delete or a visibility change
// (VisibilityTimeout only in the latter), single or batched.
type handleEntry struct {
	ID                string `json:"Id"`
	ReceiptHandle     string `json:"ReceiptHandle"`
	VisibilityTimeout num    `json:"VisibilityTimeout"`
}

func (e handleEntry) entryID() string { return e.ID }

type handleInput struct {
	QueueURL string `json:"QueueUrl"`
	handleEntry
}

type handleBatchInput struct {
	QueueURL string        `json:"QueueUrl"`
	Entries  []handleEntry `json:"Entries"`
}

type idResult struct {
	ID string `json:"Id" xml:"Id"`
}

type deleteBatchResult struct {
	Successful []idResult   `json:"Successful" xml:"DeleteMessageBatchResultEntry"`
	Failed     []batchError `json:"Failed" xml:"BatchResultErrorEntry"`
}

type changeBatchResult struct {
	Successful []idResult   `json:"Successful" xml:"ChangeMessageVisibilityBatchResultEntry"`
	Failed     []batchError `json:"Failed" xml:"BatchResultErrorEntry"`
}

// receiptOp is what a delete or a visibility change does with the
// receipts of its entries that decoded: an outcome per receipt.
type receiptOp func(c *call, q *queue, rs []broker.Receipt, es []handleEntry) []*apiError

// onReceipts serves a delete or a visibility change: it resolves the
// queue (consume), checks a batch's entries, decodes each receipt handle
// and applies op to those that decoded. It answers an outcome per entry,
// in order, nil for success; or an error for the whole call.
func (h *Handler) onReceipts(c *call, rawURL string, entries []handleEntry, batch bool, op receiptOp) ([]*apiError, *apiError) {
	q, e := h.queueFromURL(c, rawURL, auth.Consume)
	if e != nil {
		return nil, e
	}
	if batch {
		if e := checkBatch(entries); e != nil {
			return nil, e
		}
	}
	out := make([]*apiError, len(entries))
	var rs []broker.Receipt
	var es []handleEntry
	var at []int
	for i, en := range entries {
		r, e := h.receipt(c, q, en.ReceiptHandle)
		if e != nil {
			out[i] = e
			continue
		}
		rs, es, at = append(rs, r), append(es, en), append(at, i)
	}
	if len(rs) > 0 {
		for j, e := range op(c, q, rs, es) {
			out[at[j]] = e
		}
	}
	if !batch && out[0] != nil {
		return nil, out[0]
	}
	return out, nil
}

// ack deletes: one ack of every receipt. A receipt whose message was
// already deleted succeeds; one whose lease was taken over succeeds on a
// standard queue and is invalid on a FIFO one, as SQS documents for stale
// receipt handles.
func (h *Handler) ack(c *call, q *queue, rs []broker.Receipt, _ []handleEntry) []*apiError {
	out := make([]*apiError, len(rs))
	for i, r := range h.b.Ack(c.ctx, rs) {
		switch r.Status {
		case domain.LeaseOK, domain.LeaseNotFound:
		case domain.LeaseLost:
			if q.fifo() {
				out[i] = errf(codeReceiptHandleInvalid, "the receipt handle has expired")
			}
		default:
			out[i] = errUnavailable("delete the message", r.Err)
		}
	}
	return out
}

// extend changes visibility timeouts: 0 makes a message visible again at
// once (its lease ends in a millisecond, and the next receive counts as
// another, as in SQS).
func (h *Handler) extend(c *call, _ *queue, rs []broker.Receipt, es []handleEntry) []*apiError {
	out := make([]*apiError, len(rs))
	for i, r := range rs {
		n := es[i].VisibilityTimeout
		switch {
		case !n.set:
			out[i] = errf(codeMissingParameter, "the request must contain the parameter VisibilityTimeout")
			continue
		case n.v < 0 || n.v > 43200:
			out[i] = errf(codeInvalidParameterValue, "VisibilityTimeout must be 0-43200, got %d", n.v)
			continue
		}
		lease := max(time.Duration(n.v)*time.Second, time.Millisecond)
		switch res := h.b.Extend(c.ctx, []broker.Receipt{r}, lease)[0]; res.Status {
		case domain.LeaseOK:
		case domain.LeaseLost:
			out[i] = errf(codeMessageNotInflight, "the message is not in flight under this receipt handle")
		case domain.LeaseNotFound:
			out[i] = errf(codeReceiptHandleInvalid, "the message of this receipt handle was deleted")
		default:
			out[i] = errUnavailable("change the visibility", res.Err)
		}
	}
	return out
}

func (h *Handler) single(c *call, op receiptOp) (any, *apiError) {
	var in handleInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	_, e := h.onReceipts(c, in.QueueURL, []handleEntry{in.handleEntry}, false, op)
	return nil, e
}

// batch serves a batch and sorts its outcomes into ok (with the ids) and
// failed.
func (h *Handler) batch(c *call, op receiptOp) (ok []idResult, failed []batchError, e *apiError) {
	var in handleBatchInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, nil, e
	}
	errs, e := h.onReceipts(c, in.QueueURL, in.Entries, true, op)
	if e != nil {
		return nil, nil, e
	}
	ok, failed = []idResult{}, []batchError{}
	for i, en := range in.Entries {
		if errs[i] != nil {
			failed = append(failed, entryError(en.ID, errs[i]))
			continue
		}
		ok = append(ok, idResult{en.ID})
	}
	return ok, failed, nil
}

func (h *Handler) deleteMessage(c *call) (any, *apiError) { return h.single(c, h.ack) }

func (h *Handler) changeVisibility(c *call) (any, *apiError) { return h.single(c, h.extend) }

func (h *Handler) deleteMessageBatch(c *call) (any, *apiError) {
	ok, failed, e := h.batch(c, h.ack)
	if e != nil {
		return nil, e
	}
	return deleteBatchResult{ok, failed}, nil
}

func (h *Handler) changeVisibilityBatch(c *call) (any, *apiError) {
	ok, failed, e := h.batch(c, h.extend)
	if e != nil {
		return nil, e
	}
	return changeBatchResult{ok, failed}, nil
}
