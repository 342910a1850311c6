package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/deadletter"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/rebalance"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/routing"
	"github.com/shardmq/shardmq/subscription"
)

// docs/openapi.yaml is the HTTP API as a document; these tests hold it to
// the handlers: the routes of the table (routes.go) with the scopes the
// guard asks for and the query parameters each route takes, the error codes, the status
// words, and the field names of every request and answer — of the Go
// types by reflection, and of the answers the handlers build from maps by
// serving requests and reading what they write.

type oaSchema struct {
	Ref        string               `yaml:"$ref"`
	Type       string               `yaml:"type"`
	Properties map[string]*oaSchema `yaml:"properties"`
	Items      *oaSchema            `yaml:"items"`
	AllOf      []*oaSchema          `yaml:"allOf"`
	Enum       []any                `yaml:"enum"`
	Required   []string             `yaml:"required"`
}

type oaParam struct {
	Ref      string `yaml:"$ref"`
	Name     string `yaml:"name"`
	In       string `yaml:"in"`
	Required bool   `yaml:"required"`
}

type oaMedia struct {
	Schema *oaSchema `yaml:"schema"`
}

type oaResponse struct {
	Ref     string             `yaml:"$ref"`
	Content map[string]oaMedia `yaml:"content"`
}

type oaOp struct {
	Parameters  []oaParam `yaml:"parameters"`
	RequestBody *struct {
		Content map[string]oaMedia `yaml:"content"`
	} `yaml:"requestBody"`
	Responses map[string]oaResponse `yaml:"responses"`
	Scope     string                `yaml:"x-scope"`
}

type oaDoc struct {
	OpenAPI    string                          `yaml:"openapi"`
	Paths      map[string]map[string]yaml.Node `yaml:"paths"`
	Components struct {
		Schemas    map[string]*oaSchema  `yaml:"schemas"`
		Parameters map[string]oaParam    `yaml:"parameters"`
		Responses  map[string]oaResponse `yaml:"responses"`
	} `yaml:"components"`
}

// operation is one method of one path, with the path's parameters merged in.
type operation struct {
	pattern string // "POST /v1/ack", as the mux writes it
	oaOp
}

func loadOpenAPI(t *testing.T) (*oaDoc, []operation) {
	t.Helper()
	raw, err := os.ReadFile("../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc oaDoc
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q, want 3.x", doc.OpenAPI)
	}
	var ops []operation
	for path, item := range doc.Paths {
		var shared []oaParam
		if n, ok := item["parameters"]; ok {
			if err := n.Decode(&shared); err != nil {
				t.Fatalf("%s parameters: %v", path, err)
			}
		}
		for method, n := range item {
			if method == "parameters" {
				continue
			}
			var op oaOp
			if err := n.Decode(&op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			for _, p := range shared {
				op.Parameters = append(op.Parameters, p)
			}
			for i, p := range op.Parameters {
				if p.Ref != "" {
					name := strings.TrimPrefix(p.Ref, "#/components/parameters/")
					def, ok := doc.Components.Parameters[name]
					if !ok {
						t.Fatalf("%s %s: unknown parameter %s", method, path, p.Ref)
					}
					op.Parameters[i] = def
				}
			}
			ops = append(ops, operation{pattern: strings.ToUpper(method) + " " + path, oaOp: op})
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].pattern < ops[j].pattern })
	return &doc, ops
}

// servedPatterns registers every route group of the API and returns the
// patterns its mux serves.
func servedPatterns(t *testing.T) []string {
	t.Helper()
	b := &richBroker{}
	s := New(b, Limits{}, nil, nil)
	s.RouteOps(b, stubAdmin{})
	s.RouteReshard(stubResharder{})
	s.RouteUI(nil)
	s.RouteRetention(nil)
	s.RouteMetrics(http.NotFoundHandler())
	return slices.Clone(s.routes)
}

// Every route of the table is served once all the Route calls are made,
// and nothing else is.
func TestEveryRouteIsRegistered(t *testing.T) {
	t.Parallel()
	var table []string
	for _, rt := range routes {
		table = append(table, rt.pattern)
	}
	slices.Sort(table)
	served := servedPatterns(t)
	slices.Sort(served)
	if !slices.Equal(served, table) {
		t.Errorf("served %v\nthe table has %v", served, table)
	}
}

