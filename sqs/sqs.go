// Package sqs speaks the Amazon SQS API (AWS JSON 1.0 and the older query
// protocol) over the broker, so that existing SQS clients — AWS SDKs,
// boto3, the AWS CLI — work against a router by changing their endpoint
// URL and credentials. A queue is a topic and one of its subscriptions
// (docs/sqs.md); sending produces to the topic, receiving claims from the
// subscription, and a receipt handle is the broker's receipt. Calls are
// authenticated with AWS Signature Version 4 by access keys that act as
// the router's tokens (auth.AccessKeys).
package sqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/subscription"
)

// Broker is what the SQS API needs from the broker: its public message,
// subscription and dead-letter operations. Receipts stay opaque here: a
// receipt handle is the broker's receipt, decoded only to hand it back.
type Broker interface {
	Produce(ctx context.Context, topic string, msgs []broker.Message, dur broker.Durability) ([]broker.ProduceResult, error)
	Claim(ctx context.Context, req broker.ClaimRequest) ([]broker.Delivery, error)
	Ack(ctx context.Context, receipts []broker.Receipt) []broker.LeaseResult
	Extend(ctx context.Context, receipts []broker.Receipt, lease time.Duration) []broker.LeaseResult
	// DecodeReceipt reads a receipt handle (a signed broker receipt).
	DecodeReceipt(s string) (broker.Receipt, error)
	GetSubscription(ctx context.Context, topic, name string) (subscription.Subscription, error)
	PutSubscription(ctx context.Context, s subscription.Subscription) (subscription.Subscription, bool, error)
	DeleteSubscription(ctx context.Context, topic, name string) error
	Redrive(ctx context.Context, topic, sub string, ids []uint64, errorCode string) (int64, error)
	PurgeDead(ctx context.Context, topic, sub, errorCode string) (int64, error)
	Stats(ctx context.Context) broker.Stats
}

var _ Broker = (*broker.Broker)(nil)

// Subscriptions lists the stored subscriptions (every queue, and the
// sources of a dead-letter queue): subscription.Registry.
type Subscriptions interface {
	List(topic string) []subscription.Subscription
}

var _ Subscriptions = (*subscription.Registry)(nil)

// Tokens is the router's token set in use: an access key acts as the
// token it names.
type Tokens interface {
	Set() *auth.Set
}

var _ Tokens = (*auth.Store)(nil)

// AccessKeys finds an access key and its secret by id.
type AccessKeys interface {
	Lookup(id string) (auth.AccessKey, bool)
}

var _ AccessKeys = (*auth.AccessKeys)(nil)

