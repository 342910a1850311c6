package inbox_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/shardmq/shardmq/client"
	"github.com/shardmq/shardmq/client/inbox"
)

func ExampleMigrate() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/points?interpolateParams=true")
	if err := inbox.Migrate(context.Background(), db); err != nil {
		log.Fatal(err)
	}
}

func ExampleInbox_Handle() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/points")
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	in := inbox.New(db, inbox.Config{Name: "points-1"})
	ds, _ := c.Claim(context.Background(), client.ClaimRequest{Topic: "orders", Subscription: "points", Max: 10})
	for _, d := range ds {
		outcome, err := in.Handle(context.Background(), d, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE balance SET points = points + 10 WHERE user_id = 7`)
			return err
		})
		log.Print(outcome, err) // Processed, or Duplicate for a redelivery
	}
}

func ExampleInbox_Handler() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/points")
	c, _ := client.New(client.Config{URL: "http://127.0.0.1:8080"})
	in := inbox.New(db, inbox.Config{})
	cn, _ := c.NewConsumer(client.ConsumerConfig{Topic: "orders", Subscription: "points"},
		in.Handler(func(ctx context.Context, d *client.Delivery, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (msg_key) VALUES (?)`, d.Key)
			return err
		}))
	_ = cn.Start(context.Background())
}

func ExampleNew() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/points")
	// Lock no longer than the subscription's lease (visibility timeout).
	_ = inbox.New(db, inbox.Config{Name: "points-1", Lock: 30e9})
}

func ExamplePurge() {
	db, _ := sql.Open("mysql", "svc:pw@tcp(127.0.0.1:3306)/points")
	n, _ := inbox.Purge(context.Background(), db, 30*24*3600e9, 1000)
	log.Printf("purged %d", n)
}