func TestOpenAPIRoutesAreTheServedRoutes(t *testing.T) {
	t.Parallel()
	_, ops := loadOpenAPI(t)
	documented := map[string]bool{}
	for _, op := range ops {
		documented[op.pattern] = true
	}
	served := map[string]bool{}
	for _, rt := range routes {
		if served[rt.pattern] {
			t.Errorf("%s is in the table twice", rt.pattern)
		}
		served[rt.pattern] = true
	}
	for p := range served {
		if !documented[p] {
			t.Errorf("%s is served but not in docs/openapi.yaml", p)
		}
	}
	for p := range documented {
		if !served[p] {
			t.Errorf("docs/openapi.yaml has %s, which the router does not serve", p)
		}
	}
}

func TestOpenAPIScopesAreTheGuardsScopes(t *testing.T) {
	t.Parallel()
	_, ops := loadOpenAPI(t)
	// The guard's own matching: the policy of a route is the one its mux
	// chooses for a request to it.
	mux := http.NewServeMux()
	guardRules(func(pattern string, pol policy) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, _ *http.Request) {
			switch {
			case pol.open:
				w.Header().Set("X-Scope", "none")
			default:
				w.Header().Set("X-Scope", string(pol.scope))
			}
		})
	})
	param := regexp.MustCompile(`\{[^}]+\}`)
	for _, op := range ops {
		method, path, _ := strings.Cut(op.pattern, " ")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(method, param.ReplaceAllString(path, "x"), nil))
		want := rec.Header().Get("X-Scope")
		if want == "" {
			want = string(auth.Admin) // a route not in the table needs admin on every topic
		}
		if got, _, _ := strings.Cut(op.Scope, " "); got != want {
			t.Errorf("%s: x-scope %q, the guard asks for %q", op.pattern, op.Scope, want)
		}
	}
}

func TestOpenAPIParametersAreTheHandlersParameters(t *testing.T) {
	t.Parallel()
	_, ops := loadOpenAPI(t)
	pathParam := regexp.MustCompile(`\{([^}]+)\}`)
	for _, op := range ops {
		var query, path []string
		for _, p := range op.Parameters {
			switch p.In {
			case "query":
				query = append(query, p.Name)
			case "path":
				path = append(path, p.Name)
				if !p.Required {
					t.Errorf("%s: path parameter %s is not required", op.pattern, p.Name)
				}
			}
		}
		var inPath []string
		for _, m := range pathParam.FindAllStringSubmatch(op.pattern, -1) {
			inPath = append(inPath, m[1])
		}
		slices.Sort(path)
		slices.Sort(inPath)
		if !slices.Equal(path, inPath) {
			t.Errorf("%s: path parameters %v, the path has %v", op.pattern, path, inPath)
		}
		rt := routeOf[op.pattern]
		if rt == nil {
			continue // TestOpenAPIRoutesAreTheServedRoutes says so
		}
		if rt.query.any {
			// Routes that take any parameter take no documented one.
			if len(query) > 0 {
				t.Errorf("%s: documents query parameters %v, the route's rule in routes.go is anyQuery", op.pattern, query)
			}
			continue
		}
		slices.Sort(query)
		want := slices.Sorted(slices.Values(rt.query.names))
		if !slices.Equal(query, want) {
			t.Errorf("%s: query parameters %v, the handler takes %v", op.pattern, query, want)
		}
	}
}

func TestOpenAPIEnumsAreTheCodesAndStatuses(t *testing.T) {
	t.Parallel()
	doc, _ := loadOpenAPI(t)
	codes := make([]string, 0, len(statusOf))
	for c := range statusOf {
		codes = append(codes, c)
	}
	cases := map[string][]string{
		"ErrorCode":     codes,
		"ProduceStatus": words(domain.ProduceCreated, domain.ProduceDuplicate, domain.ProduceConflict, domain.ProduceUnknown, domain.ProduceUnavailable, domain.ProduceRejected),
		"LeaseStatus":   words(domain.LeaseOK, domain.LeaseLost, domain.LeaseNotFound, domain.LeaseUnavailable),
		"NackStatus":    words(domain.NackRetryScheduled, domain.NackDead, domain.NackLeaseLost, domain.NackNotFound, domain.NackUnavailable),
		"MessageStatus": words(domain.MessagePending, domain.MessageConsumed, domain.MessageDead),
		"DeliveryState": words(domain.DeliveryReady, domain.DeliveryInFlight, domain.DeliveryDone, domain.DeliveryDead),
	}
	for name, want := range cases {
		s := doc.Components.Schemas[name]
		if s == nil {
			t.Errorf("schema %s missing", name)
			continue
		}
		var got []string
		for _, v := range s.Enum {
			got = append(got, fmt.Sprint(v))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: enum %v, the code has %v", name, got, want)
		}
	}
}

