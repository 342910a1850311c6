package sdktest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestRedrive: after maxReceiveCount receives a message is received from
// the dead-letter queue (DeadLetterQueueSourceArn names its source),
// ListDeadLetterSourceQueues names the source, and a move task puts it
// back on the source with its receive count reset; it cannot be
// cancelled, having completed, and AddPermission is unsupported.
func TestRedrive(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	// VisibilityTimeout 0 (the SDK omits a 0 in ReceiveMessage, so the
	// queues carry it): a received message is visible again at once.
	dlq := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("work-dlq"), Attributes: map[string]string{"VisibilityTimeout": "0"}}))(t).QueueUrl
	dlqARN := "arn:aws:sqs:us-east-1:000000000000:work-dlq"
	_, err := c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("bad-target"),
		Attributes: map[string]string{"RedrivePolicy": `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:nowhere","maxReceiveCount":2}`}})
	if code(err) != "InvalidAttributeValue" {
		t.Fatalf("a redrive policy naming no queue: %v", err)
	}
	src := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("work"),
		Attributes: map[string]string{"VisibilityTimeout": "0", "RedrivePolicy": `{"deadLetterTargetArn":"` + dlqARN + `","maxReceiveCount":"2"}`}}))(t).QueueUrl
	sent := must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: src, MessageBody: aws.String("poison")}))(t)

	for i := 1; i <= 2; i++ {
		got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: src, WaitTimeSeconds: 5,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}}))(t)
		if len(got.Messages) != 1 || got.Messages[0].Attributes["ApproximateReceiveCount"] != string(rune('0'+i)) {
			t.Fatalf("receive %d: %+v", i, got.Messages)
		}
	}
	// The third receive finds the message over its count: it moves to the
	// dead-letter queue instead of being delivered.
	if got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: src, WaitTimeSeconds: 1}))(t); len(got.Messages) != 0 {
		t.Fatalf("received a third time: %+v", got.Messages)
	}
	sources := must(c.ListDeadLetterSourceQueues(x, &sqs.ListDeadLetterSourceQueuesInput{QueueUrl: dlq}))(t)
	if len(sources.QueueUrls) != 1 || sources.QueueUrls[0] != aws.ToString(src) {
		t.Fatalf("dead-letter sources %v", sources.QueueUrls)
	}
	depth := must(c.GetQueueAttributes(x, &sqs.GetQueueAttributesInput{QueueUrl: dlq,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}}))(t)
	if depth.Attributes["ApproximateNumberOfMessages"] != "1" {
		t.Fatalf("dead-letter queue depth %v", depth.Attributes)
	}
	dead := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: dlq, WaitTimeSeconds: 5,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}}))(t)
	if len(dead.Messages) != 1 || aws.ToString(dead.Messages[0].MessageId) != aws.ToString(sent.MessageId) ||
		!strings.HasSuffix(dead.Messages[0].Attributes["DeadLetterQueueSourceArn"], ":work") {
		t.Fatalf("from the dead-letter queue: %+v", dead.Messages)
	}

	task := must(c.StartMessageMoveTask(x, &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(dlqARN)}))(t)
	if aws.ToString(task.TaskHandle) == "" {
		t.Fatal("no task handle")
	}
	tasks := must(c.ListMessageMoveTasks(x, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(dlqARN)}))(t)
	if len(tasks.Results) != 1 || aws.ToString(tasks.Results[0].Status) != "COMPLETED" || tasks.Results[0].ApproximateNumberOfMessagesMoved != 1 {
		t.Fatalf("move tasks %+v", tasks.Results)
	}
	back := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: src, WaitTimeSeconds: 5,
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}}))(t)
	if len(back.Messages) != 1 || aws.ToString(back.Messages[0].Body) != "poison" || back.Messages[0].Attributes["ApproximateReceiveCount"] != "1" {
		t.Fatalf("after the move task: %+v", back.Messages)
	}
	must(c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: src, ReceiptHandle: back.Messages[0].ReceiptHandle}))(t)
	_, err = c.StartMessageMoveTask(x, &sqs.StartMessageMoveTaskInput{SourceArn: aws.String("arn:aws:sqs:us-east-1:000000000000:work")})
	if code(err) != "InvalidParameterValue" {
		t.Fatalf("a move task from a queue that is no dead-letter queue: %v", err)
	}
	// A task ends within its start, so there is never one to cancel
	// (docs/sqs.md); permissions are the router's tokens, not SQS policies.
	_, err = c.CancelMessageMoveTask(x, &sqs.CancelMessageMoveTaskInput{TaskHandle: task.TaskHandle})
	var notFound *types.ResourceNotFoundException
	if !errors.As(err, &notFound) {
		t.Fatalf("cancelling a move task that has completed: %v", err)
	}
	_, err = c.AddPermission(x, &sqs.AddPermissionInput{QueueUrl: src, Label: aws.String("l"),
		AWSAccountIds: []string{"111122223333"}, Actions: []string{"SendMessage"}})
	// SQS's JSON protocol names the type UnsupportedOperation and, for
	// query-compatible clients, the code AWS.SimpleQueueService.…
	var unsupported *types.UnsupportedOperation
	if !errors.As(err, &unsupported) || code(err) != "AWS.SimpleQueueService.UnsupportedOperation" {
		t.Fatalf("AddPermission: %v", err)
	}
}

