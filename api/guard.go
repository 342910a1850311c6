package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/subscription"
)

// TokenSource authenticates a bearer token (auth.Store, or an auth.Set).
type TokenSource interface {
	Lookup(secret string) (*auth.Token, error)
}

var (
	_ TokenSource = (*auth.Store)(nil)
	_ TokenSource = (*auth.Set)(nil)
)

// GuardConfig is what every request is checked against before the API
// sees it (docs/security.md).
type GuardConfig struct {
	// Tokens authenticates callers. Nil runs the API open: no token is
	// asked for (the router allows that only on a loopback address unless
	// told -insecure).
	Tokens TokenSource
	// AllowedOrigins are the browser origins ("https://ops.example.com")
	// whose requests are served, with CORS headers. A request carrying any
	// other Origin header is refused 403 origin_not_allowed. Defaults to
	// none: no browser page can drive the router.
	AllowedOrigins []string
	// AllowedHosts are the host names (without port) the Host header may
	// carry; others are refused 403 host_not_allowed (DNS rebinding).
	// Defaults to any host when Tokens is set, and to "localhost" and IP
	// literals when open — a rebound DNS name never passes.
	AllowedHosts []string
	// Metrics receives the guard's counters. Optional.
	Metrics prometheus.Registerer
	// Log defaults to the API's logger.
	Log *slog.Logger
	// Now is the clock of the rate limits. Defaults to time.Now.
	Now func() time.Time
}

// policy is what one route requires.
type policy struct {
	open  bool       // no token needed (health probes)
	scope auth.Scope // else this scope…
	// topic names the topic the scope must cover; nil means every topic
	// (only the pattern "*" covers it).
	topic func(r *http.Request) string
	// receipts: the topics are those of the receipts in the body.
	receipts bool
}

// guardRules calls add with every pattern the guard knows and the policy
// it asks for there: each route's (routes.go), and admin on every topic
// for anything else under adminPaths. A request no pattern matches is
// unlisted.
func guardRules(add func(pattern string, pol policy)) {
	for _, rt := range routes {
		add(rt.pattern, rt.access)
	}
	add(adminPaths, adminOfAll)
}

// Guard checks every request before the API serves it: the Host and
// Origin headers, the body's Content-Type, and, with tokens, the bearer
// token, its rate and its scope for the route. It adds a request id
// (X-Request-Id) that the API's logs of hidden errors carry.
type Guard struct {
	api     *Server
	cfg     GuardConfig
	log     *slog.Logger
	routes  *http.ServeMux
	origins map[string]bool
	hosts   map[string]bool
	counts  *prometheus.CounterVec
}

// CheckOrigins refuses an allowed-origins list that would let pages the
// operator did not mean drive the router: "null" (the origin of sandboxed
// frames, file: pages and some redirects — any site can make one), "*",
// and anything but scheme://host[:port] with scheme http or https.
func CheckOrigins(origins []string) error {
	for _, o := range origins {
		if strings.EqualFold(o, "null") || o == "*" {
			return fmt.Errorf("allowed origin %q: any site can send it; name the origins (https://ops.example.com)", o)
		}
		u, err := url.Parse(strings.TrimSuffix(o, "/"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("allowed origin %q is not scheme://host[:port] with scheme http or https", o)
		}
	}
	return nil
}

// Guard returns the API behind the checks of cfg.
func (s *Server) Guard(cfg GuardConfig) *Guard {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = s.log
	}
	g := &Guard{api: s, cfg: cfg, log: cfg.Log, routes: http.NewServeMux(), origins: map[string]bool{}}
	for _, o := range cfg.AllowedOrigins {
		g.origins[strings.TrimSuffix(o, "/")] = true
	}
	if len(cfg.AllowedHosts) > 0 {
		g.hosts = map[string]bool{}
		for _, h := range cfg.AllowedHosts {
			g.hosts[strings.ToLower(h)] = true
		}
	}
	guardRules(func(pattern string, pol policy) {
		g.routes.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { g.check(w, r, pol) })
	})
	g.routes.HandleFunc("/", g.unlisted)
	g.counts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardmq_http_guard_requests_total",
		Help: "Requests by the guard's verdict (allowed, unauthorized, forbidden, rate_limited, origin_not_allowed, host_not_allowed, unsupported_media_type) and token name (empty when none was recognised; bounded by the token file).",
	}, []string{"result", "token"})
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(g.counts); err != nil {
			g.log.Warn("guard metrics not registered", "err", err)
		}
	}
	return g
}