func words[T ~string](vs ...T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// goTypes pairs the document's object schemas with the Go types the
// handlers decode requests into or encode answers from. extra names JSON
// fields a Go type has that the schema leaves out on purpose.
var goTypes = map[string]struct {
	types []reflect.Type
	extra []string
}{
	"ProduceRequest":             {types: typesOf(produceRequest{})},
	"ProduceMessage":             {types: typesOf(produceMessage{})},
	"ProduceResult":              {types: typesOf(produceResult{})},
	"Error":                      {types: typesOf(apiError{})},
	"ClaimRequest":               {types: typesOf(claimRequest{}), extra: []string{"error_code"}}, // refused outside the dead-letter channel
	"DeadLetterClaimRequest":     {types: typesOf(claimRequest{})},
	"ClaimedMessage":             {types: typesOf(claimedMessage{})},
	"Message":                    {types: typesOf(messageBody{})},
	"AckRequest":                 {types: typesOf(ackRequest{})},
	"ExtendRequest":              {types: typesOf(extendRequest{})},
	"LeaseResult":                {types: typesOf(leaseResult{})},
	"NackRequest":                {types: typesOf(nackRequest{})},
	"NackItem":                   {types: []reflect.Type{reflect.TypeOf(nackRequest{}.Items).Elem()}},
	"NackResult":                 {types: typesOf(nackResult{})},
	"SubscriptionConfig":         {types: typesOf(subscriptionBody{})},
	"Backoff":                    {types: []reflect.Type{reflect.TypeOf(subscription.Backoff{}), reflect.TypeOf(subscriptionBody{}.Backoff).Elem()}},
	"DeadLetterAlarm":            {types: []reflect.Type{reflect.TypeOf(subscription.Alarm{}), reflect.TypeOf(subscriptionBody{}.DeadLetterAlarm).Elem()}},
	"Subscription":               {types: typesOf(subscription.Subscription{})},
	"DeadLetter":                 {types: typesOf(deadLetterJSON{})},
	"RedriveRequest":             {types: typesOf(redriveBody{})},
	"TraceResponse":              {types: typesOf(traceResponse{})},
	"MessageView":                {types: typesOf(messageView{})},
	"DeliveryView":               {types: typesOf(deliveryView{})},
	"EventView":                  {types: typesOf(eventView{})},
	"ClusterError":               {types: typesOf(lookup.ClusterError{})},
	"Source":                     {types: typesOf(lookup.Source{})},
	"ShardMapRange":              {types: typesOf(shardMapRange{})},
	"SubscriptionStats":          {types: typesOf(subscriptionStats{})},
	"ReconcileRequest":           {types: typesOf(reconcileRequest{})},
	"Finding":                    {types: typesOf(findingView{})},
	"MissingTransactionsRequest": {types: typesOf(missingTransactionsRequest{})},
	"ReshardRequest":             {types: typesOf(reshardRequest{})},
	"ReshardRange":               {types: typesOf(rebalance.Range{})},
	"ReshardMove":                {types: typesOf(rebalance.Move{})},
	"ReshardJob":                 {types: typesOf(rebalance.View{})},
	"CodeCount":                  {types: typesOf(codeCount{})},
	"DeleteDeadRequest":          {types: typesOf(deleteDeadBody{})},
	"Consumer":                   {types: typesOf(consumerJSON{})},
	"FiringAlarm":                {types: typesOf(deadletter.Alert{})},
	"QueueFlow":                  {types: typesOf(queueFlow{})},
}

func typesOf(vs ...any) []reflect.Type {
	out := make([]reflect.Type, len(vs))
	for i, v := range vs {
		out[i] = reflect.TypeOf(v)
	}
	return out
}

// jsonFields lists the JSON names of t's fields, embedded structs
// flattened, as encoding/json sees them.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, jsonFields(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// properties resolves a schema (a $ref, an allOf of parts) to its
// properties.
func properties(doc *oaDoc, s *oaSchema) map[string]*oaSchema {
	if s == nil {
		return nil
	}
	if s.Ref != "" {
		return properties(doc, doc.Components.Schemas[strings.TrimPrefix(s.Ref, "#/components/schemas/")])
	}
	out := map[string]*oaSchema{}
	for _, part := range s.AllOf {
		for k, v := range properties(doc, part) {
			out[k] = v
		}
	}
	for k, v := range s.Properties {
		out[k] = v
	}
	return out
}

func TestOpenAPIFieldsAreTheGoFields(t *testing.T) {
	t.Parallel()
	doc, _ := loadOpenAPI(t)
	for name, gt := range goTypes {
		s := doc.Components.Schemas[name]
		if s == nil {
			t.Errorf("schema %s is missing", name)
			continue
		}
		var documented []string
		for k := range properties(doc, s) {
			documented = append(documented, k)
		}
		slices.Sort(documented)
		for _, typ := range gt.types {
			var fields []string
			for _, f := range jsonFields(typ) {
				if !slices.Contains(gt.extra, f) {
					fields = append(fields, f)
				}
			}
			slices.Sort(fields)
			if !slices.Equal(documented, fields) {
				t.Errorf("schema %s has %v; %s has %v", name, documented, typ, fields)
			}
		}
	}
}

// TestOpenAPIAnswersMatchTheDocument serves a request to every route whose
// answer a handler builds from a map (and some others) and checks every
// field of the answer, nested ones too, against the operation's schema for
// that status. Together with the reflection above, every object schema of
// the document is checked.
func TestOpenAPIAnswersMatchTheDocument(t *testing.T) {
	t.Parallel()
	doc, ops := loadOpenAPI(t)
	byPattern := map[string]operation{}
	for _, op := range ops {
		byPattern[op.pattern] = op
	}
	b := &richBroker{}
	s := New(b, Limits{}, nil, nil)
	s.RouteOps(b, stubAdmin{})
	s.RouteReshard(stubResharder{})
	s.RouteUI(nil)
	rc := testReceipt(t)
	const sub = "/v1/topics/orders/subscriptions/billing"
	cases := []struct {
		pattern, target, body string
		status                int
	}{
		{"GET /healthz", "/healthz", "", 200},
		{"GET /readyz", "/readyz", "", 200},
		{"POST /v1/topics/{topic}/messages", "/v1/topics/orders/messages", `{"messages":[{"key":"k","payload":{}}]}`, 200},
		{"POST /v1/topics/{topic}/messages", "/v1/topics/orders/messages", `{"messages":[{"payload":1]}`, 400},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/claim", sub + "/claim", `{"max":2}`, 200},
		{"POST /v1/ack", "/v1/ack", `{"receipts":["` + rc + `"]}`, 200},
		{"POST /v1/nack", "/v1/nack", `{"items":[{"receipt":"` + rc + `","error_code":"E"}]}`, 200},
		{"POST /v1/extend", "/v1/extend", `{"receipts":["` + rc + `"],"visibility_timeout_ms":1000}`, 200},
		{"PUT /v1/topics/{topic}/subscriptions/{sub}", sub, `{"max_attempts":3,"backoff":{"jitter":0.1}}`, 201},
		{"GET /v1/topics/{topic}/subscriptions/{sub}", sub, "", 200},
		{"DELETE /v1/topics/{topic}/subscriptions/{sub}", sub, "", 200},
		{"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters", sub + "/dead-letters?limit=5", "", 200},
		{"DELETE /v1/topics/{topic}/subscriptions/{sub}/dead-letters", sub + "/dead-letters?error_code=E", "", 200},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/redrive", sub + "/dead-letters/redrive", `{"all":true}`, 200},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/redrive", sub + "/dead-letters/redrive", `{"all":true,"dry_run":true}`, 200},
		{"GET /v1/topics/{topic}/subscriptions/{sub}/dead-letters/codes", sub + "/dead-letters/codes", "", 200},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/delete", sub + "/dead-letters/delete", `{"ids":["7"]}`, 200},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/delete", sub + "/dead-letters/delete", `{"ids":[]}`, 400},
		{"GET /v1/topics/{topic}/subscriptions/{sub}/consumers", sub + "/consumers", "", 200},
		{"GET /v1/messages/trace", "/v1/messages/trace?key=.&topic=orders", "", 404},
		{"GET /v1/admin/queues", "/v1/admin/queues?sort=depth&limit=5", "", 200},
		{"GET /v1/admin/reshard", "/v1/admin/reshard", "", 200},
		{"POST /v1/topics/{topic}/subscriptions/{sub}/dead-letters/claim", sub + "/dead-letters/claim", `{"error_code":"E"}`, 200},
		{"GET /v1/messages/{key}/trace", "/v1/messages/k/trace?topic=orders", "", 404},
		{"GET /v1/transactions/{transaction_id}", "/v1/transactions/tx-1", "", 200},
		{"GET /v1/admin/shardmap", "/v1/admin/shardmap", "", 200},
		{"GET /v1/admin/topology", "/v1/admin/topology", "", 200},
		{"GET /v1/admin/stats", "/v1/admin/stats", "", 200},
		{"POST /v1/admin/reconcile", "/v1/admin/reconcile", `{"dry_run":true,"transaction_ids":["tx-1"]}`, 200},
		{"GET /v1/admin/reconcile", "/v1/admin/reconcile", "", 200},
		{"POST /v1/admin/reconcile/transactions", "/v1/admin/reconcile/transactions", `{"transaction_ids":["tx-1","tx-2"]}`, 200},
		{"POST /v1/admin/reshard", "/v1/admin/reshard", `{"ranges":[{"from":0,"to":3,"target":"c2"}]}`, 202},
		{"POST /v1/admin/reshard", "/v1/admin/reshard", `{"ranges":[{"from":0,"to":3,"target":"c2"}],"dry_run":true}`, 200},
		{"GET /v1/admin/reshard/{job}", "/v1/admin/reshard/j1", "", 200},
		{"POST /v1/admin/reshard/{job}/pause", "/v1/admin/reshard/j1/pause", "", 200},
		{"POST /v1/admin/reshard/{job}/resume", "/v1/admin/reshard/j1/resume", "", 200},
		{"POST /v1/admin/reshard/{job}/abort", "/v1/admin/reshard/j1/abort", "", 200},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		method, _, _ := strings.Cut(tc.pattern, " ")
		rec := do(s, method, tc.target, []byte(tc.body))
		name := fmt.Sprintf("%s %s → %d", method, tc.target, tc.status)
		if rec.Code != tc.status {
			t.Errorf("%s: got %d: %s", name, rec.Code, rec.Body)
			continue
		}
		op, ok := byPattern[tc.pattern]
		if !ok {
			t.Errorf("%s: %s is not documented", name, tc.pattern)
			continue
		}
		resp, ok := op.Responses[fmt.Sprint(tc.status)]
		if !ok {
			t.Errorf("%s: status %d is not documented", name, tc.status)
			continue
		}
		if resp.Ref != "" {
			resp = doc.Components.Responses[strings.TrimPrefix(resp.Ref, "#/components/responses/")]
		}
		media, ok := resp.Content["application/json"]
		if !ok || media.Schema == nil {
			t.Errorf("%s: no JSON schema documented", name)
			continue
		}
		var v any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		checkAnswer(t, doc, name, "", media.Schema, v, seen)
	}
	// Every object schema is checked: by the Go types, or by an answer.
	for n, sc := range doc.Components.Schemas {
		if len(sc.Enum) > 0 || sc.Type == "string" {
			continue
		}
		if _, ok := goTypes[n]; !ok && !seen[n] {
			t.Errorf("schema %s is checked neither against a Go type nor against an answer", n)
		}
	}
}