// TestVisibility: a message made visible again (timeout 0) is received
// again at once, counted; one whose timeout was extended is not.
func TestVisibility(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("vis")}))(t).QueueUrl
	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("m")}))(t)
	receive := func() []types.Message {
		return must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 2, VisibilityTimeout: 60,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}}))(t).Messages
	}
	got := receive()
	if len(got) != 1 {
		t.Fatalf("first receive: %d", len(got))
	}
	if again := receive(); len(again) != 0 {
		t.Fatal("received while invisible")
	}
	must(c.ChangeMessageVisibility(x, &sqs.ChangeMessageVisibilityInput{QueueUrl: q, ReceiptHandle: got[0].ReceiptHandle, VisibilityTimeout: 0}))(t)
	again := receive()
	if len(again) != 1 || again[0].Attributes["ApproximateReceiveCount"] != "2" {
		t.Fatalf("after visibility 0: %+v", again)
	}
	_, err := c.ChangeMessageVisibility(x, &sqs.ChangeMessageVisibilityInput{QueueUrl: q, ReceiptHandle: got[0].ReceiptHandle, VisibilityTimeout: 30})
	var notInFlight *types.MessageNotInflight
	if !errors.As(err, &notInFlight) {
		t.Fatalf("the first receipt handle after the message was received again: %v", err)
	}
	must(c.ChangeMessageVisibility(x, &sqs.ChangeMessageVisibilityInput{QueueUrl: q, ReceiptHandle: again[0].ReceiptHandle, VisibilityTimeout: 120}))(t)
	if more := receive(); len(more) != 0 {
		t.Fatal("received after the visibility timeout was extended")
	}
}

// TestLongPoll: a receive waiting on an empty queue answers with a
// message sent while it waits.
func TestLongPoll(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("poll")}))(t).QueueUrl
	type answer struct {
		msgs []types.Message
		err  error
	}
	started, done := make(chan struct{}), make(chan answer, 1)
	go func() {
		close(started)
		out, err := c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 20})
		if err != nil {
			done <- answer{err: err}
			return
		}
		done <- answer{msgs: out.Messages}
	}()
	<-started
	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("wake")}))(t)
	a := <-done
	if a.err != nil || len(a.msgs) != 1 || aws.ToString(a.msgs[0].Body) != "wake" {
		t.Fatalf("long poll answered %+v, %v", a.msgs, a.err)
	}
}

