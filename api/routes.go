package api

import (
	"net/http"

	"github.com/shardmq/shardmq/auth"
)

// routes is every endpoint the router serves, in one table that the mux
// (register), the guard (guardRules), the query check (checkQuery) and the
// OpenAPI tests all read, so that they cannot disagree about a route.
// docs/openapi.yaml documents each one; docs/security.md shows the scopes.
//
// A route is registered by the call its group names, which gives the
// handler what it needs; the guard checks every route of the table
// whether or not it is registered (one that is not answers 404 after the
// check).
var routes = []route{
	// Probes carry no token: a load balancer has none.
	{"GET /healthz", open, anyQuery, (*Server).healthz, byNew},
	{"GET /readyz", open, anyQuery, (*Server).readyz, byNew},
	// Prometheus scrapers send a token (bearer_token_file).
	{"GET /metrics", adminOfAll, anyQuery, (*Server).scrape, byRouteMetrics},
	// The operators' page: static files with no data (docs/ui.md); what
	// it shows comes from the admin endpoints, with the token.
	{"GET /ui", open, none, (*Server).page, byRouteUI},
	{"GET /ui/", open, none, (*Server).page, byRouteUI},

	// The contract: produce, claim and the receipts' verbs (DESIGN §5).
	{"POST /v1/topics/{topic}/messages", produceOnTopic, none, (*Server).produce, byNew},
	{"POST /v1/topics/{topic}/subscriptions/{sub}/claim", consumeOnTopic, none, (*Server).claim, byNew},
	{"POST /v1/ack", consumeOnReceipts, none, (*Server).ack, byNew},
	{"POST /v1/nack", consumeOnReceipts, none, (*Server).nack, byNew},
	{"POST /v1/extend", consumeOnReceipts, none, (*Server).extend, byNew},

	// Subscriptions and their dead letters (subscriptions.go, operators.go).
	{"PUT /v1/topics/{topic}/subscriptions/{sub}", adminOnTopic, none, (*Server).putSubscription, byNew},
	{"GET /v1/topics/{topic}/subscriptions/{sub}", consumeOnTopic, none, (*Server).getSubscription, byNew},
	{"DELETE /v1/topics/{topic}/subscriptions/{sub}", adminOnTopic, none, (*Server).deleteSubscription, byNew},
	{"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters", consumeOnTopic, takes("error_code", "limit", "cursor", "max_bytes"), (*Server).listDead, byNew},
	{"DELETE /v1/topics/{topic}/subscriptions/{sub}/dead-letters", adminOnTopic, takes("error_code"), (*Server).purgeDead, byNew},
	{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/redrive", adminOnTopic, none, (*Server).redrive, byNew},
	{"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters/codes", consumeOnTopic, none, (*Server).deadCodes, byNew},
	// Acking what it leases removes dead letters: a dead-letter change.
	{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/claim", adminOnTopic, none, (*Server).claimDead, byNew},
	{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/delete", adminOnTopic, none, (*Server).deleteDead, byNew},
	{"GET /v1/topics/{topic}/subscriptions/{sub}/consumers", consumeOnTopic, none, (*Server).consumers, byNew},

	// Trace and lookup (trace.go). The key may come in the query: for keys
	// that are a path's dot segments ("." and ".."), which browsers and
	// URL libraries remove from a path before it is sent (%2E included).
	{"GET /v1/messages/{key}/trace", consumeOnQueryTopic, takes("topic", "order_key"), (*Server).traceKeyInPath, byRouteOps},
	{"GET /v1/messages/trace", consumeOnQueryTopic, takes("key", "topic", "order_key"), (*Server).traceKeyInQuery, byRouteOps},
	// The answer spans every topic.
	{"GET /v1/transactions/{transaction_id}", consumeOnAll, takes("limit", "cursor", "max_bytes"), (*Server).transaction, byRouteOps},

	// Operations: topology, shard map, stats, queues, reconciliation,
	// resharding, retention. Every method of every path under
	// /v1/admin/ needs admin on every topic (adminPaths).
	{"GET /v1/admin/topology", adminOfAll, anyQuery, (*Server).topology, byRouteOpsAdmin},
	{"POST /v1/admin/reconcile", adminOfAll, none, (*Server).reconcile, byRouteOpsAdmin},
	{"GET /v1/admin/reconcile", adminOfAll, anyQuery, (*Server).lastReconcile, byRouteOpsAdmin},
	{"POST /v1/admin/reconcile/transactions", adminOfAll, none, (*Server).missingTransactions, byRouteOpsAdmin},
	{"GET /v1/admin/shardmap", adminOfAll, anyQuery, (*Server).shardMap, byNewWithBroker},
	{"GET /v1/admin/stats", adminOfAll, anyQuery, (*Server).stats, byNewWithBroker},
	{"GET /v1/admin/queues", adminOfAll, takes("filter", "sort", "offset", "limit"), (*Server).queues, byRouteUI},
	{"POST /v1/admin/reshard", adminOfAll, anyQuery, (*Server).submitReshard, byRouteReshard},
	{"GET /v1/admin/reshard", adminOfAll, none, (*Server).listReshards, byRouteReshard},
	{"GET /v1/admin/reshard/{job}", adminOfAll, anyQuery, (*Server).getReshard, byRouteReshard},
	{"POST /v1/admin/reshard/{job}/pause", adminOfAll, anyQuery, (*Server).pauseReshard, byRouteReshard},
	{"POST /v1/admin/reshard/{job}/resume", adminOfAll, anyQuery, (*Server).resumeReshard, byRouteReshard},
	{"POST /v1/admin/reshard/{job}/abort", adminOfAll, anyQuery, (*Server).abortReshard, byRouteReshard},
	{"GET /v1/admin/retention", adminOfAll, none, (*Server).retentionStatus, byRouteRetention},
	{"POST /v1/admin/retention/run", adminOfAll, none, (*Server).runRetention, byRouteRetention},
	{"POST /v1/admin/retention/restore", adminOfAll, none, (*Server).restoreMonth, byRouteRetention},
	{"POST /v1/admin/retention/release", adminOfAll, none, (*Server).releaseMonth, byRouteRetention},
}

// adminPaths is the guard's fence around the operations: any method of any
// path under it, a route of the table or not, needs admin on every topic,
// so that only an admin learns which admin paths exist (404, 405).
const adminPaths = "/v1/admin/"

// route is one endpoint of the API.
type route struct {
	pattern string    // method and path, as http.ServeMux reads them
	access  policy    // what the guard asks of the token
	query   queryRule // the query parameters it takes
	serve   func(*Server, http.ResponseWriter, *http.Request)
	group   group // the call that registers it
}

// group names the call that registers a route: it is the one that gives
// the Server what the route's handler needs.
type group int

const (
	byNew            group = iota // New
	byNewWithBroker               // New, when given a broker
	byRouteOps                    // RouteOps (a Tracer)
	byRouteOpsAdmin               // RouteOps, when given an Admin
	byRouteReshard                // RouteReshard
	byRouteUI                     // RouteUI
	byRouteRetention              // RouteRetention
	byRouteMetrics                // RouteMetrics
)

// The policies of the table (guard.go applies them).
var (
	open                = policy{open: true}
	produceOnTopic      = policy{scope: auth.Produce, topic: pathTopic}
	consumeOnTopic      = policy{scope: auth.Consume, topic: pathTopic}
	adminOnTopic        = policy{scope: auth.Admin, topic: pathTopic}
	consumeOnQueryTopic = policy{scope: auth.Consume, topic: queryTopic}
	consumeOnReceipts   = policy{scope: auth.Consume, receipts: true}
	consumeOnAll        = policy{scope: auth.Consume}
	adminOfAll          = policy{scope: auth.Admin}
)

func pathTopic(r *http.Request) string  { return r.PathValue("topic") }
func queryTopic(r *http.Request) string { return r.URL.Query().Get("topic") }

// queryRule is the query parameters a route takes (checkQuery).
type queryRule struct {
	names []string
	// any: the query string is checked for well-formedness only, and
	// every parameter passes.
	any bool
}

var (
	none     = queryRule{}          // no parameter at all
	anyQuery = queryRule{any: true} // whatever parameters, well-formed
)

// takes is a route's rule when it takes exactly these parameters, each
// at most once.
func takes(names ...string) queryRule { return queryRule{names: names} }

// routeOf finds a route of the table by its pattern.
var routeOf = func() map[string]*route {
	m := make(map[string]*route, len(routes))
	for i := range routes {
		m[routes[i].pattern] = &routes[i]
	}
	return m
}()

// register serves every route of group g on s's mux.
func (s *Server) register(g group) {
	for i := range routes {
		rt := &routes[i]
		if rt.group == g {
			s.handle(rt.pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rt.serve(s, w, r) }))
		}
	}
}

// handle serves h at pattern on s's mux.
func (s *Server) handle(pattern string, h http.Handler) {
	s.routes = append(s.routes, pattern)
	s.mux.Handle(pattern, h)
}
