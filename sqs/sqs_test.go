package sqs

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/subscription"
)

// The SQS API against real clients and MariaDB is tested in sqs/sdktest
// (make test-sqs); these tests need neither.

// TestSignatureVector checks the canonical request and the signature
// against the worked example of AWS's Signature Version 4 documentation
// (IAM ListUsers, 2015-08-30).
func TestSignatureVector(t *testing.T) {
	r := httptest.NewRequest("GET", "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08", nil)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	r.Header.Set("X-Amz-Date", "20150830T123600Z")
	canonical := canonicalRequest(r, []string{"content-type", "host", "x-amz-date"},
		"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	want := "GET\n/\nAction=ListUsers&Version=2010-05-08\ncontent-type:application/x-www-form-urlencoded; charset=utf-8\n" +
		"host:iam.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n" +
		"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if canonical != want {
		t.Fatalf("canonical request\n%s\nwant\n%s", canonical, want)
	}
	sig := signature("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830", "us-east-1", "iam", "20150830T123600Z", canonical)
	if sig != "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7" {
		t.Fatalf("signature %s", sig)
	}
}

// TestVerifySignature: a signed request passes; another secret, a
// changed body or a clock 15 minutes off does not.
func TestVerifySignature(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	body := []byte(`{"QueueName":"orders"}`)
	signed := func(at time.Time) *http.Request {
		r := httptest.NewRequest("POST", "http://127.0.0.1:8080/", bytes.NewReader(body))
		r.Header.Set("X-Amz-Target", "AmazonSQS.GetQueueUrl")
		r.Header.Set("Content-Type", jsonContentType)
		Sign(r, body, "SMQKEY0000000000000", "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t", "eu-west-1", at)
		return r
	}
	check := func(r *http.Request, b []byte, secret string) *apiError {
		sig, e := parseAuthorization(r.Header.Get("Authorization"))
		if e != nil {
			return e
		}
		return verifySignature(r, b, sig, secret, now)
	}
	const secret = "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t"
	if e := check(signed(now), body, secret); e != nil {
		t.Fatalf("signed request refused: %v", e)
	}
	if e := check(signed(now.Add(-14*time.Minute)), body, secret); e != nil {
		t.Fatalf("14 minutes old refused: %v", e)
	}
	for name, c := range map[string]struct {
		r      *http.Request
		body   []byte
		secret string
		want   errCode
	}{
		"other secret": {signed(now), body, secret + "x", codeSignatureMismatch},
		"changed body": {signed(now), []byte(`{"QueueName":"other"}`), secret, codeSignatureMismatch},
		"16 min old":   {signed(now.Add(-16 * time.Minute)), body, secret, codeRequestExpired},
		"16 min ahead": {signed(now.Add(16 * time.Minute)), body, secret, codeRequestExpired},
	} {
		if e := check(c.r, c.body, c.secret); e == nil || e.code != c.want {
			t.Errorf("%s: %v, want %s", name, e, c.want.query)
		}
	}
}

// TestIsSQS: only requests to / (or a queue's path) that carry an SQS
// action go to the SQS API.
func TestIsSQS(t *testing.T) {
	for _, c := range []struct {
		method, target, path, ct string
		want                     bool
	}{
		{"POST", "/", "AmazonSQS.SendMessage", jsonContentType, true},
		{"POST", "/?Action=ListQueues", "", "", true},
		{"POST", "/", "", "application/x-www-form-urlencoded; charset=utf-8", true},
		{"POST", "/000000000000/orders", "", "application/x-www-form-urlencoded", true},
		{"GET", "/?Action=ListQueues", "", "", true},
		{"POST", "/v1/topics/orders/messages", "", "application/json", false},
		{"POST", "/v1/ack", "AmazonSQS.SendMessage", "application/json", false},
		{"GET", "/healthz", "", "", false},
		{"GET", "/ui/", "", "", false},
		{"GET", "/", "", "", false},
	} {
		r := httptest.NewRequest(c.method, c.target, nil)
		if c.path != "" {
			r.Header.Set("X-Amz-Target", c.path)
		}
		if c.ct != "" {
			r.Header.Set("Content-Type", c.ct)
		}
		if got := IsSQS(r); got != c.want {
			t.Errorf("%s %s (target %q): %v, want %v", c.method, c.target, c.path, got, c.want)
		}
	}
}