// checkAnswer walks v along schema s: every field of an object is a
// documented property (an object with free keys is documented without
// properties), every required property is there.
func checkAnswer(t *testing.T, doc *oaDoc, name, at string, s *oaSchema, v any, seen map[string]bool) {
	t.Helper()
	if s == nil || v == nil {
		return
	}
	for r := s; r != nil && r.Ref != ""; {
		ref := strings.TrimPrefix(r.Ref, "#/components/schemas/")
		seen[ref] = true
		r = doc.Components.Schemas[ref]
		if r != nil && r.Ref == "" {
			for _, part := range r.AllOf {
				if part.Ref != "" {
					seen[strings.TrimPrefix(part.Ref, "#/components/schemas/")] = true
				}
			}
			if len(r.Required) > 0 || len(r.Properties) > 0 || len(r.AllOf) > 0 || r.Items != nil {
				s = r
			}
		}
	}
	switch x := v.(type) {
	case map[string]any:
		props := properties(doc, s)
		if len(props) == 0 {
			return // an object with free keys
		}
		for k, fv := range x {
			p, ok := props[k]
			if !ok {
				t.Errorf("%s: %s%s is not in the document", name, at, k)
				continue
			}
			checkAnswer(t, doc, name, at+k+".", p, fv, seen)
		}
		for _, k := range s.Required {
			if _, ok := x[k]; !ok {
				t.Errorf("%s: required %s%s is missing", name, at, k)
			}
		}
	case []any:
		items := s.Items
		if items == nil {
			t.Errorf("%s: %s is an array, the document does not say of what", name, at)
			return
		}
		for _, e := range x {
			checkAnswer(t, doc, name, at+"[].", items, e, seen)
		}
	}
}

