package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/outbox"
)

func ExampleMigrate() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders?interpolateParams=true")
	if err := outbox.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
}

func ExampleEnqueue() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	ctx := context.Background()
	tx, _ := db.BeginTx(ctx, nil)
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = 42`); err != nil {
		log.Fatal(err)
	}
	// Written with the business change: published if and only if it commits.
	if _, err := outbox.Enqueue(ctx, tx, "orders", client.Message{Key: "order-42-paid", Payload: json.RawMessage(`{"order":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

func ExampleNewRelay() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewProducer(client.ProducerConfig{MaxAttempts: 3})
	relay := outbox.NewRelay(db, p, outbox.RelayConfig{Name: "orders-relay-1"})
	relay.Start(context.Background())
	defer relay.Stop()
}

func ExampleRelay_RunOnce() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	p, _ := c.NewProducer(client.ProducerConfig{})
	relay := outbox.NewRelay(db, p, outbox.RelayConfig{})
	for {
		n, err := relay.RunOnce(context.Background())
		if err != nil || n == 0 {
			break
		}
	}
}

func ExampleCount() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	c, _ := outbox.Count(context.Background(), db)
	log.Printf("pending %d, published %d, dead %d", c.Pending, c.Published, c.Dead)
}

func ExampleRedrive() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	n, _ := outbox.Redrive(context.Background(), db) // after fixing what made them fail
	log.Printf("%d rows pending again", n)
}

func ExamplePurge() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/orders")
	for {
		n, err := outbox.Purge(context.Background(), db, 7*24*3600e9, 1000)
		if err != nil || n == 0 {
			break
		}
	}
}
