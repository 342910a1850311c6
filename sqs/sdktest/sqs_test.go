package sdktest

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestQueues covers the queue actions: create (idempotent, and refused
// with other attributes), URL, listing with a prefix and paging,
// attributes, tags, and delete.
func TestQueues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	created := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("q-one"),
		Attributes: map[string]string{"VisibilityTimeout": "45", "DelaySeconds": "0"}, Tags: map[string]string{"team": "billing"}}))(t)
	if want := e.url + "/000000000000/q-one"; aws.ToString(created.QueueUrl) != want {
		t.Fatalf("QueueUrl %s, want %s", aws.ToString(created.QueueUrl), want)
	}
	again := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("q-one"), Attributes: map[string]string{"VisibilityTimeout": "45"}}))(t)
	if aws.ToString(again.QueueUrl) != aws.ToString(created.QueueUrl) {
		t.Fatalf("create again answered %s", aws.ToString(again.QueueUrl))
	}
	_, err := c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("q-one"), Attributes: map[string]string{"VisibilityTimeout": "10"}})
	var exists *types.QueueNameExists
	if !errors.As(err, &exists) || code(err) != "QueueAlreadyExists" {
		t.Fatalf("create with another visibility timeout: %v (code %q), want QueueNameExists", err, code(err))
	}
	must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("q-two")}))(t)
	must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("other")}))(t)

	url := must(c.GetQueueUrl(x, &sqs.GetQueueUrlInput{QueueName: aws.String("q-one")}))(t)
	if aws.ToString(url.QueueUrl) != aws.ToString(created.QueueUrl) {
		t.Fatalf("GetQueueUrl %s", aws.ToString(url.QueueUrl))
	}
	page := must(c.ListQueues(x, &sqs.ListQueuesInput{QueueNamePrefix: aws.String("q-"), MaxResults: aws.Int32(1)}))(t)
	if len(page.QueueUrls) != 1 || !strings.HasSuffix(page.QueueUrls[0], "/q-one") || page.NextToken == nil {
		t.Fatalf("first page %v next %v", page.QueueUrls, page.NextToken)
	}
	page = must(c.ListQueues(x, &sqs.ListQueuesInput{QueueNamePrefix: aws.String("q-"), MaxResults: aws.Int32(1), NextToken: page.NextToken}))(t)
	if len(page.QueueUrls) != 1 || !strings.HasSuffix(page.QueueUrls[0], "/q-two") {
		t.Fatalf("second page %v", page.QueueUrls)
	}

	must(c.SetQueueAttributes(x, &sqs.SetQueueAttributesInput{QueueUrl: created.QueueUrl,
		Attributes: map[string]string{"DelaySeconds": "3", "ReceiveMessageWaitTimeSeconds": "2", "MessageRetentionPeriod": "86400"}}))(t)
	attrs := must(c.GetQueueAttributes(x, &sqs.GetQueueAttributesInput{QueueUrl: created.QueueUrl,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}}))(t).Attributes
	for k, want := range map[string]string{"VisibilityTimeout": "45", "DelaySeconds": "3", "ReceiveMessageWaitTimeSeconds": "2",
		"MessageRetentionPeriod": "86400", "ApproximateNumberOfMessages": "0", "QueueArn": "arn:aws:sqs:us-east-1:000000000000:q-one"} {
		if attrs[k] != want {
			t.Errorf("attribute %s = %q, want %q", k, attrs[k], want)
		}
	}
	if n, err := strconv.ParseInt(attrs["CreatedTimestamp"], 10, 64); err != nil || n <= 0 {
		t.Errorf("CreatedTimestamp %q", attrs["CreatedTimestamp"])
	}
	_, err = c.SetQueueAttributes(x, &sqs.SetQueueAttributesInput{QueueUrl: created.QueueUrl, Attributes: map[string]string{"VisibilityTimeout": "50000"}})
	if code(err) != "InvalidAttributeValue" {
		t.Errorf("visibility timeout out of range: %v", err)
	}

	must(c.TagQueue(x, &sqs.TagQueueInput{QueueUrl: created.QueueUrl, Tags: map[string]string{"env": "test", "tier": "1"}}))(t)
	must(c.UntagQueue(x, &sqs.UntagQueueInput{QueueUrl: created.QueueUrl, TagKeys: []string{"tier"}}))(t)
	tags := must(c.ListQueueTags(x, &sqs.ListQueueTagsInput{QueueUrl: created.QueueUrl}))(t).Tags
	if len(tags) != 2 || tags["team"] != "billing" || tags["env"] != "test" {
		t.Errorf("tags %v", tags)
	}

	must(c.DeleteQueue(x, &sqs.DeleteQueueInput{QueueUrl: created.QueueUrl}))(t)
	_, err = c.GetQueueUrl(x, &sqs.GetQueueUrlInput{QueueName: aws.String("q-one")})
	var missing *types.QueueDoesNotExist
	if !errors.As(err, &missing) || code(err) != "AWS.SimpleQueueService.NonExistentQueue" {
		t.Fatalf("deleted queue: %v (code %q), want QueueDoesNotExist", err, code(err))
	}
}

