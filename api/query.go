package api

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// queryParams names the query parameters each endpoint takes. A request to
// one of these patterns with any other parameter, a parameter given twice,
// bad percent-encoding, a ';' separator or invalid UTF-8 is answered 400
// before its handler runs; a pattern not listed here (metrics, health)
// has its query string checked for well-formedness only. Handlers can then
// read r.URL.Query() knowing nothing was dropped on the way.
var queryParams = map[string][]string{
	"POST /v1/topics/{topic}/messages":                  nil,
	"POST /v1/topics/{topic}/subscriptions/{sub}/claim": nil,
	"POST /v1/ack":    nil,
	"POST /v1/nack":   nil,
	"POST /v1/extend": nil,
	"PUT /v1/topics/{topic}/subscriptions/{sub}":                       nil,
	"GET /v1/topics/{topic}/subscriptions/{sub}":                       nil,
	"DELETE /v1/topics/{topic}/subscriptions/{sub}":                    nil,
	"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters":          {"error_code", "limit", "cursor", "max_bytes"},
	"DELETE /v1/topics/{topic}/subscriptions/{sub}/dead-letters":       {"error_code"},
	"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/redrive": nil,
	"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/claim":   nil,
	"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters/codes":    nil,
	"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/delete":  nil,
	"GET /v1/topics/{topic}/subscriptions/{sub}/consumers":             nil,
	"GET /v1/admin/queues":                  {"filter", "sort", "offset", "limit"},
	"GET /v1/admin/reshard":                 nil,
	"GET /ui":                               nil,
	"GET /ui/":                              nil,
	"GET /v1/messages/{key}/trace":          {"topic", "order_key"},
	"GET /v1/messages/trace":                {"key", "topic", "order_key"},
	"GET /v1/transactions/{transaction_id}": {"limit", "cursor", "max_bytes"},
	"POST /v1/admin/reconcile":              nil,
	"POST /v1/admin/reconcile/transactions": nil,
	"GET /v1/admin/retention":               nil,
	"POST /v1/admin/retention/run":          nil,
	"POST /v1/admin/retention/restore":      nil,
	"POST /v1/admin/retention/release":      nil,
}

// checkQuery validates r's query string for the endpoint pattern.
func checkQuery(r *http.Request, pattern string) *apiError {
	raw := r.URL.RawQuery
	allowed, known := queryParams[pattern]
	if raw == "" {
		return nil
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return fail(CodeInvalidRequest, "query string is malformed: "+strings.TrimPrefix(err.Error(), "invalid URL escape ")+
			" (use & between parameters and %XX escapes)")
	}
	for name, vs := range q {
		if !utf8.ValidString(name) {
			return fail(CodeInvalidRequest, fmt.Sprintf("query parameter name %q is not valid UTF-8", name))
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return fail(CodeInvalidRequest, fmt.Sprintf("query parameter %s is not valid UTF-8", name))
			}
		}
		if !known {
			continue
		}
		if !slices.Contains(allowed, name) {
			if len(allowed) == 0 {
				return fail(CodeInvalidRequest, fmt.Sprintf("unknown query parameter %q: this endpoint takes none", name))
			}
			return fail(CodeInvalidRequest, fmt.Sprintf("unknown query parameter %q: this endpoint takes %s", name, strings.Join(allowed, ", ")))
		}
		if len(vs) > 1 {
			return fail(CodeInvalidRequest, fmt.Sprintf("query parameter %s is given %d times", name, len(vs)))
		}
	}
	return nil
}

// queryInt reads the integer query parameter name, 1-hi, or def when it
// is absent.
func queryInt(q url.Values, name string, hi, def int) (int, *apiError) {
	if !q.Has(name) {
		return def, nil
	}
	v := q.Get(name)
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > hi {
		return 0, fail(CodeInvalidRequest, fmt.Sprintf("%s must be an integer 1-%d, got %q", name, hi, v))
	}
	return n, nil
}
