package api

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// LimitsTable renders l (after WithDefaults) as the Markdown table of
// README "Limits". TestLimitsTableMatchesCode fails when the README's
// table differs from LimitsTable(Limits{}) and rewrites it with -update, so
// the documented limits are the enforced ones.
func LimitsTable(l Limits) string {
	l = l.WithDefaults()
	ms := func(d time.Duration) string { return num(d.Milliseconds()) }
	rows := [][3]string{
		{"request body", bytesText(l.MaxBody), "413 `request_too_large`"},
		{"messages per produce, receipts per ack/extend, items per nack, ids per redrive", num(int64(l.MaxBatch)), "413 `batch_too_large`"},
		{"payload (JSON text after removing insignificant whitespace, or decoded `payload_base64` bytes)", bytesText(int64(l.MaxPayload)), "413 `payload_too_large`"},
		{"headers (a map of strings), encoded as JSON", num(int64(l.MaxHeaders)) + " bytes (what their BLOB column holds)", "413 `payload_too_large`"},
		{"key, order_key, transaction_id", num(int64(l.MaxKey)) + " bytes of UTF-8 each", "400 `invalid_request`"},
		{"topic and subscription names", "`[a-zA-Z0-9._-]{1,128}`", "400 `invalid_topic` / `invalid_subscription`"},
		{"priority", "0–9 (higher first)", "400 `invalid_request`"},
		{"`delay_ms`, `deliver_at`", "0–" + ms(l.MaxDelay) + " ms (" + days(l.MaxDelay) + ") ahead; a past `deliver_at` means now", "400 `invalid_request`"},
		{"claim `max`", "1–" + num(int64(l.MaxClaim)) + " (default 1)", "400 `invalid_request`"},
		{"claim `wait_ms`", "0–" + ms(l.MaxWait), "400 `invalid_request`"},
		{"claim `max_bytes` (bytes of the messages of one answer as encoded in it: payload as JSON or base64, headers, keys, about 300 bytes of fields each; the first message always comes; also the dead-letter claim, dead-letter lists and transaction lookups)",
			"1–" + strconv.Itoa(l.MaxClaimBytes>>20) + " MiB, default " + strconv.Itoa(l.MaxClaimBytes>>20) + " MiB (`-claim-max-bytes`)", "400 `invalid_request`"},
		{"`visibility_timeout_ms` (claim, extend)", "1–" + ms(l.MaxLease) + " (" + days(l.MaxLease) + "; default " + ms(l.DefaultLease) + ")", "400 `invalid_request`"},
		{"nack `retry_after_ms`", "0–" + ms(l.MaxDelay), "400 `invalid_request`"},
		{"`error_code` (nack, dead-letter filters)", num(maxErrorCode) + " bytes", "400 `invalid_request`"},
		{"nack `error`", num(maxLastError) + " bytes; a longer one is cut at a character boundary", "—"},
		{"claim `consumer`", num(maxConsumer) + " bytes", "400 `invalid_request`"},
		{"dead-letter list `limit`; transaction lookup `limit`", "1–" + num(maxDeadPage) + " (default 100); 1–" + num(maxTransactionPage) + " (default " + num(defaultTransactionPage) + ")", "400 `invalid_request`"},
		{"queue table (`GET /v1/admin/queues`) `limit`; `filter`", "1–" + num(maxQueuesLimit) + " (default 50); 256 bytes", "400 `invalid_request`"},
		{"`transaction_ids` per reconcile question", num(maxTransactionIDs), "413 `batch_too_large`"},
		{"subscription `max_attempts`; `backoff` `initial_ms`, `max_ms`, `multiplier`, `jitter`",
			"1–1,000; 1–86,400,000; `initial_ms`–604,800,000; 1–100; 0–1", "400 `invalid_request`"},
	}
	var b strings.Builder
	b.WriteString("| limit | default | over it |\n| --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	return b.String()
}

// num writes n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	if n < 0 {
		return "-" + num(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func bytesText(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB (%s bytes)", n>>20, num(n))
	}
	return num(n) + " bytes"
}

// days writes d in whole days, hours or seconds when it is one.
func days(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	case d%time.Second == 0:
		return fmt.Sprintf("%d s", d/time.Second)
	}
	return d.String()
}