// TestMessages sends with attributes of every type (the SDK checks
// MD5OfMessageBody and MD5OfMessageAttributes), receives with the system
// attributes, deletes, purges, and refuses bad receipt handles.
func TestMessages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("msgs")}))(t).QueueUrl
	attrs := map[string]types.MessageAttributeValue{
		"s":   {DataType: aws.String("String"), StringValue: aws.String("héllo")},
		"n":   {DataType: aws.String("Number.int"), StringValue: aws.String("42")},
		"bin": {DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 2, 255}},
	}
	sent := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("body one"), MessageAttributes: attrs}))(t)
	if sum := md5.Sum([]byte("body one")); aws.ToString(sent.MD5OfMessageBody) != hex.EncodeToString(sum[:]) {
		t.Fatalf("MD5OfMessageBody %q", aws.ToString(sent.MD5OfMessageBody))
	}
	got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 5, MaxNumberOfMessages: 10,
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}}))(t)
	if len(got.Messages) != 1 {
		t.Fatalf("received %d messages, want 1", len(got.Messages))
	}
	m := got.Messages[0]
	if aws.ToString(m.MessageId) != aws.ToString(sent.MessageId) || aws.ToString(m.Body) != "body one" {
		t.Fatalf("received %s %q, sent %s", aws.ToString(m.MessageId), aws.ToString(m.Body), aws.ToString(sent.MessageId))
	}
	if v := m.MessageAttributes["bin"].BinaryValue; string(v) != "\x00\x01\x02\xff" || aws.ToString(m.MessageAttributes["n"].DataType) != "Number.int" {
		t.Fatalf("attributes came back as %+v", m.MessageAttributes)
	}
	if m.Attributes["ApproximateReceiveCount"] != "1" || m.Attributes["SentTimestamp"] == "" || m.Attributes["ApproximateFirstReceiveTimestamp"] == "" {
		t.Fatalf("system attributes %v", m.Attributes)
	}
	must(c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: m.ReceiptHandle}))(t)
	_, err := c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: aws.String("not-a-receipt")})
	var bad *types.ReceiptHandleIsInvalid
	if !errors.As(err, &bad) {
		t.Fatalf("bad receipt: %v", err)
	}
	_, err = c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("bad \x01 char")})
	var invalid *types.InvalidMessageContents
	if !errors.As(err, &invalid) {
		t.Fatalf("control character: %v", err)
	}

	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("purged")}))(t)
	must(c.PurgeQueue(x, &sqs.PurgeQueueInput{QueueUrl: q}))(t)
	if n := len(must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 1}))(t).Messages); n != 0 {
		t.Fatalf("received %d messages after a purge", n)
	}
	if _, err := c.GetQueueUrl(x, &sqs.GetQueueUrlInput{QueueName: aws.String("msgs")}); err != nil {
		t.Fatalf("the queue is gone after a purge: %v", err)
	}
}

