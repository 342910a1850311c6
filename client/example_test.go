package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/shardmq/shardmq/client"
)

// These examples talk to a router on 127.0.0.1:8080 (`make run`); they are
// compiled by `go test`, not run.

func ExampleNew() {
	token, _ := os.ReadFile("var/router.token")
	c, err := client.New(client.Config{URL: "http://127.0.0.1:8080", Token: string(token)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

func ExampleNew_tls() {
	pem, _ := os.ReadFile("/etc/shardmq/ca.pem")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	c, err := client.New(client.Config{
		URL:   "https://mq.internal:8443",
		Token: os.Getenv("SHARDMQ_TOKEN"),
		TLS:   &tls.Config{RootCAs: roots},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

func ExampleClient_NewProducer() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, err := c.NewProducer(client.ProducerConfig{
		Durability: client.DurabilityReplicated, // answered once a replica has it
		Linger:     2 * time.Millisecond,
		MaxBatch:   500,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(context.Background())
}

func ExampleProducer_Send() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewProducer(client.ProducerConfig{})
	defer p.Close(context.Background())
	// Called from many goroutines, Send calls share requests.
	res, err := p.Send(context.Background(), "orders", client.Message{
		Key:      "order-42-paid", // the business fact: a resend is a duplicate
		OrderKey: "order-42",
		Payload:  json.RawMessage(`{"order":42,"amount":199.99}`),
	})
	switch {
	case errors.Is(err, client.ErrConflict):
		log.Print("order-42-paid was sent before with another payload")
	case err != nil:
		log.Printf("not sent (send again with the same key): %v", err)
	default:
		fmt.Println(res.Status, res.ID) // created or duplicate
	}
}

func ExampleProducer_SendMany() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewProducer(client.ProducerConfig{})
	defer p.Close(context.Background())
	out := p.SendMany(context.Background(), "orders", []client.Message{
		{Key: "order-1-paid", Payload: json.RawMessage(`{"order":1}`)},
		{Key: "order-2-paid", Payload: json.RawMessage(`{"order":2}`)},
	})
	for _, r := range out {
		fmt.Println(r.Key, r.Status, r.Err)
	}
}

func ExampleProducer_Close() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewProducer(client.ProducerConfig{})
	// Close sends what is queued and waits for the answers.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		log.Print(err)
	}
}

func ExampleClient_NewPublisher() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, err := c.NewPublisher(client.PublisherConfig{
		Linger:         5 * time.Millisecond, // wait this long for a batch to fill
		MaxInFlight:    4,                    // requests at once
		BufferMessages: 10000,                // past this, Publish waits…
		ErrorWhenFull:  false,                // …or, when true, answers ErrBufferFull
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close(context.Background())
}

func ExamplePublisher_Publish() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewPublisher(client.PublisherConfig{})
	ctx := context.Background()
	var pubs []*client.Publication
	for i := range 1000 {
		// Returns at once; one goroutine publishing one message at a time
		// still fills batched requests.
		pub, err := p.Publish(ctx, "orders", client.Message{
			Key:      fmt.Sprintf("order-%d-paid", i),
			OrderKey: fmt.Sprintf("order-%d", i), // the order of one order's messages is kept
			Payload:  json.RawMessage(fmt.Sprintf(`{"order":%d}`, i)),
		})
		if err != nil {
			log.Fatal(err) // not taken: closed, buffer full (ErrorWhenFull), ctx ended
		}
		pubs = append(pubs, pub)
	}
	for _, pub := range pubs {
		res, err := pub.Wait(ctx)
		if err != nil {
			log.Printf("%s: %v", res.Key, err) // publish it again with the same key to know
			continue
		}
		fmt.Println(res.Key, res.Status, res.ID) // created or duplicate
	}
	if err := p.Close(ctx); err != nil {
		log.Print(err)
	}
}

func ExamplePublisher_PublishFunc() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewPublisher(client.PublisherConfig{})
	err := p.PublishFunc(context.Background(), "orders", client.Message{Key: "order-7-paid", Payload: json.RawMessage(`{"order":7}`)},
		func(res client.Result, err error) {
			// Runs on the publisher's goroutine: keep it short.
			if err != nil {
				log.Printf("order-7-paid: %v", err)
			}
		})
	if err != nil {
		log.Print(err)
	}
	// Flush waits for the answers (and callbacks) of everything published so far.
	p.Flush(context.Background())
}

func ExamplePublisher_Resume() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewPublisher(client.PublisherConfig{})
	pub, _ := p.Publish(context.Background(), "orders", client.Message{Key: "order-9-shipped", OrderKey: "order-9", Payload: json.RawMessage(`{}`)})
	if _, err := pub.Wait(context.Background()); err != nil && !errors.Is(err, client.ErrConflict) {
		// Later messages of order-9 are refused (ErrOrderKeyPaused) until
		// this one is published again, first, and the key resumed.
		p.Resume("orders", "order-9")
	}
}

func ExamplePublisher_Close() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewPublisher(client.PublisherConfig{})
	// Close sends what is held and waits until every message has its
	// outcome; if ctx ends first, the rest are answered ErrClosed.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		log.Print(err)
	}
}

