// Package delivery holds, in a router's memory, the delivery state of the
// units it owns — a unit is one subscription on one cluster — and writes
// what happens to it in batched, epoch-fenced flushes (docs/consume.md,
// "Owners").
//
// Why: a lease written to the table per delivery costs a row write that
// moves an index entry and a second commit per claimed batch, and that
// capped any implementation of the old contract at half of a plain
// database queue. Kafka's share groups, Pulsar's cursors and Pub/Sub keep
// in-flight state in the serving tier instead; shardmq's serving tier is
// its routers.
//
// What holds:
//
//   - One owner per unit, recorded in the unit's cluster (delivery_owner:
//     owner, epoch, lease, horizon). Every write an owner makes from its
//     memory checks the epoch under a shared lock in its own transaction,
//     so a router that lost the unit writes nothing.
//   - A first attempt is handed out from memory: the claim writes nothing.
//     Its ack is answered only after the flush that deletes the delivery
//     committed. Every later attempt is claimed durably (the attempt is
//     counted in the table first), so a message that keeps failing dies
//     after its subscription's max attempts whatever happens to owners.
//   - A lease that expires, or that its owner hands over (to another
//     router, or with its vshard in a resharding cut-over), is written to
//     the table as a durable lease and fences itself from then on.
//   - No owner hands out a lease that outlasts the horizon recorded in
//     delivery_owner; after a crash the next owner hands nothing out
//     before that horizon, so a crash costs a redelivery, never an early
//     one or a loss.
package delivery