// TestBatches: per-entry results of SendMessageBatch, DeleteMessageBatch
// and ChangeMessageVisibilityBatch, and the errors of whole batches.
func TestBatches(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("batches")}))(t).QueueUrl
	var entries []types.SendMessageBatchRequestEntry
	for i := range 9 {
		entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprintf("e%d", i)), MessageBody: aws.String(fmt.Sprintf("m%d", i)),
			MessageAttributes: map[string]types.MessageAttributeValue{"i": {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(i))}}})
	}
	entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String("bad"), MessageBody: aws.String("\x02")})
	sent := must(c.SendMessageBatch(x, &sqs.SendMessageBatchInput{QueueUrl: q, Entries: entries}))(t)
	if len(sent.Successful) != 9 || len(sent.Failed) != 1 || aws.ToString(sent.Failed[0].Id) != "bad" || !sent.Failed[0].SenderFault {
		t.Fatalf("batch: %d ok, failed %+v", len(sent.Successful), sent.Failed)
	}
	_, err := c.SendMessageBatch(x, &sqs.SendMessageBatchInput{QueueUrl: q, Entries: append(entries[:1:1], entries[0])})
	if code(err) != "AWS.SimpleQueueService.BatchEntryIdsNotDistinct" {
		t.Fatalf("repeated ids: %v", err)
	}
	eleven := append(append([]types.SendMessageBatchRequestEntry(nil), entries...), types.SendMessageBatchRequestEntry{Id: aws.String("e10"), MessageBody: aws.String("x")})
	_, err = c.SendMessageBatch(x, &sqs.SendMessageBatchInput{QueueUrl: q, Entries: eleven})
	var tooMany *types.TooManyEntriesInBatchRequest
	if !errors.As(err, &tooMany) {
		t.Fatalf("eleven entries: %v", err)
	}

	var received []types.Message
	for len(received) < 9 {
		got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, MaxNumberOfMessages: 10, WaitTimeSeconds: 5}))(t)
		if len(got.Messages) == 0 {
			t.Fatalf("received %d of 9", len(received))
		}
		received = append(received, got.Messages...)
	}
	var changes []types.ChangeMessageVisibilityBatchRequestEntry
	var deletes []types.DeleteMessageBatchRequestEntry
	for i, m := range received {
		changes = append(changes, types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(fmt.Sprintf("c%d", i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 60})
		deletes = append(deletes, types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprintf("d%d", i)), ReceiptHandle: m.ReceiptHandle})
	}
	changes = append(changes, types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String("bogus"), ReceiptHandle: aws.String("bogus"), VisibilityTimeout: 1})
	ch := must(c.ChangeMessageVisibilityBatch(x, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: q, Entries: changes}))(t)
	if len(ch.Successful) != 9 || len(ch.Failed) != 1 || aws.ToString(ch.Failed[0].Code) != "ReceiptHandleIsInvalid" {
		t.Fatalf("change batch: %d ok, failed %+v", len(ch.Successful), ch.Failed)
	}
	del := must(c.DeleteMessageBatch(x, &sqs.DeleteMessageBatchInput{QueueUrl: q, Entries: deletes}))(t)
	if len(del.Successful) != 9 || len(del.Failed) != 0 {
		t.Fatalf("delete batch: %d ok, failed %+v", len(del.Successful), del.Failed)
	}
}

// TestFIFO: two message groups sent interleaved come out each in its own
// order with one message of a group in flight at a time, and a repeated
// deduplication id (or body, with ContentBasedDeduplication) is stored
// once.
func TestFIFO(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	_, err := c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("jobs.fifo")})
	if code(err) != "InvalidParameterValue" {
		t.Fatalf("a .fifo name without FifoQueue: %v", err)
	}
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("jobs.fifo"), Attributes: map[string]string{"FifoQueue": "true"}}))(t).QueueUrl
	const per = 4
	ids := map[string]string{}
	for i := range per {
		for _, g := range []string{"ga", "gb"} {
			body := fmt.Sprintf("%s-%d", g, i)
			out := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String(body), MessageGroupId: aws.String(g), MessageDeduplicationId: aws.String(body)}))(t)
			ids[body] = aws.ToString(out.MessageId)
		}
	}
	dup := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("ga-dup"), MessageGroupId: aws.String("ga"), MessageDeduplicationId: aws.String("ga-0")}))(t)
	if dup.SequenceNumber == nil || aws.ToString(dup.MessageId) != ids["ga-0"] {
		t.Fatalf("a repeated deduplication id answered %s (sequence %v), the first send %s", aws.ToString(dup.MessageId), dup.SequenceNumber, ids["ga-0"])
	}
	_, err = c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("x"), MessageGroupId: aws.String("ga")})
	if code(err) != "InvalidParameterValue" {
		t.Fatalf("no deduplication id on a queue without content-based deduplication: %v", err)
	}
	next := map[string]int{}
	for next["ga"] < per || next["gb"] < per {
		got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, MaxNumberOfMessages: 10, WaitTimeSeconds: 5,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId}}))(t)
		if len(got.Messages) == 0 {
			t.Fatalf("nothing received; got so far %v", next)
		}
		inFlight := map[string]int{}
		for _, m := range got.Messages {
			g := m.Attributes["MessageGroupId"]
			inFlight[g]++
			if inFlight[g] > 1 {
				t.Fatalf("two messages of group %s in flight at once", g)
			}
			if want := fmt.Sprintf("%s-%d", g, next[g]); aws.ToString(m.Body) != want {
				t.Fatalf("group %s: received %q, want %q", g, aws.ToString(m.Body), want)
			}
			next[g]++
			must(c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: m.ReceiptHandle}))(t)
		}
	}
	if left := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 1}))(t).Messages; len(left) != 0 {
		t.Fatalf("the duplicate was delivered: %q", aws.ToString(left[0].Body))
	}

	cq := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("content.fifo"),
		Attributes: map[string]string{"FifoQueue": "true", "ContentBasedDeduplication": "true"}}))(t).QueueUrl
	a := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: cq, MessageBody: aws.String("same"), MessageGroupId: aws.String("g")}))(t)
	b := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: cq, MessageBody: aws.String("same"), MessageGroupId: aws.String("g")}))(t)
	if aws.ToString(a.MessageId) != aws.ToString(b.MessageId) {
		t.Fatalf("the same body got two message ids: %s, %s", aws.ToString(a.MessageId), aws.ToString(b.MessageId))
	}
}