// richBroker answers with every field filled, so that each one is checked.
type richBroker struct{ recordingBroker }

var testMessage = &domain.Message{ID: 7, VShard: 3, Topic: "orders", Key: "k", OrderKey: "o", TransactionID: "tx-1", Priority: 1,
	Headers: []byte(`{"h":"v"}`), PayloadJSON: true, Payload: []byte(`{"a":1}`), Status: domain.MessagePending, CreatedAt: time.Unix(1, 0)}

func (b *richBroker) Produce(_ context.Context, _ string, msgs []broker.Message, _ broker.Durability) ([]broker.ProduceResult, error) {
	out := make([]broker.ProduceResult, len(msgs))
	for i, m := range msgs {
		out[i] = broker.ProduceResult{Key: m.Key, ID: uint64(i + 1), Status: domain.ProduceUnavailable, Err: fmt.Errorf("cluster c1 down")}
	}
	return out, nil
}

func (b *richBroker) Claim(_ context.Context, req broker.ClaimRequest) ([]broker.Delivery, error) {
	d := broker.Delivery{Receipt: "r"}
	d.Message, d.Attempt, d.LeaseExpires, d.ErrorCode = testMessage, 1, time.Unix(2, 0), req.ErrorCode
	return []broker.Delivery{d}, nil
}

