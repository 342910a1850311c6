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

// checkQuery validates r's query string for the endpoint pattern, by the
// route's queryRule (routes.go). A request with a parameter the route does
// not take, a parameter given twice, bad percent-encoding, a ';' separator
// or invalid UTF-8 is answered 400 before its handler runs; a route whose
// rule is anyQuery, or a pattern not in the table, has its query string
// checked for well-formedness only. Handlers can then read r.URL.Query()
// knowing nothing was dropped on the way.
func checkQuery(r *http.Request, pattern string) *apiError {
	raw := r.URL.RawQuery
	var allowed []string
	known := false
	if rt := routeOf[pattern]; rt != nil && !rt.query.any {
		allowed, known = rt.query.names, true
	}
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