func ExampleClient_NewConsumer() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	cn, err := c.NewConsumer(client.ConsumerConfig{Topic: "orders", Subscription: "points", Concurrency: 16},
		func(ctx context.Context, d *client.Delivery) error {
			var order struct{ Order int }
			if err := json.Unmarshal(d.Body(), &order); err != nil {
				return &client.HandlerError{Code: "E_BAD_PAYLOAD", Err: err} // nacked with that code
			}
			return nil // acked
		})
	if err != nil {
		log.Fatal(err)
	}
	if err := cn.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func ExampleConsumer_Stop() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	cn, _ := c.NewConsumer(client.ConsumerConfig{Topic: "orders", Subscription: "points"},
		func(ctx context.Context, d *client.Delivery) error { return nil })
	_ = cn.Start(context.Background())
	// On SIGTERM: give running handlers 10 s, then release what is left.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cn.Stop(ctx); err != nil {
		log.Print(err)
	}
}

func ExampleHandlerError() {
	retry := time.Minute
	_ = client.Handler(func(ctx context.Context, d *client.Delivery) error {
		return &client.HandlerError{Code: "E_STOCK", Err: errors.New("out of stock"), RetryAfter: &retry}
	})
}

func ExampleClient_Produce() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	res, err := c.Produce(context.Background(), "orders", client.DurabilityPrimary, []client.Message{
		{Key: "order-7-paid", Payload: json.RawMessage(`{"order":7}`)},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res[0].Status)
}

func ExampleClient_Claim() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ctx := context.Background()
	ds, err := c.Claim(ctx, client.ClaimRequest{Topic: "orders", Subscription: "points", Max: 10,
		Visibility: 30 * time.Second, Wait: 5 * time.Second, Consumer: "worker-7"})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		fmt.Println(d.Key, d.Attempt)
	}
}

func ExampleClient_Ack() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ctx := context.Background()
	ds, _ := c.Claim(ctx, client.ClaimRequest{Topic: "orders", Subscription: "points", Max: 10})
	receipts := make([]string, len(ds))
	for i, d := range ds {
		receipts[i] = d.Receipt
	}
	res, err := c.Ack(ctx, receipts...)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range res {
		if errors.Is(r.Err(), client.ErrLeaseLost) {
			log.Print("the lease expired and someone else holds it now")
		}
	}
}

func ExampleClient_AckOne() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		if _, err := c.AckOne(context.Background(), d.Receipt); err != nil {
			log.Print(err)
		}
	}
}

func ExampleClient_Nack() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		in := int64(60_000)
		res, err := c.Nack(context.Background(), client.NackItem{Receipt: d.Receipt, ErrorCode: "E_STOCK", Error: "out of stock", RetryAfterMS: &in})
		if err == nil {
			fmt.Println(res[0].Status, res[0].NextAttemptAt) // retry_scheduled or dead
		}
	}
}

func ExampleClient_Extend() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		res, err := c.Extend(context.Background(), time.Minute, d.Receipt)
		if err == nil {
			fmt.Println(res[0].Status, res[0].LeaseExpiresAt)
		}
	}
}

func ExampleClient_PutSubscription() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080", Token: os.Getenv("SHARDMQ_TOKEN")})
	err := c.PutSubscription(context.Background(), "orders", "points", client.Subscription{
		MaxAttempts: 5,
		Backoff:     &client.Backoff{InitialMS: 1000, MaxMS: 600_000, Multiplier: 2},
		Ordered:     true,
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleError() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	_, err := c.Produce(context.Background(), "orders", "", []client.Message{{Key: "k", Payload: json.RawMessage(`{}`)}})
	var e *client.Error
	switch {
	case errors.Is(err, client.ErrForbidden):
		log.Print("the token may not produce to orders")
	case errors.As(err, &e) && e.Temporary():
		log.Printf("try again in %s", e.RetryAfter)
	}
}

func ExampleDelivery_Body() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		fmt.Printf("%s: %s\n", d.Key, d.Body())
	}
}

func ExampleLeaseResult_Err() {
	var r client.LeaseResult // from Ack, Nack or Extend
	if err := r.Err(); errors.Is(err, client.ErrReceiptNotFound) {
		log.Print("already acked")
	}
}

func ExampleDelivery_Ack() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		if err := d.Ack(context.Background()); err != nil {
			log.Print(err)
		}
	}
}

func ExampleDelivery_Nack() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points"})
	for _, d := range ds {
		status, err := d.Nack(context.Background(), "E_STOCK", "out of stock", nil)
		fmt.Println(status, err)
	}
}

func ExampleDelivery_Abandon() {
	_ = client.Handler(func(ctx context.Context, d *client.Delivery) error {
		d.Abandon() // the consumer neither acks nor nacks: the lease lapses
		return nil
	})
}

func ExampleClient_GetSubscription() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	s, err := c.GetSubscription(context.Background(), "orders", "points")
	if errors.Is(err, client.ErrNotFound) || errors.Is(err, client.ErrUnknownSubscription) {
		log.Print("no such subscription")
	}
	fmt.Println(s.MaxAttempts, s.Ordered)
}

func ExampleConsumer_Start() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	cn, _ := c.NewConsumer(client.ConsumerConfig{Topic: "orders", Subscription: "points"},
		func(ctx context.Context, d *client.Delivery) error { return nil })
	// Start returns at once; the loop runs until Stop (or ctx's end).
	if err := cn.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func ExampleClient_Close() {
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	defer c.Close() // releases idle connections
}
