package shardmqwatermill_test

import (
	"context"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/shardmq/shardmq/client"
	shardmqwatermill "github.com/shardmq/shardmq/client/watermill"
)

func ExampleNewPublisher() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080", Token: os.Getenv("SHARDMQ_TOKEN")})
	pub, err := shardmqwatermill.NewPublisher(c, shardmqwatermill.PublisherConfig{
		Producer: client.ProducerConfig{Durability: client.DurabilityReplicated},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	// The UUID is the key: publishing this message again stores it once.
	msg := message.NewMessage("order-42-paid", []byte(`{"order":42}`))
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
}

func ExampleNewSubscriber() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080", Token: os.Getenv("SHARDMQ_TOKEN")})
	sub, err := shardmqwatermill.NewSubscriber(c, shardmqwatermill.SubscriberConfig{
		Subscription: "points", // the consumer group
		Settings:     client.Subscription{MaxAttempts: 5},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), "orders")
	if err != nil {
		log.Fatal(err)
	}
	for msg := range msgs {
		log.Printf("%s: %s", msg.UUID, msg.Payload)
		msg.Ack()
	}
}

func ExamplePublisherConfig_ordered() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	// Messages of one order key arrive in publish order on an ordered
	// subscription.
	pub, _ := shardmqwatermill.NewPublisher(c, shardmqwatermill.PublisherConfig{
		OrderKey: func(topic string, m *message.Message) string { return m.Metadata.Get("order_id") },
	})
	sub, _ := shardmqwatermill.NewSubscriber(c, shardmqwatermill.SubscriberConfig{
		Subscription: "billing",
		Settings:     client.Subscription{Ordered: true},
	})
	defer pub.Close()
	defer sub.Close()
}

func ExampleSubscriber_SubscribeInitialize() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080", Token: os.Getenv("SHARDMQ_TOKEN")})
	sub, _ := shardmqwatermill.NewSubscriber(c, shardmqwatermill.SubscriberConfig{Subscription: "points"})
	// Create the subscription before anything is published: a
	// subscription receives what is produced after it exists.
	if err := sub.SubscribeInitialize("orders"); err != nil {
		log.Fatal(err)
	}
}
