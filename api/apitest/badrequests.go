// Package apitest holds what tests of the HTTP API share across packages:
// the table of requests that must be refused whole.
package apitest

import (
	"fmt"
	"math"
	"strings"

	"github.com/shardmq/shardmq/domain"
)

// HeadersOf returns a headers object whose JSON encoding is n bytes.
func HeadersOf(n int) string {
	return `{"h":"` + strings.Repeat("x", n-len(`{"h":""}`)) + `"}`
}

// BadRequest is one request the API must refuse whole.
type BadRequest struct {
	Name, Method, Target, Body string
	Status                     int
	Code, Says                 string // Says: a part of the error message
}

// BadRequests is every kind of request the API must refuse whole, for
// topic "orders" (subscriptions "default" and "billing"): each answers 4xx
// in the JSON error shape and never reaches the broker (api's tests) and
// writes no row (server's tests, against real MariaDB). receipt is a
// well-formed receipt for orders/default.
func BadRequests(receipt string) []BadRequest {
	const produce = "/v1/topics/orders/messages"
	const claim = "/v1/topics/orders/subscriptions/default/claim"
	const sub = "/v1/topics/orders/subscriptions/billing"
	const dead = "/v1/topics/orders/subscriptions/default/dead-letters"
	one := func(fields string) string { return `{"messages":[{"payload":{"a":1}` + fields + `}]}` }
	rc := `"` + receipt + `"`
	maxI64 := fmt.Sprint(int64(math.MaxInt64))
	return []BadRequest{
		// invalid UTF-8 and lone surrogates, anywhere
		{"key invalid UTF-8", "POST", produce, one(`,"key":"coll` + "\xff" + `"`), 400, "invalid_request", "messages[0].key: string is not valid UTF-8"},
		{"order_key invalid UTF-8", "POST", produce, one(`,"order_key":"o` + "\xfe" + `"`), 400, "invalid_request", "messages[0].order_key"},
		{"transaction_id invalid UTF-8", "POST", produce, one(`,"transaction_id":"` + "\xc3\x28" + `"`), 400, "invalid_request", "messages[0].transaction_id"},
		{"header name invalid UTF-8", "POST", produce, one(`,"headers":{"a` + "\xff" + `":"v"}`), 400, "invalid_request", "object key"},
		{"header value invalid UTF-8", "POST", produce, one(`,"headers":{"a":"` + "\xed\xa0\x80" + `"}`), 400, "invalid_request", "messages[0].headers.a"},
		{"payload string invalid UTF-8", "POST", produce, `{"messages":[{"payload":{"s":"` + "\x80" + `"}}]}`, 400, "invalid_request", "messages[0].payload.s"},
		{"payload key invalid UTF-8", "POST", produce, `{"messages":[{"payload":{"` + "\xf8" + `":1}}]}`, 400, "invalid_request", "not valid UTF-8"},
		{"key lone surrogate", "POST", produce, one(`,"key":"coll\udcff"`), 400, "invalid_request", "lone surrogate"},
		{"key high surrogate alone", "POST", produce, one(`,"key":"coll\ud800x"`), 400, "invalid_request", "lone surrogate"},
		{"UTF-8 outside strings", "POST", produce, "\xff" + one(""), 400, "invalid_request", "UTF-8"},
		{"claim consumer invalid UTF-8", "POST", claim, `{"consumer":"w` + "\xff" + `"}`, 400, "invalid_request", "consumer"},
		{"ack receipt invalid UTF-8", "POST", "/v1/ack", `{"receipts":["` + "\xff" + `"]}`, 400, "invalid_request", "receipts[0]"},
		{"nack error invalid UTF-8", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"error":"` + "\xff" + `"}]}`, 400, "invalid_request", "items[0].error"},
		{"subscription invalid UTF-8", "PUT", sub, `{"dead_letter_alarm":{"window":"1h` + "\xff" + `"}}`, 400, "invalid_request", "dead_letter_alarm.window"},
		{"redrive invalid UTF-8", "POST", dead + "/redrive", `{"error_code":"E` + "\xff" + `"}`, 400, "invalid_request", "error_code"},
		// unknown fields
		{"produce unknown top field", "POST", produce, `{"messages":[{"payload":1}],"durabilty":"replicated"}`, 400, "invalid_request", `unknown field "durabilty"`},
		{"produce unknown message field", "POST", produce, one(`,"prio":3`), 400, "invalid_request", `unknown field "prio"`},
		{"claim unknown field", "POST", claim, `{"maxx":5}`, 400, "invalid_request", `unknown field "maxx"`},
		{"ack unknown field", "POST", "/v1/ack", `{"receipts":[` + rc + `],"reciepts":[]}`, 400, "invalid_request", `unknown field "reciepts"`},
		{"nack unknown item field", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after":5}]}`, 400, "invalid_request", `unknown field "retry_after"`},
		{"extend unknown field", "POST", "/v1/extend", `{"receipts":[` + rc + `],"visibility_ms":5}`, 400, "invalid_request", `unknown field "visibility_ms"`},
		{"subscription unknown field", "PUT", sub, `{"max_attemps":1}`, 400, "invalid_request", `unknown field "max_attemps"`},
		{"subscription unknown backoff field", "PUT", sub, `{"backoff":{"initial":5}}`, 400, "invalid_request", `unknown field "initial"`},
		{"redrive unknown field", "POST", dead + "/redrive", `{"al":true}`, 400, "invalid_request", `unknown field "al"`},
		{"dead claim unknown field", "POST", dead + "/claim", `{"errorcode":"E"}`, 400, "invalid_request", `unknown field "errorcode"`},
		// field names match exactly: case and Unicode folding are not the same name
		{"produce key in two cases", "POST", produce, one(`,"key":"a","KEY":"b"`), 400, "invalid_request", `messages[0]: unknown field "KEY"`},
		{"produce Messages capitalised", "POST", produce, `{"Messages":[{"payload":1}]}`, 400, "invalid_request", `unknown field "Messages"`},
		{"produce key with a Kelvin sign", "POST", produce, one(`,"\u212aey":"b"`), 400, "invalid_request", `unknown field "Key"`},
		{"produce Payload capitalised", "POST", produce, `{"messages":[{"Payload":1}]}`, 400, "invalid_request", `unknown field "Payload"`},
		{"claim Max capitalised", "POST", claim, `{"Max":5}`, 400, "invalid_request", `unknown field "Max"`},
		{"nack item Receipt capitalised", "POST", "/v1/nack", `{"items":[{"Receipt":` + rc + `}]}`, 400, "invalid_request", `items[0]: unknown field "Receipt"`},
		{"subscription backoff field in capitals", "PUT", sub, `{"backoff":{"INITIAL_MS":5}}`, 400, "invalid_request", `backoff: unknown field "INITIAL_MS"`},
		// misplaced fields: known elsewhere, not here
		{"ack with visibility_timeout_ms", "POST", "/v1/ack", `{"receipts":[` + rc + `],"visibility_timeout_ms":5000}`, 400, "invalid_request", `unknown field "visibility_timeout_ms"`},
		{"produce with max", "POST", produce, `{"messages":[{"payload":1}],"max":5}`, 400, "invalid_request", `unknown field "max"`},
		// duplicate keys, at every depth
		{"produce duplicate top key", "POST", produce, `{"messages":[{"payload":1}],"messages":[{"payload":2}]}`, 400, "invalid_request", `duplicate object key "messages"`},
		{"produce duplicate message key", "POST", produce, one(`,"key":"a","key":"b"`), 400, "invalid_request", `messages[0]: duplicate object key "key"`},
		{"produce duplicate escaped key", "POST", produce, one(`,"key":"a","\u006bey":"b"`), 400, "invalid_request", `duplicate object key "key"`},
		{"produce duplicate header", "POST", produce, one(`,"headers":{"a":"1","a":"2"}`), 400, "invalid_request", `messages[0].headers: duplicate object key "a"`},
		{"produce duplicate in payload", "POST", produce, `{"messages":[{"payload":{"x":[{"a":1,"b":2,"a":3}]}}]}`, 400, "invalid_request", `messages[0].payload.x[0]: duplicate object key "a"`},
		{"claim duplicate key", "POST", claim, `{"max":1,"max":1000}`, 400, "invalid_request", `duplicate object key "max"`},
		{"nack duplicate key", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"receipt":` + rc + `}]}`, 400, "invalid_request", `items[0]: duplicate object key "receipt"`},
		{"subscription duplicate key", "PUT", sub, `{"max_attempts":3,"max_attempts":1}`, 400, "invalid_request", `duplicate object key "max_attempts"`},
		{"redrive duplicate key", "POST", dead + "/redrive", `{"all":true,"all":false}`, 400, "invalid_request", `duplicate object key "all"`},
		// numbers: range-checked before any arithmetic; no floats, strings or overflow
		{"delay_ms max int64", "POST", produce, one(`,"delay_ms":` + maxI64), 400, "invalid_request", "messages[0].delay_ms must be 0-"},
		{"delay_ms just past int64/1e6", "POST", produce, one(`,"delay_ms":9223372036855`), 400, "invalid_request", "delay_ms must be"},
		{"delay_ms over int64", "POST", produce, one(`,"delay_ms":9223372036854775808`), 400, "invalid_request", "delay_ms must be an integer"},
		{"delay_ms negative", "POST", produce, one(`,"delay_ms":-1`), 400, "invalid_request", "delay_ms must be"},
		{"delay_ms float", "POST", produce, one(`,"delay_ms":1.5`), 400, "invalid_request", "delay_ms must be an integer"},
		{"delay_ms exponent", "POST", produce, one(`,"delay_ms":1e3`), 400, "invalid_request", "delay_ms must be an integer"},
		{"delay_ms string", "POST", produce, one(`,"delay_ms":"5"`), 400, "invalid_request", "delay_ms must be an integer"},
		{"priority 10", "POST", produce, one(`,"priority":10`), 400, "invalid_request", "priority must be 0-9"},
		{"priority huge", "POST", produce, one(`,"priority":1e400`), 400, "invalid_request", "priority"},
		{"priority negative", "POST", produce, one(`,"priority":-1`), 400, "invalid_request", "priority must be 0-9"},
		{"deliver_at past year 9999", "POST", produce, one(`,"deliver_at":"9999-12-31T23:59:59Z"`), 400, "invalid_request", "deliver_at is more than"},
		{"visibility max int64", "POST", claim, `{"visibility_timeout_ms":` + maxI64 + `}`, 400, "invalid_request", "visibility_timeout_ms must be 1-"},
		{"visibility wraps to small", "POST", claim, `{"visibility_timeout_ms":9223372036854776}`, 400, "invalid_request", "visibility_timeout_ms must be 1-"},
		{"visibility zero", "POST", claim, `{"visibility_timeout_ms":0}`, 400, "invalid_request", "visibility_timeout_ms must be 1-"},
		{"wait_ms max int64", "POST", claim, `{"wait_ms":` + maxI64 + `}`, 400, "invalid_request", "wait_ms must be 0-"},
		{"wait_ms negative", "POST", claim, `{"wait_ms":-1}`, 400, "invalid_request", "wait_ms must be 0-"},
		{"max float", "POST", claim, `{"max":2.5}`, 400, "invalid_request", "max must be an integer"},
		{"max zero", "POST", claim, `{"max":0}`, 400, "invalid_request", "max must be 1-"},
		{"max huge", "POST", claim, `{"max":9223372036854775807}`, 400, "invalid_request", "max must be 1-"},
		{"extend visibility max int64", "POST", "/v1/extend", `{"receipts":[` + rc + `],"visibility_timeout_ms":` + maxI64 + `}`, 400, "invalid_request", "visibility_timeout_ms must be 1-"},
		{"nack retry_after max int64", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after_ms":` + maxI64 + `}]}`, 400, "invalid_request", "items[0].retry_after_ms must be 0-"},
		{"nack retry_after negative", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"retry_after_ms":-5}]}`, 400, "invalid_request", "retry_after_ms must be 0-"},
		{"backoff initial max int64", "PUT", sub, `{"backoff":{"initial_ms":` + maxI64 + `}}`, 400, "invalid_request", "backoff.initial_ms"},
		{"backoff multiplier huge", "PUT", sub, `{"backoff":{"multiplier":1e400}}`, 400, "invalid_request", "backoff.multiplier"},
		{"backoff jitter over 1", "PUT", sub, `{"backoff":{"jitter":1.5}}`, 400, "invalid_request", "backoff.jitter"},
		{"max_attempts float", "PUT", sub, `{"max_attempts":2.5}`, 400, "invalid_request", "max_attempts must be an integer"},
		{"max_attempts huge", "PUT", sub, `{"max_attempts":100000}`, 400, "invalid_request", "max_attempts must be 1-"},
		// sizes that a column could not hold
		{"headers one byte over the column", "POST", produce, one(`,"headers":` + HeadersOf(domain.MaxHeadersBytes+1)), 413, "payload_too_large", "at most 65535"},
		{"key over the column", "POST", produce, one(`,"key":"` + strings.Repeat("k", domain.MaxKeyBytes+1) + `"`), 400, "invalid_request", "key is 257 bytes"},
		{"error_code over the column", "POST", "/v1/nack", `{"items":[{"receipt":` + rc + `,"error_code":"` + strings.Repeat("E", 65) + `"}]}`, 400, "invalid_request", "error_code is longer than 64"},
		{"consumer over the column", "POST", claim, `{"consumer":"` + strings.Repeat("c", 129) + `"}`, 400, "invalid_request", "consumer is longer than 128"},
		// query strings
		{"limit with semicolon", "GET", dead + "?limit=1;DROP", "", 400, "invalid_request", "query string is malformed"},
		{"limit not a number", "GET", dead + "?limit=abc", "", 400, "invalid_request", `limit must be an integer 1-1000, got "abc"`},
		{"limit negative", "GET", dead + "?limit=-1", "", 400, "invalid_request", "limit must be"},
		{"limit huge", "GET", dead + "?limit=99999999999999999999", "", 400, "invalid_request", "limit must be"},
		{"limit empty", "GET", dead + "?limit=", "", 400, "invalid_request", "limit must be"},
		{"limit twice", "GET", dead + "?limit=1&limit=2", "", 400, "invalid_request", "given 2 times"},
		{"bad percent-encoding in query", "GET", dead + "?error_code=%zz", "", 400, "invalid_request", "query string is malformed"},
		{"invalid UTF-8 in query", "GET", dead + "?error_code=%ff", "", 400, "invalid_request", "not valid UTF-8"},
		{"unknown query parameter", "GET", dead + "?limt=5", "", 400, "invalid_request", `unknown query parameter "limt"`},
		{"query on produce", "POST", produce + "?durability=replicated", one(""), 400, "invalid_request", `unknown query parameter "durability"`},
		{"purge with bad query", "DELETE", dead + "?error_code=E&x=1", "", 400, "invalid_request", `unknown query parameter "x"`},
		{"trace topic bad escape", "GET", "/v1/messages/k/trace?topic=%zz", "", 400, "invalid_request", "query string is malformed"},
		// routing
		{"unknown path", "GET", "/v1/nothing-here", "", 404, "not_found", "no such endpoint"},
		{"wrong method", "GET", "/v1/ack", "", 405, "method_not_allowed", "GET is not allowed"},
	}
}