func (b *richBroker) Ack(_ context.Context, rs []broker.Receipt) []broker.LeaseResult {
	return []broker.LeaseResult{{Status: domain.LeaseUnavailable, Err: fmt.Errorf("down")}}
}

func (b *richBroker) Nack(_ context.Context, items []broker.NackItem) []broker.NackResult {
	return []broker.NackResult{{Status: domain.NackRetryScheduled, NextAttemptAt: time.Unix(3, 0)}}
}

func (b *richBroker) Extend(_ context.Context, rs []broker.Receipt, _ time.Duration) []broker.LeaseResult {
	return []broker.LeaseResult{{Status: domain.LeaseOK, Expires: time.Unix(4, 0)}}
}

func (b *richBroker) ListDead(context.Context, string, string, string, string, int, int) (broker.DeadPage, error) {
	d := broker.DeadLetter{Message: testMessage}
	d.MessageID, d.Attempts, d.ErrorCode, d.LastError, d.DeadAt, d.InFlight = 7, 5, "E", "boom", time.Unix(5, 0), true
	return broker.DeadPage{Items: []broker.DeadLetter{d}, NextCursor: "c", Missing: []string{"c2"}}, nil
}

func (b *richBroker) Redrive(context.Context, string, string, []uint64, string) (int64, error) {
	return 2, nil
}

func (b *richBroker) DeadByCode(context.Context, string, string, []uint64, string) (broker.DeadCounts, error) {
	return broker.DeadCounts{ByCode: map[string]int64{"E": 2, "F": 1}}, nil
}

func (b *richBroker) PurgeDead(context.Context, string, string, string) (int64, error) { return 3, nil }

func (b *richBroker) DeleteDead(context.Context, string, string, []uint64) (int64, error) {
	return 1, nil
}

func (b *richBroker) Consumers(context.Context, string, string) ([]broker.Consumer, []string, error) {
	return []broker.Consumer{{Consumer: "w1", InFlight: 2, OldestLeaseAt: time.Unix(1, 0)}}, []string{"c2"}, nil
}

func (b *richBroker) ShardMap() *routing.Map {
	m, err := routing.NewMap(4, []routing.Range{{From: 0, To: 511, Cluster: "c1"}, {From: 512, To: 1023, Cluster: "c2", Frozen: true}}, nil)
	if err != nil {
		panic(err)
	}
	return m
}