// TestSignature: a wrong secret and an unknown key are refused, and a
// produce-only key sends but cannot receive or delete.
func TestSignature(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("signed")}))(t).QueueUrl

	_, err := e.client(key{e.admin.id, strings.Repeat("x", 40)}).ListQueues(x, &sqs.ListQueuesInput{})
	if code(err) != "SignatureDoesNotMatch" {
		t.Fatalf("wrong secret: %v", err)
	}
	_, err = e.client(key{"SMQUNKNOWNUNKNOWN000", e.admin.secret}).ListQueues(x, &sqs.ListQueuesInput{})
	if code(err) != "InvalidClientTokenId" {
		t.Fatalf("unknown key: %v", err)
	}
	p := e.client(e.producer)
	must(p.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("from a producer")}))(t)
	_, err = p.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q})
	if code(err) != "AccessDenied" {
		t.Fatalf("a produce-only key receiving: %v", err)
	}
	_, err = p.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("not-mine")})
	if code(err) != "AccessDenied" {
		t.Fatalf("a produce-only key creating a queue: %v", err)
	}
	got := must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, WaitTimeSeconds: 5}))(t)
	if len(got.Messages) != 1 {
		t.Fatalf("admin received %d", len(got.Messages))
	}
	_, err = p.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: got.Messages[0].ReceiptHandle})
	if code(err) != "AccessDenied" {
		t.Fatalf("a produce-only key deleting: %v", err)
	}
}

// TestDelay: a message sent with DelaySeconds, or to a queue whose
// DelaySeconds is set, is not received before its delay has passed and
// is counted meanwhile as ApproximateNumberOfMessagesDelayed; a message
// sent beside it without a delay is received at once.
func TestDelay(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c, x := e.client(e.admin), ctx(t)
	q := must(c.CreateQueue(x, &sqs.CreateQueueInput{QueueName: aws.String("delayed")}))(t).QueueUrl
	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("later"), DelaySeconds: 3}))(t)
	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("now")}))(t)
	sysAttrs := []types.MessageSystemAttributeName{types.MessageSystemAttributeNameSentTimestamp, types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp}
	receive := func(wait int32) []types.Message {
		return must(c.ReceiveMessage(x, &sqs.ReceiveMessageInput{QueueUrl: q, MaxNumberOfMessages: 10, WaitTimeSeconds: wait,
			MessageSystemAttributeNames: sysAttrs}))(t).Messages
	}
	// delayedBy is the time from a message's send to its first receipt.
	delayedBy := func(m types.Message) time.Duration {
		sent, err1 := strconv.ParseInt(m.Attributes["SentTimestamp"], 10, 64)
		first, err2 := strconv.ParseInt(m.Attributes["ApproximateFirstReceiveTimestamp"], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("timestamps of %s: %v", aws.ToString(m.Body), m.Attributes)
		}
		return time.Duration(first-sent) * time.Millisecond
	}
	got := receive(0)
	if len(got) != 1 || aws.ToString(got[0].Body) != "now" {
		t.Fatalf("at once: %d messages %+v, want only the one without a delay", len(got), got)
	}
	must(c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: got[0].ReceiptHandle}))(t)
	attrs := must(c.GetQueueAttributes(x, &sqs.GetQueueAttributesInput{QueueUrl: q, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessagesDelayed, types.QueueAttributeNameApproximateNumberOfMessages}}))(t).Attributes
	if attrs["ApproximateNumberOfMessagesDelayed"] != "1" || attrs["ApproximateNumberOfMessages"] != "0" {
		t.Fatalf("while one message waits out its delay: %v", attrs)
	}
	got = receive(10)
	if len(got) != 1 || aws.ToString(got[0].Body) != "later" || delayedBy(got[0]) < 2900*time.Millisecond {
		t.Fatalf("after the delay: %+v", got)
	}
	must(c.DeleteMessage(x, &sqs.DeleteMessageInput{QueueUrl: q, ReceiptHandle: got[0].ReceiptHandle}))(t)

	// The queue's own DelaySeconds applies to a message that names none.
	must(c.SetQueueAttributes(x, &sqs.SetQueueAttributesInput{QueueUrl: q, Attributes: map[string]string{"DelaySeconds": "2"}}))(t)
	must(c.SendMessage(x, &sqs.SendMessageInput{QueueUrl: q, MessageBody: aws.String("queue-delayed")}))(t)
	if got := receive(0); len(got) != 0 {
		t.Fatalf("a message of a queue with DelaySeconds 2 received at once: %+v", got)
	}
	got = receive(10)
	if len(got) != 1 || aws.ToString(got[0].Body) != "queue-delayed" || delayedBy(got[0]) < 1900*time.Millisecond {
		t.Fatalf("after the queue's delay: %+v", got)
	}
}
