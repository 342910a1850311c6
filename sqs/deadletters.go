package sqs

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
)

// Dead-letter queues (docs/sqs.md): a queue with a RedrivePolicy is a
// subscription whose max_attempts is maxReceiveCount, so after that many
// receives its message becomes one of the subscription's dead letters. The
// dead-letter queue named by the policy receives, besides what is sent to
// it, its sources' dead letters — through the router's dead-letter claim
// channel — and deleting one acks it there. A move task (redrive) makes
// the sources' dead letters ready again on their sources, with their
// receive count reset: the router's own redrive.

// sources are the queues whose RedrivePolicy names q, by name.
func (h *Handler) sources(q *queue) []*queue {
	arn := h.arn(q.name)
	var out []*queue
	for _, s := range h.subs.List("") {
		if len(s.Queue) == 0 || !strings.Contains(string(s.Queue), "RedrivePolicy") {
			continue
		}
		src := fromSubscription(s)
		if p := src.redrive(); p != nil && sameQueueARN(p.DeadLetterTargetArn, arn) {
			out = append(out, src)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// sameQueueARN compares queue ARNs by queue name: a router has one
// namespace of queues, whatever region or account an ARN names.
func sameQueueARN(a, b string) bool {
	x, ok1 := nameFromARN(a)
	y, ok2 := nameFromARN(b)
	return ok1 && ok2 && x == y
}

// isSource reports whether topic/sub is a source of q.
func (h *Handler) isSource(q *queue, topic, sub string) bool {
	for _, s := range h.sources(q) {
		if s.topic == topic && s.sub == sub {
			return true
		}
	}
	return false
}

type listSourcesInput struct {
	QueueURL   string `json:"QueueUrl"`
	NextToken  string `json:"NextToken"`
	MaxResults num    `json:"MaxResults"`
}

type listSourcesResult struct {
	QueueUrls []string `json:"queueUrls" xml:"QueueUrl"`
	NextToken string   `json:"NextToken,omitempty" xml:"NextToken,omitempty"`
}

func (h *Handler) listDeadLetterSources(c *call) (any, *apiError) {
	var in listSourcesInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, "")
	if e != nil {
		return nil, e
	}
	limit, after, e := paging(in.MaxResults, in.NextToken)
	if e != nil {
		return nil, e
	}
	out := listSourcesResult{QueueUrls: []string{}}
	for _, s := range h.sources(q) {
		if s.name <= after {
			continue
		}
		if len(out.QueueUrls) == limit {
			out.NextToken = nextToken(out.QueueUrls[limit-1][len(c.base):])
			break
		}
		out.QueueUrls = append(out.QueueUrls, c.base+s.name)
	}
	return out, nil
}

// moveTask is one redrive of a dead-letter queue, kept (the latest
// maxMoveTasks) in the dead-letter queue's state so that every router
// lists it. A task runs to its end within StartMessageMoveTask.
type moveTask struct {
	Handle    string `json:"handle"`
	Status    string `json:"status"` // COMPLETED or FAILED
	Source    string `json:"source"`
	Dest      string `json:"dest,omitempty"`
	Moved     int64  `json:"moved"`
	ToMove    int64  `json:"to_move"`
	Failure   string `json:"failure,omitempty"`
	StartedMS int64  `json:"started_ms"`
}

const maxMoveTasks = 10

type startMoveInput struct {
	SourceArn                    string `json:"SourceArn"`
	DestinationArn               string `json:"DestinationArn"`
	MaxNumberOfMessagesPerSecond num    `json:"MaxNumberOfMessagesPerSecond"`
}

type startMoveResult struct {
	TaskHandle string `json:"TaskHandle" xml:"TaskHandle"`
}

// startMoveTask redrives the dead letters of the dead-letter queue
// SourceArn back to their source queues (all of them, or only the one
// DestinationArn names).
func (h *Handler) startMoveTask(c *call) (any, *apiError) {
	var in startMoveInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	name, ok := nameFromARN(in.SourceArn)
	if !ok {
		return nil, errf(codeInvalidParameterValue, "SourceArn %q is not an SQS queue ARN", in.SourceArn)
	}
	dlq, e := h.lookup(c, name)
	if e != nil {
		return nil, errf(codeResourceNotFound, "the source queue %s does not exist", name)
	}
	srcs := h.sources(dlq)
	if len(srcs) == 0 {
		return nil, errf(codeInvalidParameterValue, "the source queue %s is not the dead-letter queue of any queue", name)
	}
	if in.DestinationArn != "" {
		var only []*queue
		for _, s := range srcs {
			if sameQueueARN(in.DestinationArn, h.arn(s.name)) {
				only = append(only, s)
			}
		}
		if len(only) == 0 {
			return nil, errf(codeUnsupported, "messages move back to their source queues only: DestinationArn must be one of them or absent")
		}
		srcs = only
	}
	for _, s := range srcs {
		if e := c.allow(auth.Admin, s.topic); e != nil {
			return nil, e
		}
	}
	var b [12]byte
	rand.Read(b[:])
	task := moveTask{Handle: base64.RawURLEncoding.EncodeToString(b[:]), Status: "COMPLETED", Source: h.arn(dlq.name),
		Dest: in.DestinationArn, StartedMS: h.cfg.Now().UnixMilli()}
	var errs []error
	for _, s := range srcs {
		n, err := h.b.Redrive(c.ctx, s.topic, s.sub, nil, "")
		task.Moved += n
		if err != nil && !errors.Is(err, broker.ErrUnknownSubscription) {
			errs = append(errs, err)
		}
	}
	task.ToMove = task.Moved
	if len(errs) > 0 {
		task.Status, task.Failure = "FAILED", "a cluster did not answer; start the task again: "+errors.Join(errs...).Error()
	}
	dlq.st.MoveTasks = append([]moveTask{task}, dlq.st.MoveTasks...)
	if len(dlq.st.MoveTasks) > maxMoveTasks {
		dlq.st.MoveTasks = dlq.st.MoveTasks[:maxMoveTasks]
	}
	if _, e := h.save(c, dlq); e != nil {
		return nil, e
	}
	return startMoveResult{TaskHandle: taskHandle(task.Handle, dlq.name)}, nil
}

// taskHandle names a task and its queue, so that a cancel finds it.
func taskHandle(id, queue string) string {
	b, _ := json.Marshal([2]string{id, queue})
	return base64.RawURLEncoding.EncodeToString(b)
}

type listMovesInput struct {
	SourceArn  string `json:"SourceArn"`
	MaxResults num    `json:"MaxResults"`
}

type moveTaskEntry struct {
	TaskHandle                        string `json:"TaskHandle,omitempty" xml:"TaskHandle,omitempty"`
	Status                            string `json:"Status" xml:"Status"`
	SourceArn                         string `json:"SourceArn" xml:"SourceArn"`
	DestinationArn                    string `json:"DestinationArn,omitempty" xml:"DestinationArn,omitempty"`
	ApproximateNumberOfMessagesMoved  int64  `json:"ApproximateNumberOfMessagesMoved" xml:"ApproximateNumberOfMessagesMoved"`
	ApproximateNumberOfMessagesToMove int64  `json:"ApproximateNumberOfMessagesToMove" xml:"ApproximateNumberOfMessagesToMove"`
	FailureReason                     string `json:"FailureReason,omitempty" xml:"FailureReason,omitempty"`
	StartedTimestamp                  int64  `json:"StartedTimestamp" xml:"StartedTimestamp"`
}

type listMovesResult struct {
	Results []moveTaskEntry `json:"Results" xml:"ListMessageMoveTasksResultEntry"`
}

func (h *Handler) listMoveTasks(c *call) (any, *apiError) {
	var in listMovesInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	name, ok := nameFromARN(in.SourceArn)
	if !ok {
		return nil, errf(codeInvalidParameterValue, "SourceArn %q is not an SQS queue ARN", in.SourceArn)
	}
	limit := 1
	if in.MaxResults.set {
		if in.MaxResults.v < 1 || in.MaxResults.v > maxMoveTasks {
			return nil, errf(codeInvalidParameterValue, "MaxResults must be 1-10")
		}
		limit = int(in.MaxResults.v)
	}
	dlq, e := h.lookup(c, name)
	if e != nil {
		return nil, errf(codeResourceNotFound, "the source queue %s does not exist", name)
	}
	if e := c.allowAny(dlq.topic); e != nil {
		return nil, e
	}
	out := listMovesResult{Results: []moveTaskEntry{}}
	for _, t := range dlq.st.MoveTasks {
		if len(out.Results) == limit {
			break
		}
		out.Results = append(out.Results, moveTaskEntry{Status: t.Status, SourceArn: t.Source, DestinationArn: t.Dest,
			ApproximateNumberOfMessagesMoved: t.Moved, ApproximateNumberOfMessagesToMove: t.ToMove,
			FailureReason: t.Failure, StartedTimestamp: t.StartedMS})
	}
	return out, nil
}

type cancelMoveInput struct {
	TaskHandle string `json:"TaskHandle"`
}

// cancelMoveTask: every task ends within its start, so there is never a
// running one to cancel.
func (h *Handler) cancelMoveTask(c *call) (any, *apiError) {
	var in cancelMoveInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	return nil, errf(codeResourceNotFound, "no running move task has the handle %q: move tasks complete when they start", in.TaskHandle)
}
