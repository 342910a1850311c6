package shardmqwatermill_test

import (
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/shardmq/shardmq/client"
	shardmqwatermill "github.com/shardmq/shardmq/client/watermill"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// TestPubSub runs Watermill's universal Pub/Sub suite against a router
// over the test bed, through the adapter, declaring what shardmq has:
// persistent messages and consumer groups (subscriptions). Order is not
// declared: an unordered subscription delivers by priority, then age,
// with several messages in flight (the ordered suite is TestPubSubOrdered).
func TestPubSub(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{Token: true})
	c, err := client.New(client.Config{URL: r.URL, Token: r.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	features := tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
	}
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := shardmqwatermill.NewPublisher(c, shardmqwatermill.PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := shardmqwatermill.NewSubscriber(c, shardmqwatermill.SubscriberConfig{Subscription: group,
			Settings: client.Subscription{MaxAttempts: 1000, Backoff: &client.Backoff{InitialMS: 10, MaxMS: 100, Multiplier: 2}},
			Wait:     200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return pub, sub
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "watermill") },
		newPubSub)
}

// TestPubSubOrdered runs the suite again on ordered subscriptions with one
// order key per topic, declaring guaranteed order: shardmq delivers one
// order key's messages strictly in publish order, one in flight at a time.
// With a single key per topic every message costs a claim and an ack
// round trip in turn (50–90 ms here under load), so this run uses the
// suite's short message counts (ForceShort: 50–100 instead of 1,000–5,000
// per test); the unordered suite runs the full counts.
func TestPubSubOrdered(t *testing.T) {
	testbed.Need(t)
	r := routertest.Start(t, bed, routertest.Options{Token: true})
	c, err := client.New(client.Config{URL: r.URL, Token: r.Token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	features := tests.Features{
		ConsumerGroups:  true,
		Persistent:      true,
		GuaranteedOrder: true,
		ForceShort:      true,
	}
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := shardmqwatermill.NewPublisher(c, shardmqwatermill.PublisherConfig{
			OrderKey: func(topic string, _ *message.Message) string { return topic }})
		if err != nil {
			t.Fatal(err)
		}
		sub, err := shardmqwatermill.NewSubscriber(c, shardmqwatermill.SubscriberConfig{Subscription: group,
			Settings: client.Subscription{Ordered: true, MaxAttempts: 1000, Backoff: &client.Backoff{InitialMS: 10, MaxMS: 100, Multiplier: 2}},
			Wait:     200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return pub, sub
	}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "watermill") },
		newPubSub)
}
