// Package client is the Go client of shardmq's HTTP API (DESIGN §5, §9).
//
// It depends only on the standard library: it speaks the wire format of
// docs/design.md with its own types and never imports the router's
// packages, so a service takes it without the router's dependencies.
//
//   - Producer gathers messages sent one at a time by many goroutines into
//     one produce request (up to Linger or MaxBatch), answers every caller
//     with its own item's result, and retries the items the router answered
//     `unavailable` (and whole requests refused with 503 or 429) with the
//     same key, after a backoff with jitter that honours Retry-After. The
//     router deduplicates by key, so a retry never stores a message twice.
//   - Publisher publishes asynchronously: Publish returns a handle at once
//     (PublishFunc takes a callback), the publisher lingers a few
//     milliseconds or until a batch is full, keeps several requests in
//     flight, keeps each order key's messages in publish order through
//     retries, and answers each message's final outcome; its buffer is
//     bounded, and Flush and Close wait for everything outstanding.
//   - Consumer runs a claim loop with bounded concurrency, extends the
//     leases of deliveries whose handler still runs, acks on success and
//     nacks with an error code on failure, and stops gracefully.
//   - Claim, Ack, Nack and Extend are the API's calls one to one, for
//     callers that drive leases themselves (client/inbox does).
//
// Errors the router answers are *Error values carrying the API's code;
// match them with errors.As or errors.Is against the Err* values (one per
// code), never on their text.
//
// The transactional outbox (client/outbox) and the idempotent inbox
// (client/inbox) build on this package; docs/client.md explains the
// guarantees end to end.
package client
