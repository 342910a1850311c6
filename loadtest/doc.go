// Package loadtest drives shardmq at target rates and proves that nothing
// was lost or duplicated on the way (DESIGN §9, issue 7).
//
// A run is a list of phases. Each phase sends one workload to one Target —
// the router over HTTP, or the same logical work straight into MySQL
// through the store package (the baseline: same schema, same durability,
// multi-row statements of the same batch size, same concurrency, one round
// trip per statement) — and measures it:
//
//   - open-loop rate control: a Pacer hands out intended send times on a
//     fixed schedule and latency is measured from the intended time, so a
//     stall shows up in the percentiles instead of silently lowering the
//     offered load (no coordinated omission). A rate of 0 runs closed loop:
//     each worker sends as soon as its previous request is answered.
//   - verification: every key answered `created` must be consumed exactly
//     once per subscription unless the consumer nacked it. The Verifier
//     tells lost messages from redeliveries (after a nack, or after a lease
//     that expired) and from true duplicates (a delivery after a confirmed
//     ack, two leases of one attempt, or two message ids for one key).
//   - reporting: HdrHistogram percentiles, error counts by code, the
//     per-cluster distribution, a per-second timeline (which shows the dip
//     and recovery around a Fault), and the router/baseline ratios, written
//     as report.json and report.md.
//
// cmd/loadtest is a thin main over Run; the Makefile's loadtest,
// bench-produce and bench-consume targets call it on the sandbox.
package loadtest