// Config tunes the SQS API. Zero fields take the defaults named.
type Config struct {
	// Account is the 12-digit account id in queue URLs and ARNs.
	// Defaults to 000000000000.
	Account string
	// Region is the region in queue ARNs. Defaults to us-east-1. Requests
	// may be signed for any region.
	Region string
	// Tokens and Keys authenticate calls. With Tokens nil the API is open
	// like the router's own (a loopback router without a token file): no
	// signature is asked for or checked. With Tokens set, every call must
	// be signed by a key of Keys (none: every call is refused).
	Tokens Tokens
	Keys   AccessKeys
	// MaxBody caps a request body. Defaults to 4 MiB (ten messages of
	// 256 KiB with their attributes, as a form).
	MaxBody int64
	// Metrics receives the request counter. Optional.
	Metrics prometheus.Registerer
	// Log defaults to discarding.
	Log *slog.Logger
	// Now is the clock of signatures and timestamps. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Account == "" {
		c.Account = "000000000000"
	}
	if c.Region == "" {
		c.Region = "us-east-1"
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 4 << 20
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Handler serves the SQS API. Mount it for the requests IsSQS accepts.
type Handler struct {
	cfg  Config
	b    Broker
	subs Subscriptions
	// firstSeen remembers when this router first handed out a message
	// (ApproximateFirstReceiveTimestamp of later receives).
	firstSeen *expirable.LRU[uint64, time.Time]
	counts    *prometheus.CounterVec
	actions   map[string]action
}

// call is one authenticated request being served.
type call struct {
	ctx  context.Context
	req  *request
	tok  *auth.Token // nil on an open router
	base string      // "http://host/account/": queue URLs start so
}

type action func(c *call) (any, *apiError)

// New returns the SQS API over b; subs lists the stored subscriptions.
func New(cfg Config, b Broker, subs Subscriptions) *Handler {
	cfg = cfg.withDefaults()
	h := &Handler{cfg: cfg, b: b, subs: subs, firstSeen: expirable.NewLRU[uint64, time.Time](100000, nil, 12*time.Hour)}
	h.counts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardmq_sqs_requests_total",
		Help: "SQS API calls by action (unknown ones as \"invalid\") and answer code (\"ok\" or the SQS error code).",
	}, []string{"action", "code"})
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(h.counts); err != nil {
			cfg.Log.Warn("sqs metrics not registered", "err", err)
		}
	}
	h.actions = map[string]action{
		"CreateQueue":                  h.createQueue,
		"GetQueueUrl":                  h.getQueueURL,
		"ListQueues":                   h.listQueues,
		"DeleteQueue":                  h.deleteQueue,
		"PurgeQueue":                   h.purgeQueue,
		"GetQueueAttributes":           h.getQueueAttributes,
		"SetQueueAttributes":           h.setQueueAttributes,
		"TagQueue":                     h.tagQueue,
		"UntagQueue":                   h.untagQueue,
		"ListQueueTags":                h.listQueueTags,
		"SendMessage":                  h.sendMessage,
		"SendMessageBatch":             h.sendMessageBatch,
		"ReceiveMessage":               h.receiveMessage,
		"DeleteMessage":                h.deleteMessage,
		"DeleteMessageBatch":           h.deleteMessageBatch,
		"ChangeMessageVisibility":      h.changeVisibility,
		"ChangeMessageVisibilityBatch": h.changeVisibilityBatch,
		"ListDeadLetterSourceQueues":   h.listDeadLetterSources,
		"StartMessageMoveTask":         h.startMoveTask,
		"ListMessageMoveTasks":         h.listMoveTasks,
		"CancelMessageMoveTask":        h.cancelMoveTask,
		"AddPermission":                h.unsupported,
		"RemovePermission":             h.unsupported,
	}
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := requestID()
	fail := func(req *request, e *apiError) {
		if req == nil {
			req = &request{id: id}
			if r.Header.Get("X-Amz-Target") == "" {
				req.proto = protoQuery
			}
		}
		name := "invalid"
		if _, ok := h.actions[req.action]; ok {
			name = req.action
		}
		h.counts.WithLabelValues(name, e.code.json).Inc()
		if e.code == codeInternal || e.code == codeUnavailable {
			h.cfg.Log.Warn("sqs call failed", "request_id", id, "action", req.action, "err", e.message)
		}
		writeError(w, req, e)
	}
	// A browser's cross-site request carries Origin; SDKs never do. Without
	// this a page could drive an open router with a form post.
	if r.Header.Get("Origin") != "" {
		fail(nil, errf(codeOriginNotAllowed, "requests from browsers (with an Origin header) are not served by the SQS API"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			fail(nil, errf(codeRequestTooLarge, "the request body exceeds %d bytes", h.cfg.MaxBody))
			return
		}
		fail(nil, errf(codeMalformedQuery, "the request body could not be read"))
		return
	}
	req, e := decodeRequest(r, body)
	if e != nil {
		fail(req, e)
		return
	}
	req.id = id
	act, ok := h.actions[req.action]
	if !ok {
		fail(req, errInvalidAction(req.action))
		return
	}
	tok, e := h.authenticate(r, body)
	if e != nil {
		fail(req, e)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	c := &call{ctx: r.Context(), req: req, tok: tok, base: scheme + "://" + r.Host + "/" + h.cfg.Account + "/"}
	result, e := act(c)
	if e != nil {
		fail(req, e)
		return
	}
	h.counts.WithLabelValues(req.action, "ok").Inc()
	writeResult(w, req, result)
}

// authenticate verifies the call's signature and returns the token its
// key acts as (nil on an open router).
func (h *Handler) authenticate(r *http.Request, body []byte) (*auth.Token, *apiError) {
	if h.cfg.Tokens == nil {
		return nil, nil
	}
	authz := r.Header.Get("Authorization")
	if authz == "" {
		if r.URL.Query().Has("X-Amz-Signature") {
			return nil, errf(codeIncompleteSig, "presigned URLs are not supported: sign with the Authorization header")
		}
		return nil, errf(codeMissingAuth, "the request is not signed: SQS calls need an AWS Signature Version 4 by an access key of the router")
	}
	if r.Header.Get("X-Amz-Security-Token") != "" {
		return nil, errf(codeInvalidClientID, "session tokens are not issued by this router: sign with an access key of its access-key file")
	}
	sig, e := parseAuthorization(authz)
	if e != nil {
		return nil, e
	}
	if h.cfg.Keys == nil {
		return nil, errf(codeInvalidClientID, "the router has no access keys (-aws-credentials)")
	}
	key, ok := h.cfg.Keys.Lookup(sig.accessKey)
	if !ok {
		return nil, errf(codeInvalidClientID, "the access key id %s is not known to the router", sig.accessKey)
	}
	if e := verifySignature(r, body, sig, key.Secret, h.cfg.Now()); e != nil {
		return nil, e
	}
	tok := h.cfg.Tokens.Set().ByName(key.Token)
	if tok == nil {
		return nil, errf(codeInvalidClientID, "the access key's token %s is not in the token file", key.Token)
	}
	if ok, wait := tok.Allow(h.cfg.Now()); !ok {
		e := errf(codeThrottled, "token %s is over its request rate", tok.Name)
		e.retryAfter = auth.RetryAfterSeconds(wait)
		return nil, e
	}
	return tok, nil
}

// allow checks that the caller holds scope on topic.
func (c *call) allow(scope auth.Scope, topic string) *apiError {
	if c.tok == nil || c.tok.Allows(scope, topic) {
		return nil
	}
	return errf(codeAccessDenied, "access key of token %s lacks scope %s on topic %q", c.tok.Name, scope, topic)
}

// allowAny checks that the caller holds some scope on topic (reading a
// queue's URL, attributes and tags).
func (c *call) allowAny(topic string) *apiError {
	if c.tok == nil {
		return nil
	}
	for _, s := range auth.Scopes {
		if c.tok.Allows(s, topic) {
			return nil
		}
	}
	return errf(codeAccessDenied, "access key of token %s has no scope on topic %q", c.tok.Name, topic)
}

// consumer names the caller in the trace's claimed events.
func (c *call) consumer() string {
	if c.tok == nil {
		return "sqs"
	}
	return "sqs:" + c.tok.Name
}

func (h *Handler) unsupported(c *call) (any, *apiError) {
	return nil, errf(codeUnsupported, "%s is not supported: access is granted by the router's tokens and access keys (docs/security.md)", c.req.action)
}

// requestID is a random id in the form AWS request ids have.
func requestID() string {
	var b [16]byte
	rand.Read(b[:])
	s := hex.EncodeToString(b[:])
	return strings.Join([]string{s[:8], s[8:12], s[12:16], s[16:20], s[20:]}, "-")
}