type ctxKey int

const tokenKey ctxKey = 0

// TokenFrom is the token that authenticated the request, or nil (open
// router, health probes).
func TokenFrom(ctx context.Context) *auth.Token {
	t, _ := ctx.Value(tokenKey).(*auth.Token)
	return t
}

// ServeHTTP implements http.Handler.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r, _ = withRequestID(w, r)
	if e := g.checkHost(r); e != nil {
		g.refuse(w, e, "")
		return
	}
	if g.api.tooLarge(w, r) {
		return
	}
	if _, ok := canonicalPath(r); !ok {
		// Not a route's form: a token first, as for any unknown path,
		// then the API's JSON 404 (never the mux's HTML redirect).
		g.check(w, r, policy{})
		return
	}
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(r, origin) {
		if !g.origins[origin] {
			g.refuse(w, fail(CodeOriginNotAllowed, "requests from origin "+strconv.Quote(origin)+" are not served (the router's -allowed-origins)"), "")
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", origin)
		h.Add("Vary", "Origin")
		h.Set("Access-Control-Expose-Headers", "Retry-After, X-Request-Id")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE")
			h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
			h.Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	g.routes.ServeHTTP(w, r)
}

// sameOrigin says whether origin is the router's own, as the request
// reached it: the operators' page (/ui) calling the API. Such a request
// needs no CORS headers, and passes the same token checks as any other:
// a page of another site that rebinds a DNS name to the router carries
// that name as its origin and Host, but cannot read the page's token, and
// an open router serves only localhost and IP literals (checkHost).
func sameOrigin(r *http.Request, origin string) bool {
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	return strings.EqualFold(origin, scheme+r.Host)
}

// checkHost refuses a Host header outside AllowedHosts (or, open and
// without AllowedHosts, one that is not localhost or an IP literal).
func (g *Guard) checkHost(r *http.Request) *apiError {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(host, "."), "["), "]"))
	switch {
	case g.hosts != nil:
		if g.hosts[host] {
			return nil
		}
	case g.cfg.Tokens != nil:
		return nil
	case host == "localhost" || net.ParseIP(host) != nil:
		return nil
	}
	return fail(CodeHostNotAllowed, "host "+strconv.Quote(host)+" is not served here (the router's -allowed-hosts)")
}

// checkContentType requires a request with a body to say it is JSON:
// application/json, optionally with charset=utf-8. A browser form or a
// text/plain fetch cannot send that without asking first (CORS preflight).
func checkContentType(r *http.Request) *apiError {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && mt == "application/json" {
		ok := true
		for k, v := range params {
			if k != "charset" || !strings.EqualFold(v, "utf-8") {
				ok = false
			}
		}
		if ok {
			return nil
		}
	}
	if ct == "" {
		ct = "none"
	}
	return fail(CodeUnsupportedMediaType, "a request body must be Content-Type: application/json (got "+ct+")")
}

// unlisted guards a request no policy names: a route the API serves but
// the table lacks needs admin on every topic (fail closed); anything else
// only needs a valid token before the API answers 404 or 405.
func (g *Guard) unlisted(w http.ResponseWriter, r *http.Request) {
	if _, pattern := g.api.mux.Handler(r); pattern != "" {
		g.log.Warn("route has no access policy; requiring admin", "pattern", pattern)
		g.check(w, r, policy{scope: auth.Admin})
		return
	}
	g.check(w, r, policy{})
}

