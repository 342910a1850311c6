package sqs

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/subscription"
	"github.com/shardmq/shardmq/topology"
)

// The mapping (docs/sqs.md): the queue "orders" is the topic orders and
// its subscription default — the subscription a topic's messages go to
// when nobody made another — and the queue "orders:billing" is the topic
// orders and its subscription billing. Every stored subscription is thus
// a queue, whether it was made through SQS or the router's own API, and
// sending to a queue produces to its topic, so every subscription of the
// topic gets the message. A colon never appears in SQS queue names nor
// in topic names, so the two forms cannot collide.

// queueState is what a subscription keeps for SQS (subscription.Queue):
// the attributes as SQS spells them, the tags and the latest move tasks.
type queueState struct {
	Attributes map[string]string `json:"attributes,omitempty"`
	Tags       map[string]string `json:"tags,omitempty"`
	Created    int64             `json:"created,omitempty"`  // unix seconds
	Modified   int64             `json:"modified,omitempty"` // unix seconds
	MoveTasks  []moveTask        `json:"move_tasks,omitempty"`
}

// queue is a resolved queue: its name, its topic and subscription.
type queue struct {
	name, topic, sub string
	s                subscription.Subscription
	st               queueState
}

// The retry policy of a queue made through SQS: a message whose
// visibility timeout ran out is visible again at once (SQS has no
// backoff), and without a RedrivePolicy it is received up to the most
// attempts a subscription allows.
const (
	noRedriveAttempts = 1000
	maxTags           = 50
)

var sqsBackoff = subscription.Backoff{InitialMS: 1, MaxMS: 1, Multiplier: 1, Jitter: 0}