// TestFoldQuery: the query protocol's flattened parameters take the
// JSON protocol's shape.
func TestFoldQuery(t *testing.T) {
	form := url.Values{
		"Action":                            {"SendMessageBatch"},
		"QueueUrl":                          {"http://h/000000000000/q"},
		"SendMessageBatchRequestEntry.2.Id": {"b"},
		"SendMessageBatchRequestEntry.2.MessageBody":                          {"two"},
		"SendMessageBatchRequestEntry.1.Id":                                   {"a"},
		"SendMessageBatchRequestEntry.1.MessageBody":                          {"one"},
		"SendMessageBatchRequestEntry.1.DelaySeconds":                         {"5"},
		"SendMessageBatchRequestEntry.1.MessageAttribute.1.Name":              {"k"},
		"SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType":    {"String"},
		"SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": {"v"},
	}
	raw, err := foldQuery(form, "/")
	if err != nil {
		t.Fatal(err)
	}
	var in sendBatchInput
	if e := decodeParams(&request{params: raw}, &in); e != nil {
		t.Fatal(e)
	}
	if len(in.Entries) != 2 || in.Entries[0].ID != "a" || in.Entries[1].MessageBody != "two" || in.Entries[0].DelaySeconds.v != 5 ||
		*in.Entries[0].MessageAttributes["k"].StringValue != "v" {
		t.Fatalf("folded into %s", raw)
	}
	raw, err = foldQuery(url.Values{"Action": {"ReceiveMessage"}, "AttributeName.1": {"All"}, "MaxNumberOfMessages": {"3"}}, "/000000000000/q")
	if err != nil {
		t.Fatal(err)
	}
	var rin receiveInput
	if e := decodeParams(&request{params: raw}, &rin); e != nil {
		t.Fatal(e)
	}
	if rin.QueueURL != "/000000000000/q" || len(rin.AttributeNames) != 1 || rin.MaxNumberOfMessages.v != 3 {
		t.Fatalf("folded into %s", raw)
	}
}

// missingBroker knows no subscription: every queue is missing.
type missingBroker struct{ Broker }

func (missingBroker) GetSubscription(context.Context, string, string) (subscription.Subscription, error) {
	return subscription.Subscription{}, broker.ErrUnknownSubscription
}

type noSubs struct{}

func (noSubs) List(string) []subscription.Subscription { return nil }

type tokens struct{ set *auth.Set }

func (t tokens) Set() *auth.Set { return t.set }

// TestErrorShapes: an error in each protocol's own shape, with SQS's
// codes.
func TestErrorShapes(t *testing.T) {
	h := New(Config{}, missingBroker{}, noSubs{})
	r := httptest.NewRequest("POST", "http://127.0.0.1/", strings.NewReader(`{"QueueUrl":"http://127.0.0.1/000000000000/nope"}`))
	r.Header.Set("X-Amz-Target", "AmazonSQS.GetQueueAttributes")
	r.Header.Set("Content-Type", jsonContentType)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var body map[string]string
	json.Unmarshal(w.Body.Bytes(), &body)
	if w.Code != 400 || body["__type"] != "com.amazonaws.sqs#QueueDoesNotExist" ||
		w.Header().Get("X-Amzn-Query-Error") != "AWS.SimpleQueueService.NonExistentQueue;Sender" {
		t.Fatalf("JSON: %d %v %v", w.Code, w.Header(), body)
	}

	r = httptest.NewRequest("POST", "http://127.0.0.1/", strings.NewReader("Action=GetQueueUrl&QueueName=nope&Version=2012-11-05"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "<Code>AWS.SimpleQueueService.NonExistentQueue</Code>") ||
		!strings.Contains(w.Body.String(), "<Type>Sender</Type>") {
		t.Fatalf("query: %d %s", w.Code, w.Body)
	}

	r = httptest.NewRequest("POST", "http://127.0.0.1/", strings.NewReader("Action=Frobnicate"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if !strings.Contains(w.Body.String(), "<Code>InvalidAction</Code>") {
		t.Fatalf("unknown action: %s", w.Body)
	}

	signedOnly := New(Config{Tokens: tokens{&auth.Set{}}}, missingBroker{}, noSubs{})
	r = httptest.NewRequest("POST", "http://127.0.0.1/", strings.NewReader("Action=ListQueues"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w = httptest.NewRecorder()
	signedOnly.ServeHTTP(w, r)
	if w.Code != 403 || !strings.Contains(w.Body.String(), "<Code>MissingAuthenticationToken</Code>") {
		t.Fatalf("unsigned: %d %s", w.Code, w.Body)
	}
	r.Header.Set("Origin", "https://evil.example")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 403 {
		t.Fatalf("a browser's request: %d %s", w.Code, w.Body)
	}
}

// TestAttributeDigest: MD5OfMessageAttributes of one String attribute,
// computed by hand from SQS's encoding.
func TestAttributeDigest(t *testing.T) {
	v := "x"
	got := md5OfAttributes(map[string]msgAttr{"a": {DataType: "String", StringValue: &v}})
	// name "a", type "String", transport 1, value "x", each length-prefixed.
	manual := md5Hex("\x00\x00\x00\x01a\x00\x00\x00\x06String\x01\x00\x00\x00\x01x")
	if got != manual {
		t.Fatalf("digest %s, want %s", got, manual)
	}
}