// check applies pol to the request and serves it when allowed.
//
// The order of the checks: the token (401), its rate (429), the body's
// Content-Type (415), the scope (403).
func (g *Guard) check(w http.ResponseWriter, r *http.Request, pol policy) {
	if pol.open || g.cfg.Tokens == nil {
		if e := checkContentType(r); e != nil {
			g.refuse(w, e, "")
			return
		}
		g.api.ServeHTTP(w, r)
		return
	}
	tok, e := g.authenticate(r)
	if e != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="shardmq"`)
		g.refuse(w, e, "")
		return
	}
	if ok, wait := tok.Allow(g.cfg.Now()); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(auth.RetryAfterSeconds(wait)))
		g.refuse(w, fail(CodeRateLimited, "token "+tok.Name+" is over its request rate"), tok.Name)
		return
	}
	if e := checkContentType(r); e != nil {
		g.refuse(w, e, tok.Name)
		return
	}
	if pol.scope != "" {
		if pol.receipts {
			if e := g.receiptTopics(w, r, tok); e != nil {
				g.refuse(w, e, tok.Name)
				return
			}
		} else {
			topic := ""
			if pol.topic != nil {
				topic = pol.topic(r)
			}
			if !tok.Allows(pol.scope, topic) {
				g.refuse(w, forbidden(tok, pol.scope, topic), tok.Name)
				return
			}
		}
	}
	g.counts.WithLabelValues("allowed", tok.Name).Inc()
	ctx := context.WithValue(r.Context(), tokenKey, tok)
	if !tok.Allows(auth.Admin, "") {
		// Topics it creates count against its quota (-max-topics-per-token);
		// an admin of every topic is the operator and has none.
		ctx = subscription.WithCreator(ctx, tok.Name)
	}
	g.api.ServeHTTP(w, r.WithContext(ctx))
}

func forbidden(tok *auth.Token, scope auth.Scope, topic string) *apiError {
	what := "topic " + strconv.Quote(topic)
	if topic == "" {
		what = "every topic (pattern \"*\")"
	}
	return fail(CodeForbidden, "token "+tok.Name+" lacks scope "+string(scope)+" on "+what)
}

// authenticate reads the bearer token.
func (g *Guard) authenticate(r *http.Request) (*auth.Token, *apiError) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return nil, fail(CodeUnauthorized, "this endpoint needs a token: Authorization: Bearer <token>")
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(secret) == "" {
		return nil, fail(CodeUnauthorized, "the Authorization header must be: Bearer <token>")
	}
	tok, err := g.cfg.Tokens.Lookup(strings.TrimSpace(secret))
	if err != nil {
		return nil, fail(CodeUnauthorized, "the token is not valid")
	}
	return tok, nil
}

// receiptTopics checks consume on the topic of every receipt in an ack,
// nack or extend body, which it reads (bounded) and puts back for the API.
// A token with consume on every topic skips the reading.
func (g *Guard) receiptTopics(w http.ResponseWriter, r *http.Request, tok *auth.Token) *apiError {
	if tok.Allows(auth.Consume, "") {
		return nil
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.api.limits.MaxBody))
	if err != nil {
		return g.api.bodyError(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	var body struct {
		Receipts []string `json:"receipts"`
		Items    []struct {
			Receipt string `json:"receipt"`
		} `json:"items"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		return fail(CodeInvalidJSON, "request body is not valid JSON for this endpoint")
	}
	list := body.Receipts
	for _, it := range body.Items {
		list = append(list, it.Receipt)
	}
	for _, s := range list {
		rc, err := g.api.b.DecodeReceipt(s)
		if err != nil {
			continue // the API refuses the whole request
		}
		if !tok.Allows(auth.Consume, rc.Topic) {
			return forbidden(tok, auth.Consume, rc.Topic)
		}
	}
	return nil
}

func (g *Guard) refuse(w http.ResponseWriter, e *apiError, token string) {
	g.counts.WithLabelValues(e.Code, token).Inc()
	writeError(w, e)
}