// sqsNameRE is what CreateQueue accepts for a new topic: SQS's own rule.
var sqsNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,80}(\.fifo)?$`)

// splitName maps a queue name onto its topic and subscription.
func splitName(name string) (topic, sub string, ok bool) {
	topic, sub, found := strings.Cut(name, ":")
	if !found {
		sub = subscription.Default
	}
	return topic, sub, topology.NameRE.MatchString(topic) && topology.NameRE.MatchString(sub)
}

// queueName is the queue of a topic's subscription.
func queueName(topic, sub string) string {
	if sub == subscription.Default {
		return topic
	}
	return topic + ":" + sub
}

func (h *Handler) arn(name string) string {
	return "arn:aws:sqs:" + h.cfg.Region + ":" + h.cfg.Account + ":" + name
}

// nameFromARN is the queue name of an SQS ARN (of any region or account:
// a router has one namespace of queues).
func nameFromARN(arn string) (string, bool) {
	p := strings.SplitN(arn, ":", 6)
	if len(p) != 6 || p[0] != "arn" || p[2] != "sqs" || p[5] == "" {
		return "", false
	}
	return p[5], true
}

// nameFromURL is the queue name of a queue URL (its last path segment).
func nameFromURL(raw string) (string, *apiError) {
	if raw == "" {
		return "", errf(codeMissingParameter, "the request must contain the parameter QueueUrl")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", errf(codeInvalidAddress, "the QueueUrl %q is not a URL", raw)
	}
	p := strings.Trim(u.Path, "/")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if p == "" {
		return "", errf(codeInvalidAddress, "the QueueUrl %q names no queue", raw)
	}
	return p, nil
}

// lookup resolves a queue by name; a missing (or implicit) subscription
// is QueueDoesNotExist.
func (h *Handler) lookup(c *call, name string) (*queue, *apiError) {
	topic, sub, ok := splitName(name)
	if !ok {
		return nil, errf(codeQueueDoesNotExist, "the specified queue %s does not exist", name)
	}
	s, err := h.b.GetSubscription(c.ctx, topic, sub)
	switch {
	case errors.Is(err, broker.ErrUnknownSubscription):
		return nil, errf(codeQueueDoesNotExist, "the specified queue %s does not exist", name)
	case err != nil:
		return nil, errUnavailable("read the queue's subscription", err)
	case s.Implicit():
		return nil, errf(codeQueueDoesNotExist, "the specified queue %s does not exist", name)
	}
	return fromSubscription(s), nil
}

// fromSubscription reads a subscription as a queue.
func fromSubscription(s subscription.Subscription) *queue {
	q := &queue{name: queueName(s.Topic, s.Name), topic: s.Topic, sub: s.Name, s: s}
	if len(s.Queue) > 0 {
		_ = json.Unmarshal(s.Queue, &q.st) // validated when written; a bad one reads as none
	}
	if q.st.Created == 0 {
		q.st.Created = s.CreatedAt.Unix()
	}
	return q
}

// queueFromURL resolves the call's QueueUrl and checks that the caller
// holds scope on its topic ("" for any scope).
func (h *Handler) queueFromURL(c *call, rawURL string, scope auth.Scope) (*queue, *apiError) {
	name, e := nameFromURL(rawURL)
	if e != nil {
		return nil, e
	}
	q, e := h.lookup(c, name)
	if e != nil {
		return nil, e
	}
	if scope == "" {
		e = c.allowAny(q.topic)
	} else {
		e = c.allow(scope, q.topic)
	}
	return q, e
}

// queueToChange resolves a queue the caller changes (admin on its
// topic). A subscription made natively gets its state here, keeping its
// creation time.
func (h *Handler) queueToChange(c *call, rawURL string) (*queue, *apiError) {
	q, e := h.queueFromURL(c, rawURL, auth.Admin)
	if e == nil && len(q.s.Queue) == 0 {
		q.st.Created = q.s.CreatedAt.Unix()
	}
	return q, e
}

// attr is a queue attribute's stored value, or its default.
func (q *queue) attr(name string) string {
	if v, ok := q.st.Attributes[name]; ok {
		return v
	}
	return attrDefaults[name]
}

// seconds is an integer attribute.
func (q *queue) seconds(name string) int64 {
	v, _ := strconv.ParseInt(q.attr(name), 10, 64)
	return v
}

func (q *queue) fifo() bool { return q.s.Ordered }

// redrive is the queue's RedrivePolicy (nil without one).
func (q *queue) redrive() *redrivePolicy {
	v := q.st.Attributes["RedrivePolicy"]
	if v == "" {
		return nil
	}
	p, err := parseRedrive(v)
	if err != nil {
		return nil
	}
	return p
}

// attrDefaults are SQS's defaults of the settable attributes.
var attrDefaults = map[string]string{
	"DelaySeconds":                  "0",
	"MaximumMessageSize":            "262144",
	"MessageRetentionPeriod":        "345600",
	"ReceiveMessageWaitTimeSeconds": "0",
	"VisibilityTimeout":             "30",
	"SqsManagedSseEnabled":          "false",
}

// intRanges bound the integer attributes.
var intRanges = map[string][2]int64{
	"DelaySeconds":                  {0, 900},
	"MaximumMessageSize":            {1024, 262144},
	"MessageRetentionPeriod":        {60, 1209600},
	"ReceiveMessageWaitTimeSeconds": {0, 20},
	"VisibilityTimeout":             {0, 43200},
	"KmsDataKeyReusePeriodSeconds":  {60, 86400},
}

// storedOnly are attributes kept and answered but without effect here
// (docs/sqs.md): policies and encryption belong to AWS's own service.
var storedOnly = map[string]bool{
	"Policy": true, "RedriveAllowPolicy": true, "KmsMasterKeyId": true, "KmsDataKeyReusePeriodSeconds": true,
	"SqsManagedSseEnabled": true, "DeduplicationScope": true, "FifoThroughputLimit": true,
}

// redrivePolicy is RedrivePolicy's JSON; maxReceiveCount comes as a
// number or a string.
type redrivePolicy struct {
	DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	MaxReceiveCount     num    `json:"maxReceiveCount"`
}

func parseRedrive(v string) (*redrivePolicy, error) {
	var p redrivePolicy
	if err := json.Unmarshal([]byte(v), &p); err != nil {
		return nil, err
	}
	if _, ok := nameFromARN(p.DeadLetterTargetArn); !ok {
		return nil, errors.New("deadLetterTargetArn is not an SQS queue ARN")
	}
	if !p.MaxReceiveCount.set || p.MaxReceiveCount.v < 1 || p.MaxReceiveCount.v > noRedriveAttempts {
		return nil, errors.New("maxReceiveCount must be 1-1000")
	}
	return &p, nil
}

// applyAttributes validates attrs and sets them on q (its state and the
// subscription's ordering and attempts). creating allows FifoQueue.
func (h *Handler) applyAttributes(c *call, q *queue, attrs map[string]string, creating bool) *apiError {
	if q.st.Attributes == nil {
		q.st.Attributes = map[string]string{}
	}
	for k, v := range attrs {
		switch {
		case k == "FifoQueue":
			fifo, err := strconv.ParseBool(v)
			if err != nil || fifo != strings.HasSuffix(q.name, ".fifo") || (!creating && fifo != q.s.Ordered) {
				return errf(codeInvalidAttributeValue, "FifoQueue is set at creation only, and only on a queue whose name ends in .fifo")
			}
			q.s.Ordered = fifo
		case k == "ContentBasedDeduplication":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return errf(codeInvalidAttributeValue, "invalid value for the parameter ContentBasedDeduplication")
			}
			q.st.Attributes[k] = strconv.FormatBool(b)
		case k == "RedrivePolicy":
			if v == "" {
				delete(q.st.Attributes, k)
				q.s.MaxAttempts = noRedriveAttempts
				continue
			}
			p, err := parseRedrive(v)
			if err != nil {
				return errf(codeInvalidAttributeValue, "invalid value for the parameter RedrivePolicy: %v", err)
			}
			target, _ := nameFromARN(p.DeadLetterTargetArn)
			if target == q.name {
				return errf(codeInvalidAttributeValue, "a queue cannot be its own dead-letter queue")
			}
			dlq, e := h.lookup(c, target)
			if e != nil {
				return errf(codeInvalidAttributeValue, "the dead-letter target %s does not exist", target)
			}
			if dlq.s.Ordered != (q.s.Ordered || strings.HasSuffix(q.name, ".fifo")) {
				return errf(codeInvalidAttributeValue, "the dead-letter queue of a FIFO queue must be FIFO, and of a standard queue standard")
			}
			q.s.MaxAttempts = int(p.MaxReceiveCount.v)
			q.st.Attributes[k] = v
		case intRanges[k] != [2]int64{}:
			r := intRanges[k]
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < r[0] || n > r[1] {
				return errf(codeInvalidAttributeValue, "invalid value for the parameter %s: must be %d-%d", k, r[0], r[1])
			}
			q.st.Attributes[k] = strconv.FormatInt(n, 10)
		case storedOnly[k]:
			q.st.Attributes[k] = v
		default:
			return errf(codeInvalidAttributeName, "unknown or read-only attribute %s", k)
		}
	}
	if q.st.Attributes["ContentBasedDeduplication"] == "true" && !q.s.Ordered {
		return errf(codeInvalidAttributeName, "ContentBasedDeduplication is an attribute of FIFO queues only")
	}
	return nil
}

// save stores q's subscription with its state.
func (h *Handler) save(c *call, q *queue) (bool, *apiError) {
	q.st.Modified = h.cfg.Now().Unix()
	raw, err := json.Marshal(q.st)
	if err != nil {
		return false, errf(codeInternal, "encode queue state: %v", err)
	}
	q.s.Queue = raw
	saved, created, err := h.b.PutSubscription(c.ctx, q.s)
	switch {
	case errors.Is(err, subscription.ErrInvalid):
		return false, errf(codeInvalidParameterValue, "%v", err)
	case errors.Is(err, subscription.ErrTooManySubscriptions), errors.Is(err, subscription.ErrTooManyTopics):
		return false, errf(codeInvalidParameterValue, "%v", err)
	case err != nil:
		return false, errUnavailable("store the queue", err)
	}
	q.s = saved
	return created, nil
}

type createQueueInput struct {
	QueueName  string            `json:"QueueName"`
	Attributes map[string]string `json:"Attributes"`
	Tags       map[string]string `json:"Tags"`
}

type queueURLResult struct {
	QueueURL string `json:"QueueUrl" xml:"QueueUrl"`
}

// createQueue makes the queue's subscription, or answers the URL of an
// existing one when the attributes given are those it has.
func (h *Handler) createQueue(c *call) (any, *apiError) {
	var in createQueueInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	topic, sub, ok := splitName(in.QueueName)
	if !ok || (sub == subscription.Default && !sqsNameRE.MatchString(in.QueueName)) {
		return nil, errf(codeInvalidParameterValue, "queue name %q: up to 80 letters, digits, hyphens and underscores, optionally ending in .fifo (or topic:subscription for another subscription of a topic)", in.QueueName)
	}
	if e := c.allow(auth.Admin, topic); e != nil {
		return nil, e
	}
	if len(in.Tags) > maxTags {
		return nil, errf(codeInvalidParameterValue, "a queue has at most %d tags", maxTags)
	}
	if in.Attributes["FifoQueue"] == "" && strings.HasSuffix(topic, ".fifo") && sub == subscription.Default {
		return nil, errf(codeInvalidParameterValue, "the name of a FIFO queue must end in .fifo and it must have the attribute FifoQueue=true")
	}
	if old, e := h.lookup(c, in.QueueName); e == nil {
		// An existing queue: the same attributes answer its URL (SQS's
		// idempotent create); others are QueueNameExists.
		probe := *old
		probe.st.Attributes = cloneMap(old.st.Attributes)
		if e := h.applyAttributes(c, &probe, in.Attributes, true); e != nil {
			return nil, e
		}
		for k, v := range in.Attributes {
			if k != "FifoQueue" && old.attr(k) != probe.attr(k) || k == "FifoQueue" && probe.s.Ordered != old.s.Ordered {
				return nil, errf(codeQueueNameExists, "a queue named %s already exists with a different value for %s (%s)", in.QueueName, k, v)
			}
		}
		return queueURLResult{c.base + old.name}, nil
	} else if e.code != codeQueueDoesNotExist {
		return nil, e
	}
	now := h.cfg.Now()
	q := &queue{name: in.QueueName, topic: topic, sub: sub,
		s:  subscription.Subscription{Topic: topic, Name: sub, MaxAttempts: noRedriveAttempts, Backoff: sqsBackoff},
		st: queueState{Tags: in.Tags, Created: now.Unix()}}
	if e := h.applyAttributes(c, q, in.Attributes, true); e != nil {
		return nil, e
	}
	if strings.HasSuffix(topic, ".fifo") && sub == subscription.Default && !q.s.Ordered {
		return nil, errf(codeInvalidParameterValue, "the name of a FIFO queue must end in .fifo and it must have the attribute FifoQueue=true")
	}
	if _, e := h.save(c, q); e != nil {
		return nil, e
	}
	return queueURLResult{c.base + q.name}, nil
}

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

type getQueueURLInput struct {
	QueueName string `json:"QueueName"`
}

func (h *Handler) getQueueURL(c *call) (any, *apiError) {
	var in getQueueURLInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	if in.QueueName == "" {
		return nil, errf(codeMissingParameter, "the request must contain the parameter QueueName")
	}
	q, e := h.lookup(c, in.QueueName)
	if e != nil {
		return nil, e
	}
	if e := c.allowAny(q.topic); e != nil {
		return nil, e
	}
	return queueURLResult{c.base + q.name}, nil
}

type listQueuesInput struct {
	QueueNamePrefix string `json:"QueueNamePrefix"`
	NextToken       string `json:"NextToken"`
	MaxResults      num    `json:"MaxResults"`
}

type listQueuesResult struct {
	QueueUrls []string `json:"QueueUrls,omitempty" xml:"QueueUrl"`
	NextToken string   `json:"NextToken,omitempty" xml:"NextToken,omitempty"`
}

// listQueues lists every stored subscription as a queue, by name, that
// the caller holds some scope on.
func (h *Handler) listQueues(c *call) (any, *apiError) {
	var in listQueuesInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	max, after, e := paging(in.MaxResults, in.NextToken)
	if e != nil {
		return nil, e
	}
	var names []string
	for _, s := range h.subs.List("") {
		name := queueName(s.Topic, s.Name)
		if strings.HasPrefix(name, in.QueueNamePrefix) && name > after && c.allowAny(s.Topic) == nil {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var out listQueuesResult
	for i, n := range names {
		if i == max {
			if in.MaxResults.set {
				out.NextToken = nextToken(names[i-1])
			}
			break
		}
		out.QueueUrls = append(out.QueueUrls, c.base+n)
	}
	return out, nil
}

// paging reads a listing's MaxResults (1-1000, default 1000) and
// NextToken (the last name of the page before, as nextToken gave it).
func paging(maxResults num, token string) (limit int, after string, e *apiError) {
	limit = 1000
	if maxResults.set {
		if maxResults.v < 1 || maxResults.v > 1000 {
			return 0, "", errf(codeInvalidParameterValue, "MaxResults must be 1-1000")
		}
		limit = int(maxResults.v)
	}
	if token != "" {
		b, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil {
			return 0, "", errf(codeInvalidParameterValue, "NextToken is not one this router gave")
		}
		after = string(b)
	}
	return limit, after, nil
}

func nextToken(last string) string { return base64.RawURLEncoding.EncodeToString([]byte(last)) }

type queueURLInput struct {
	QueueURL string `json:"QueueUrl"`
}

func (h *Handler) deleteQueue(c *call) (any, *apiError) {
	var in queueURLInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, auth.Admin)
	if e != nil {
		return nil, e
	}
	if err := h.b.DeleteSubscription(c.ctx, q.topic, q.sub); err != nil && !errors.Is(err, broker.ErrUnknownSubscription) {
		return nil, errUnavailable("delete the queue", err)
	}
	return nil, nil
}

// purgeQueue deletes every message of the queue: the subscription is
// dropped with its deliveries and stored again as it was (a message sent
// meanwhile may go too, as SQS warns), and the dead letters of its
// sources, when it is a dead-letter queue, are purged.
func (h *Handler) purgeQueue(c *call) (any, *apiError) {
	var in queueURLInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueToChange(c, in.QueueURL)
	if e != nil {
		return nil, e
	}
	if err := h.b.DeleteSubscription(c.ctx, q.topic, q.sub); err != nil && !errors.Is(err, broker.ErrUnknownSubscription) {
		return nil, errUnavailable("purge the queue", err)
	}
	if _, e := h.save(c, q); e != nil {
		return nil, e
	}
	for _, src := range h.sources(q) {
		if _, err := h.b.PurgeDead(c.ctx, src.topic, src.sub, ""); err != nil && !errors.Is(err, broker.ErrUnknownSubscription) {
			return nil, errUnavailable("purge the dead letters of "+src.name, err)
		}
	}
	return nil, nil
}

type getAttributesInput struct {
	QueueURL       string   `json:"QueueUrl"`
	AttributeNames []string `json:"AttributeNames"`
}

type attributesResult struct {
	Attributes attrMap `json:"Attributes,omitempty" xml:"Attribute"`
}

// readOnlyAttrs are computed, never set.
var readOnlyAttrs = []string{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed",
	"CreatedTimestamp", "LastModifiedTimestamp", "QueueArn"}

func (h *Handler) getQueueAttributes(c *call) (any, *apiError) {
	var in getAttributesInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, "")
	if e != nil {
		return nil, e
	}
	all := map[string]string{}
	for k, v := range attrDefaults {
		all[k] = v
	}
	for k, v := range q.st.Attributes {
		all[k] = v
	}
	all["QueueArn"] = h.arn(q.name)
	all["CreatedTimestamp"] = strconv.FormatInt(q.st.Created, 10)
	modified := q.st.Modified
	if modified == 0 {
		modified = q.st.Created
	}
	all["LastModifiedTimestamp"] = strconv.FormatInt(modified, 10)
	if q.s.Ordered {
		all["FifoQueue"] = "true"
		if all["ContentBasedDeduplication"] == "" {
			all["ContentBasedDeduplication"] = "false"
		}
	}
	want := map[string]bool{}
	for _, n := range in.AttributeNames {
		if n == "All" {
			for k := range all {
				want[k] = true
			}
			for _, k := range readOnlyAttrs {
				want[k] = true
			}
			continue
		}
		if _, ok := all[n]; !ok && !strings.HasPrefix(n, "ApproximateNumberOfMessages") && !storedOnly[n] &&
			n != "RedrivePolicy" && n != "FifoQueue" && n != "ContentBasedDeduplication" {
			return nil, errf(codeInvalidAttributeName, "unknown attribute %s", n)
		}
		want[n] = true
	}
	if want["ApproximateNumberOfMessages"] || want["ApproximateNumberOfMessagesNotVisible"] || want["ApproximateNumberOfMessagesDelayed"] {
		ready, inflight, delayed, e := h.depth(c, q)
		if e != nil {
			return nil, e
		}
		all["ApproximateNumberOfMessages"] = strconv.FormatInt(ready, 10)
		all["ApproximateNumberOfMessagesNotVisible"] = strconv.FormatInt(inflight, 10)
		all["ApproximateNumberOfMessagesDelayed"] = strconv.FormatInt(delayed, 10)
	}
	out := attributesResult{Attributes: attrMap{}}
	for k := range want {
		if v, ok := all[k]; ok {
			out.Attributes[k] = v
		}
	}
	return out, nil
}

// depth counts the queue's messages: its subscription's deliveries and,
// for a dead-letter queue, its sources' dead letters (Stats reads every
// cluster: an operator's question, not a per-message one).
func (h *Handler) depth(c *call, q *queue) (ready, inflight, delayed int64, e *apiError) {
	st := h.b.Stats(c.ctx)
	if len(st.Missing) > 0 && len(st.Subscriptions) == 0 {
		return 0, 0, 0, errUnavailable("count the queue's messages", errors.New("no cluster answered"))
	}
	srcs := map[[2]string]bool{}
	for _, s := range h.sources(q) {
		srcs[[2]string{s.topic, s.sub}] = true
	}
	for _, s := range st.Subscriptions {
		if s.Topic == q.topic && s.Subscription == q.sub {
			ready += s.Ready + s.Parked
			inflight += s.InFlight
			delayed += s.Delayed
		}
		if srcs[[2]string{s.Topic, s.Subscription}] {
			ready += s.Dead
		}
	}
	return ready, inflight, delayed, nil
}

type setAttributesInput struct {
	QueueURL   string            `json:"QueueUrl"`
	Attributes map[string]string `json:"Attributes"`
}

func (h *Handler) setQueueAttributes(c *call) (any, *apiError) {
	var in setAttributesInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueToChange(c, in.QueueURL)
	if e != nil {
		return nil, e
	}
	if e := h.applyAttributes(c, q, in.Attributes, false); e != nil {
		return nil, e
	}
	_, e = h.save(c, q)
	return nil, e
}

type tagInput struct {
	QueueURL string            `json:"QueueUrl"`
	Tags     map[string]string `json:"Tags"`
	TagKeys  []string          `json:"TagKeys"`
}

type tagsResult struct {
	Tags attrMap `json:"Tags,omitempty" xml:"Tag"`
}

func (h *Handler) tagQueue(c *call) (any, *apiError) {
	return h.changeTags(c, func(q *queue, in tagInput) {
		for k, v := range in.Tags {
			q.st.Tags[k] = v
		}
	})
}

func (h *Handler) untagQueue(c *call) (any, *apiError) {
	return h.changeTags(c, func(q *queue, in tagInput) {
		for _, k := range in.TagKeys {
			delete(q.st.Tags, k)
		}
	})
}

func (h *Handler) changeTags(c *call, change func(*queue, tagInput)) (any, *apiError) {
	var in tagInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueToChange(c, in.QueueURL)
	if e != nil {
		return nil, e
	}
	if q.st.Tags == nil {
		q.st.Tags = map[string]string{}
	}
	change(q, in)
	if len(q.st.Tags) > maxTags {
		return nil, errf(codeInvalidParameterValue, "a queue has at most %d tags", maxTags)
	}
	_, e = h.save(c, q)
	return nil, e
}

func (h *Handler) listQueueTags(c *call) (any, *apiError) {
	var in queueURLInput
	if e := decodeParams(c.req, &in); e != nil {
		return nil, e
	}
	q, e := h.queueFromURL(c, in.QueueURL, "")
	if e != nil {
		return nil, e
	}
	return tagsResult{Tags: attrMap(q.st.Tags)}, nil
}

// visibility is the queue's default visibility timeout.
func (q *queue) visibility() time.Duration {
	return time.Duration(q.seconds("VisibilityTimeout")) * time.Second
}