func (b *richBroker) Stats(context.Context) broker.Stats {
	st := broker.Stats{Missing: []string{"c2"}}
	st.Subscriptions = oneOf(st.Subscriptions)
	q := &st.Subscriptions[0]
	q.Topic, q.Subscription, q.Ready, q.Delayed, q.InFlight, q.Parked, q.Dead = "orders", "billing", 1, 2, 3, 4, 5
	return st
}

func (b *richBroker) Transaction(context.Context, string, lookup.TxPage) (*lookup.TransactionResult, error) {
	return &lookup.TransactionResult{Messages: []lookup.Found{{Message: testMessage, Cluster: "c1"}},
		Sources:    []lookup.Source{{Cluster: "c1", ReadFrom: "primary", Endpoint: "e", Fallback: "no replica"}},
		Unanswered: []lookup.ClusterError{{Cluster: "c2", Error: "timeout"}}}, nil
}

// oneOf returns a slice of one zero element of s's element type.
func oneOf[T any](_ []T) []T { return make([]T, 1) }

type stubAdmin struct{}

func (stubAdmin) Topology(context.Context) (any, error) {
	return map[string]any{"shard_map_version": 1, "max_replica_lag_ms": 5000, "missing_clusters": []string{"c2"},
		"clusters": []any{map[string]any{"name": "c1", "vshards": 512, "state": "serving", "endpoints": []any{}}}}, nil
}

func (stubAdmin) Reconcile(context.Context, reconcile.Request) (*reconcile.Report, error) {
	return testReport(), nil
}

func (stubAdmin) LastReconcile() *reconcile.Report { return testReport() }

func (stubAdmin) MissingTransactions(context.Context, []string) (*lookup.MissingResult, error) {
	return &lookup.MissingResult{Missing: []string{"tx-2"}, Found: map[string]int{"tx-1": 1},
		Sources:    []lookup.Source{{Cluster: "c1", ReadFrom: "replica", Endpoint: "e", LagMS: 3}},
		Unanswered: []lookup.ClusterError{{Cluster: "c2", Error: "timeout"}}}, nil
}

func testReport() *reconcile.Report {
	f := domain.Finding{Kind: domain.FindingStatus, MessageID: 7, VShard: 3, Topic: "orders", Key: "k", Subscription: "s",
		Have: "pending", Want: "consumed", Repaired: true}
	return &reconcile.Report{StartedAt: time.Unix(1, 0), FinishedAt: time.Unix(2, 0), Found: map[string]int{f.Kind: 1},
		Repaired: map[string]int{f.Kind: 1}, Clusters: []reconcile.ClusterReport{
			{Cluster: "c1", ReadFrom: "replica", Endpoint: "e", Scanned: 1, Found: map[string]int{f.Kind: 1}, Repaired: map[string]int{f.Kind: 1},
				Samples: []domain.Finding{f}},
			{Cluster: "c2", Error: "unreachable", Found: map[string]int{}, Repaired: map[string]int{}},
		}}
}

type stubResharder struct{}

func testJob() *rebalance.Job {
	now := time.Unix(9, 0)
	return &rebalance.Job{ID: "j1", State: rebalance.StateCopying, Ranges: []rebalance.Range{{From: 0, To: 3, Target: "c2"}},
		StartedAt: now, FinishedAt: &now, Error: "none"}
}

func (stubResharder) Submit(_ context.Context, ranges []rebalance.Range, _ bool) (*rebalance.Job, []rebalance.Move, error) {
	return testJob(), []rebalance.Move{{Source: "c1", Target: "c2", VShards: []uint16{0, 1, 2, 3}}}, nil
}
func (stubResharder) List(context.Context) ([]*rebalance.Job, error) {
	return []*rebalance.Job{testJob()}, nil
}
func (stubResharder) Get(context.Context, string) (*rebalance.Job, error)    { return testJob(), nil }
func (stubResharder) Pause(context.Context, string) (*rebalance.Job, error)  { return testJob(), nil }
func (stubResharder) Resume(context.Context, string) (*rebalance.Job, error) { return testJob(), nil }
func (stubResharder) Abort(context.Context, string) (*rebalance.Job, error)  { return testJob(), nil }
func (stubResharder) PlanRanges(context.Context, string, string) ([]rebalance.Range, error) {
	return nil, nil
}
