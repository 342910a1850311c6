// Package consuldouble serves an in-process double of the parts of Consul's
// HTTP API that shardmq relies on, so that the default test suite exercises
// the real github.com/hashicorp/consul/api client without a Consul agent.
//
// What it keeps of Consul's semantics:
//
//   - one Raft-like index that every write raises; KV entries carry
//     CreateIndex, ModifyIndex, LockIndex, Flags and Session;
//   - KV get (single, ?recurse, ?keys with ?separator, ?raw), put with
//     ?cas=, ?flags=, ?acquire= and ?release=, delete with ?cas= and
//     ?recurse; the index of a missing key or an empty prefix is the KV
//     table's index, as in Consul;
//   - blocking queries (?index= and ?wait=, default 5m, at most 10m) on KV,
//     sessions and health: they return as soon as the result's index
//     passes the one given, or when the wait ends, with X-Consul-Index;
//   - sessions with TTL (renew, expiry), behavior release or delete, and
//     lock-delay (default 15s) applied to the keys of a session that is
//     invalidated (destroyed or expired), not to a key released by ?release;
//   - services registered through the agent (/v1/agent/service/register,
//     on the double's own node) or the catalog (/v1/catalog/register, any
//     node), checks set through /v1/agent/check/{pass,warn,fail,update} or
//     catalog registration, and /v1/health/service/<name> with ?passing and
//     ?tag=, node checks included.
//
// Errors are answered as the agent answers them (status and plain-text
// body without a trailing newline, checked against Consul 1.20): an
// acquire with a destroyed or unknown session is 500 `raft apply failed:
// invalid session "<id>"`, a renewal of one is 404 `Session id '<id>' not
// found`, a malformed ?cas= or ?flags= is 500 with Go's ParseUint error,
// an invalid Behavior is 500, an unknown check is 404 `Unknown check ID`.
// Wipe stands for an agent restarted without its data.
//
// Deliberate differences: session TTLs below Consul's 10s minimum are
// accepted unless Options.MinSessionTTL is set (tests use short ones), a session expires TTL×Options.TTLMultiplier
// after its last renewal (Consul waits 2×TTL; the default here is 1×),
// checks never run on their own (tests flip them), and ACLs, datacenters,
// namespaces, ?filter= and ?stale/?consistent are ignored.
package consuldouble

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// Options tune the double. Zero fields take the defaults named.
type Options struct {
	// Node is the name of the agent's own node, where services registered
	// through /v1/agent live and sessions are created. Defaults to
	// "consuldouble".
	Node string
	// TTLMultiplier scales a session's TTL into the time after its last
	// renewal at which it is invalidated. Defaults to 1; real Consul uses 2.
	TTLMultiplier float64
	// MinSessionTTL is the shortest session TTL accepted; a shorter one
	// is refused with the agent's 500 "Invalid Session TTL". Defaults to
	// none (tests use short TTLs); real Consul's is 10s.
	MinSessionTTL time.Duration
}

// Server is a running double. Its methods are safe for concurrent use.
type Server struct {
	opts Options
	http *httptest.Server

	mu      sync.Mutex
	index   uint64        // the last index handed out
	changed chan struct{} // closed and replaced on every write
	down    bool

	kv       map[string]*api.KVPair
	tombs    map[string]uint64 // deleted key → index of the deletion
	kvIndex  uint64
	delays   map[string]time.Time // key → end of its lock-delay
	sessions map[string]*session
	sesIndex uint64
	nodes    map[string]*api.Node
	services map[string]*api.AgentService // node + "\x00" + service ID
	checks   map[string]*api.HealthCheck  // node + "\x00" + check ID
	hIndex   uint64                       // catalog and health index
	closed   bool
}

type session struct {
	entry   api.SessionEntry
	ttl     time.Duration
	timer   *time.Timer
	renewed time.Time
}

// New starts a double on a loopback port. Close it when done.
func New(opts Options) *Server {
	return NewOn(opts, nil)
}

// NewOn starts a double that serves on ln (a loopback port when nil): a
// listener made elsewhere, such as inside a test host's network
// namespace (internal/netbed). Close it when done.
func NewOn(opts Options, ln net.Listener) *Server {
	if opts.Node == "" {
		opts.Node = "consuldouble"
	}
	if opts.TTLMultiplier <= 0 {
		opts.TTLMultiplier = 1
	}
	s := &Server{
		opts:     opts,
		changed:  make(chan struct{}),
		kv:       map[string]*api.KVPair{},
		tombs:    map[string]uint64{},
		delays:   map[string]time.Time{},
		sessions: map[string]*session{},
		nodes:    map[string]*api.Node{},
		services: map[string]*api.AgentService{},
		checks:   map[string]*api.HealthCheck{},
	}
	s.index = 1
	s.nodes[opts.Node] = &api.Node{ID: newID(), Node: opts.Node, Address: "127.0.0.1", Datacenter: "dc1", CreateIndex: 1, ModifyIndex: 1}
	s.http = httptest.NewUnstartedServer(s.routes())
	if ln != nil {
		s.http.Listener.Close()
		s.http.Listener = ln
	}
	s.http.Start()
	return s
}

// URL is the double's base URL, "http://127.0.0.1:PORT".
func (s *Server) URL() string { return s.http.URL }

// Addr is the double's "127.0.0.1:PORT", as api.Config.Address takes it.
func (s *Server) Addr() string { return strings.TrimPrefix(s.http.URL, "http://") }

// Close stops the server and every session timer.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, se := range s.sessions {
		se.timer.Stop()
	}
	s.wakeLocked()
	s.mu.Unlock()
	s.http.CloseClientConnections()
	s.http.Close()
}

// SetDown makes every request fail with 500, as an agent cut off from its
// servers answers, while down is true; blocked queries return at once with
// the error. Sessions keep expiring meanwhile, as they do on the servers.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
	s.wakeLocked()
}

// Wipe makes the double an agent restarted without its data (a -dev
// agent, or a server whose data directory was lost): KV, sessions,
// lock-delays and the catalog (but the agent's own node) are gone and the
// index starts again from a low number. Connections are cut, as a restart
// cuts them, so that blocked queries return with an error and clients
// start again from index 0.
func (s *Server) Wipe() {
	s.mu.Lock()
	for _, se := range s.sessions {
		se.timer.Stop()
	}
	own := s.nodes[s.opts.Node]
	s.kv, s.tombs, s.delays = map[string]*api.KVPair{}, map[string]uint64{}, map[string]time.Time{}
	s.sessions = map[string]*session{}
	s.nodes = map[string]*api.Node{s.opts.Node: own}
	s.services, s.checks = map[string]*api.AgentService{}, map[string]*api.HealthCheck{}
	s.index, s.kvIndex, s.sesIndex, s.hIndex = 1, 0, 0, 0
	own.CreateIndex, own.ModifyIndex = 1, 1
	s.wakeLocked()
	s.mu.Unlock()
	s.http.CloseClientConnections()
}

// Index returns the current index.
func (s *Server) Index() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index
}

// nextLocked raises the index for a write and wakes blocked queries.
func (s *Server) nextLocked() uint64 {
	s.index++
	s.wakeLocked()
	return s.index
}

func (s *Server) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/kv/{key...}", s.kvGet)
	mux.HandleFunc("PUT /v1/kv/{key...}", s.kvPut)
	mux.HandleFunc("DELETE /v1/kv/{key...}", s.kvDelete)
	mux.HandleFunc("PUT /v1/session/create", s.sessionCreate)
	mux.HandleFunc("PUT /v1/session/destroy/{id}", s.sessionDestroy)
	mux.HandleFunc("PUT /v1/session/renew/{id}", s.sessionRenew)
	mux.HandleFunc("GET /v1/session/info/{id}", s.sessionInfo)
	mux.HandleFunc("GET /v1/session/list", s.sessionList)
	mux.HandleFunc("PUT /v1/agent/service/register", s.agentServiceRegister)
	mux.HandleFunc("PUT /v1/agent/service/deregister/{id}", s.agentServiceDeregister)
	mux.HandleFunc("PUT /v1/agent/check/pass/{id}", s.agentCheckTTL(api.HealthPassing))
	mux.HandleFunc("PUT /v1/agent/check/warn/{id}", s.agentCheckTTL(api.HealthWarning))
	mux.HandleFunc("PUT /v1/agent/check/fail/{id}", s.agentCheckTTL(api.HealthCritical))
	mux.HandleFunc("PUT /v1/agent/check/update/{id}", s.agentCheckUpdate)
	mux.HandleFunc("PUT /v1/catalog/register", s.catalogRegister)
	mux.HandleFunc("PUT /v1/catalog/deregister", s.catalogDeregister)
	mux.HandleFunc("GET /v1/health/service/{name}", s.healthService)
	mux.HandleFunc("GET /v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		s.write(w, r, func() (any, int, error) { return s.Addr(), http.StatusOK, nil })
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		down := s.down
		s.mu.Unlock()
		if down {
			consulError(w, http.StatusInternalServerError, "No cluster leader")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// response is one query's answer, built under the lock.
type response struct {
	index  uint64
	status int
	body   []byte
	ctype  string
}

func jsonResponse(index uint64, v any) response {
	data, err := json.Marshal(v)
	if err != nil {
		return response{status: http.StatusInternalServerError, body: []byte(err.Error())}
	}
	return response{index: index, status: http.StatusOK, body: data, ctype: "application/json"}
}

// query answers a read, blocking as Consul does when ?index= is given:
// until the result's index passes it, the wait ends (default 5m, at most
// 10m), or the client goes away.
func (s *Server) query(w http.ResponseWriter, r *http.Request, run func() response) {
	q := r.URL.Query()
	var min uint64
	if v := q.Get("index"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			consulError(w, http.StatusBadRequest, "Invalid index")
			return
		}
		min = n
	}
	wait := 5 * time.Minute
	if v := q.Get("wait"); v != "" {
		d, err := parseWait(v)
		if err != nil {
			consulError(w, http.StatusBadRequest, "Invalid wait time")
			return
		}
		wait = min2(d, 10*time.Minute)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	expired := false
	for {
		s.mu.Lock()
		if s.down || s.closed {
			s.mu.Unlock()
			consulError(w, http.StatusInternalServerError, "No cluster leader")
			return
		}
		resp := run()
		changed := s.changed
		s.mu.Unlock()
		if resp.index < 1 {
			resp.index = 1
		}
		if min == 0 || resp.index > min || expired {
			h := w.Header()
			h.Set("X-Consul-Index", strconv.FormatUint(resp.index, 10))
			h.Set("X-Consul-KnownLeader", "true")
			h.Set("X-Consul-LastContact", "0")
			if resp.ctype != "" {
				h.Set("Content-Type", resp.ctype)
			}
			w.WriteHeader(resp.status)
			w.Write(resp.body)
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			expired = true
		case <-r.Context().Done():
			return
		}
	}
}

// parseWait reads Consul's wait parameter: a Go duration, or a number of
// seconds.
func parseWait(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}

func min2(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// write answers a write: fn runs under the lock and returns the JSON body.
func (s *Server) write(w http.ResponseWriter, r *http.Request, fn func() (any, int, error)) {
	s.mu.Lock()
	out, status, err := fn()
	s.mu.Unlock()
	if err != nil {
		if status == 0 {
			status = http.StatusInternalServerError
		}
		consulError(w, status, err.Error())
		return
	}
	if status == 0 {
		status = http.StatusOK
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", strconv.FormatUint(s.Index(), 10))
	w.WriteHeader(status)
	if out != nil {
		json.NewEncoder(w).Encode(out)
	}
}

// consulError answers an error as the agent does: the status, and the
// message as plain text without a trailing newline.
func consulError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, msg)
}

func has(r *http.Request, param string) bool {
	_, ok := r.URL.Query()[param]
	return ok
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ---- KV ----

func copyPair(p *api.KVPair) *api.KVPair {
	c := *p
	c.Value = append([]byte(nil), p.Value...)
	if len(p.Value) == 0 {
		c.Value = nil
	}
	return &c
}

// prefixIndexLocked is the index of a prefix listing: the highest
// ModifyIndex under it, deletions included, or the KV table's index when
// nothing ever lived there.
func (s *Server) prefixIndexLocked(prefix string) uint64 {
	var idx uint64
	for k, p := range s.kv {
		if strings.HasPrefix(k, prefix) && p.ModifyIndex > idx {
			idx = p.ModifyIndex
		}
	}
	for k, i := range s.tombs {
		if strings.HasPrefix(k, prefix) && i > idx {
			idx = i
		}
	}
	if idx == 0 {
		idx = s.kvIndex
	}
	return idx
}

func (s *Server) kvGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	switch {
	case has(r, "keys"):
		sep := r.URL.Query().Get("separator")
		s.query(w, r, func() response {
			seen := map[string]bool{}
			var keys []string
			for k := range s.kv {
				if !strings.HasPrefix(k, key) {
					continue
				}
				if sep != "" {
					if i := strings.Index(k[len(key):], sep); i >= 0 {
						k = k[:len(key)+i+len(sep)]
					}
				}
				if !seen[k] {
					seen[k] = true
					keys = append(keys, k)
				}
			}
			idx := s.prefixIndexLocked(key)
			if len(keys) == 0 {
				return response{index: idx, status: http.StatusNotFound}
			}
			sort.Strings(keys)
			return jsonResponse(idx, keys)
		})
	case has(r, "recurse"):
		s.query(w, r, func() response {
			var out []*api.KVPair
			for k, p := range s.kv {
				if strings.HasPrefix(k, key) {
					out = append(out, copyPair(p))
				}
			}
			idx := s.prefixIndexLocked(key)
			if len(out) == 0 {
				return response{index: idx, status: http.StatusNotFound}
			}
			sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
			return jsonResponse(idx, out)
		})
	default:
		raw := has(r, "raw")
		s.query(w, r, func() response {
			p, ok := s.kv[key]
			if !ok {
				return response{index: s.kvIndex, status: http.StatusNotFound}
			}
			if raw {
				return response{index: p.ModifyIndex, status: http.StatusOK, body: append([]byte(nil), p.Value...), ctype: "application/octet-stream"}
			}
			return jsonResponse(p.ModifyIndex, []*api.KVPair{copyPair(p)})
		})
	}
}

func (s *Server) kvPut(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" {
		consulError(w, http.StatusBadRequest, "Missing key name")
		return
	}
	value, err := io.ReadAll(r.Body)
	if err != nil {
		consulError(w, http.StatusBadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	var flags uint64
	if v := q.Get("flags"); v != "" {
		if flags, err = strconv.ParseUint(v, 10, 64); err != nil {
			consulError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	var cas *uint64
	if v := q.Get("cas"); has(r, "cas") {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			consulError(w, http.StatusInternalServerError, err.Error())
			return
		}
		cas = &n
	}
	acquire, release := q.Get("acquire"), q.Get("release")
	s.write(w, r, func() (any, int, error) {
		cur := s.kv[key]
		if cas != nil {
			if (*cas == 0 && cur != nil) || (*cas != 0 && (cur == nil || cur.ModifyIndex != *cas)) {
				return false, 0, nil
			}
		}
		switch {
		case acquire != "":
			if _, ok := s.sessions[acquire]; !ok {
				// As the agent answers (state store error through
				// the Raft apply): 500, plain text.
				return nil, http.StatusInternalServerError, fmt.Errorf("raft apply failed: invalid session %q", acquire)
			}
			if until, ok := s.delays[key]; ok && time.Now().Before(until) {
				return false, 0, nil
			}
			if cur != nil && cur.Session != "" && cur.Session != acquire {
				return false, 0, nil
			}
			idx := s.nextLocked()
			s.kvIndex = idx
			if cur == nil {
				cur = &api.KVPair{Key: key, CreateIndex: idx}
				s.kv[key] = cur
				delete(s.tombs, key)
			}
			if cur.Session != acquire {
				cur.LockIndex++
				cur.Session = acquire
			}
			cur.Value, cur.Flags, cur.ModifyIndex = value, flags, idx
			return true, 0, nil
		case release != "":
			if cur == nil || cur.Session != release {
				return false, 0, nil
			}
			idx := s.nextLocked()
			s.kvIndex = idx
			cur.Session = ""
			cur.Value, cur.Flags, cur.ModifyIndex = value, flags, idx
			return true, 0, nil
		}
		idx := s.nextLocked()
		s.kvIndex = idx
		if cur == nil {
			cur = &api.KVPair{Key: key, CreateIndex: idx}
			s.kv[key] = cur
			delete(s.tombs, key)
		}
		cur.Value, cur.Flags, cur.ModifyIndex = value, flags, idx
		return true, 0, nil
	})
}

func (s *Server) kvDelete(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q := r.URL.Query()
	var cas *uint64
	if has(r, "cas") {
		n, err := strconv.ParseUint(q.Get("cas"), 10, 64)
		if err != nil {
			consulError(w, http.StatusInternalServerError, err.Error())
			return
		}
		cas = &n
	}
	recurse := has(r, "recurse")
	s.write(w, r, func() (any, int, error) {
		if recurse {
			var doomed []string
			for k := range s.kv {
				if strings.HasPrefix(k, key) {
					doomed = append(doomed, k)
				}
			}
			if len(doomed) > 0 {
				idx := s.nextLocked()
				s.kvIndex = idx
				for _, k := range doomed {
					delete(s.kv, k)
					s.tombs[k] = idx
				}
			}
			return true, 0, nil
		}
		cur := s.kv[key]
		if cas != nil && (cur == nil || cur.ModifyIndex != *cas) {
			return cur == nil, 0, nil // as Consul: deleting a missing key succeeds
		}
		if cur != nil {
			idx := s.nextLocked()
			s.kvIndex = idx
			delete(s.kv, key)
			s.tombs[key] = idx
		}
		return true, 0, nil
	})
}

// ---- sessions ----

func (s *Server) expiry(se *session) time.Duration {
	return time.Duration(float64(se.ttl) * s.opts.TTLMultiplier)
}

// parseLockDelay reads a lock-delay the way Consul does: a duration string
// or a number of nanoseconds, where values under 1000 mean seconds.
func parseLockDelay(raw any) (time.Duration, error) {
	var d time.Duration
	switch v := raw.(type) {
	case nil:
		return 15 * time.Second, nil
	case string:
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			return 0, fmt.Errorf("invalid LockDelay %q", v)
		}
	case float64:
		d = time.Duration(v)
	default:
		return 0, fmt.Errorf("invalid LockDelay %v", raw)
	}
	if d < 1000 {
		d *= time.Second
	}
	return d, nil
}

func (s *Server) sessionCreate(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil && err != io.EOF {
		consulError(w, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	str := func(k string) string { v, _ := body[k].(string); return v }
	delay, err := parseLockDelay(body["LockDelay"])
	if err != nil {
		consulError(w, http.StatusBadRequest, err.Error())
		return
	}
	behavior := str("Behavior")
	switch behavior {
	case "":
		behavior = api.SessionBehaviorRelease
	case api.SessionBehaviorRelease, api.SessionBehaviorDelete:
	default:
		consulError(w, http.StatusInternalServerError, "Invalid Behavior setting '"+behavior+"'")
		return
	}
	var ttl time.Duration
	if v := str("TTL"); v != "" {
		if ttl, err = time.ParseDuration(v); err != nil {
			consulError(w, http.StatusInternalServerError, fmt.Sprintf("Session TTL '%s' invalid: %v", v, err))
			return
		}
		if ttl != 0 && (ttl < s.opts.MinSessionTTL || ttl > 24*time.Hour) {
			consulError(w, http.StatusInternalServerError, fmt.Sprintf("Invalid Session TTL '%d', must be between [%s=%s]", ttl, s.opts.MinSessionTTL, 24*time.Hour))
			return
		}
	}
	node := str("Node")
	if node == "" {
		node = s.opts.Node
	}
	s.write(w, r, func() (any, int, error) {
		if _, ok := s.nodes[node]; !ok {
			return nil, http.StatusInternalServerError, fmt.Errorf("Missing node registration")
		}
		idx := s.nextLocked()
		s.sesIndex = idx
		id := newID()
		se := &session{ttl: ttl, renewed: time.Now(), entry: api.SessionEntry{
			ID: id, Name: str("Name"), Node: node, LockDelay: delay, Behavior: behavior,
			CreateIndex: idx,
		}}
		if ttl > 0 {
			se.entry.TTL = ttl.String()
			se.timer = time.AfterFunc(s.expiry(se), func() { s.expire(id) })
		} else {
			se.timer = time.NewTimer(time.Hour)
			se.timer.Stop()
		}
		s.sessions[id] = se
		return map[string]string{"ID": id}, 0, nil
	})
}

// expire invalidates a session whose TTL ran out without renewal.
func (s *Server) expire(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.sessions[id]
	if !ok || s.closed {
		return
	}
	if time.Since(se.renewed) < s.expiry(se) { // renewed while the timer fired
		return
	}
	s.invalidateLocked(id)
}

// invalidateLocked removes a session: its keys are released or deleted by
// its behavior and get its lock-delay.
func (s *Server) invalidateLocked(id string) {
	se, ok := s.sessions[id]
	if !ok {
		return
	}
	se.timer.Stop()
	delete(s.sessions, id)
	idx := s.nextLocked()
	s.sesIndex = idx
	until := time.Now().Add(min(se.entry.LockDelay, 60*time.Second)) // Consul caps it at 60s
	for k, p := range s.kv {
		if p.Session != id {
			continue
		}
		s.kvIndex = idx
		if se.entry.LockDelay > 0 {
			s.delays[k] = until
		}
		if se.entry.Behavior == api.SessionBehaviorDelete {
			delete(s.kv, k)
			s.tombs[k] = idx
			continue
		}
		p.Session, p.ModifyIndex = "", idx
	}
}

func (s *Server) sessionDestroy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.write(w, r, func() (any, int, error) {
		s.invalidateLocked(id)
		return true, 0, nil
	})
}

func (s *Server) sessionRenew(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.write(w, r, func() (any, int, error) {
		se, ok := s.sessions[id]
		if !ok {
			return nil, http.StatusNotFound, fmt.Errorf("Session id '%s' not found", id)
		}
		se.renewed = time.Now()
		if se.ttl > 0 {
			se.timer.Reset(s.expiry(se))
		}
		return []api.SessionEntry{se.entry}, 0, nil
	})
}

func (s *Server) sessionInfo(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.query(w, r, func() response {
		out := []api.SessionEntry{}
		if se, ok := s.sessions[id]; ok {
			out = append(out, se.entry)
		}
		return jsonResponse(s.sesIndex, out)
	})
}

func (s *Server) sessionList(w http.ResponseWriter, r *http.Request) {
	s.query(w, r, func() response {
		out := []api.SessionEntry{}
		for _, se := range s.sessions {
			out = append(out, se.entry)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].CreateIndex < out[j].CreateIndex })
		return jsonResponse(s.sesIndex, out)
	})
}

// ---- catalog, agent and health ----

func svcKey(node, id string) string { return node + "\x00" + id }

// registerServiceLocked adds or replaces a service on node.
func (s *Server) registerServiceLocked(node string, svc *api.AgentService, idx uint64) {
	k := svcKey(node, svc.ID)
	if old, ok := s.services[k]; ok {
		svc.CreateIndex = old.CreateIndex
	} else {
		svc.CreateIndex = idx
	}
	svc.ModifyIndex = idx
	if svc.Meta == nil {
		svc.Meta = map[string]string{}
	}
	if svc.Tags == nil {
		svc.Tags = []string{}
	}
	if svc.Weights.Passing == 0 {
		svc.Weights = api.AgentWeights{Passing: 1, Warning: 1}
	}
	s.services[k] = svc
}

// putCheckLocked adds or replaces a check; an empty status is critical, as
// in Consul.
func (s *Server) putCheckLocked(c *api.HealthCheck, idx uint64) {
	if c.Status == "" {
		c.Status = api.HealthCritical
	}
	k := svcKey(c.Node, c.CheckID)
	if old, ok := s.checks[k]; ok {
		c.CreateIndex = old.CreateIndex
	} else {
		c.CreateIndex = idx
	}
	c.ModifyIndex = idx
	if c.ServiceID != "" {
		if svc, ok := s.services[svcKey(c.Node, c.ServiceID)]; ok {
			c.ServiceName, c.ServiceTags = svc.Service, svc.Tags
		}
	}
	s.checks[k] = c
}

func (s *Server) dropServiceLocked(node, id string) bool {
	k := svcKey(node, id)
	if _, ok := s.services[k]; !ok {
		return false
	}
	delete(s.services, k)
	for ck, c := range s.checks {
		if c.Node == node && c.ServiceID == id {
			delete(s.checks, ck)
		}
	}
	return true
}

func (s *Server) agentServiceRegister(w http.ResponseWriter, r *http.Request) {
	var reg api.AgentServiceRegistration
	if err := json.NewDecoder(r.Body).Decode(&reg); err != nil {
		consulError(w, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	if reg.Name == "" {
		consulError(w, http.StatusBadRequest, "Missing service name")
		return
	}
	if reg.ID == "" {
		reg.ID = reg.Name
	}
	checks := append(api.AgentServiceChecks(nil), reg.Checks...)
	if reg.Check != nil {
		checks = append(api.AgentServiceChecks{reg.Check}, checks...)
	}
	s.write(w, r, func() (any, int, error) {
		idx := s.nextLocked()
		s.hIndex = idx
		node := s.opts.Node
		s.registerServiceLocked(node, &api.AgentService{
			ID: reg.ID, Service: reg.Name, Tags: reg.Tags, Meta: reg.Meta, Port: reg.Port,
			Address: reg.Address, EnableTagOverride: reg.EnableTagOverride, Datacenter: "dc1",
		}, idx)
		for i, c := range checks {
			id := c.CheckID
			if id == "" {
				id = "service:" + reg.ID
				if len(checks) > 1 {
					id += ":" + strconv.Itoa(i+1)
				}
			}
			name := c.Name
			if name == "" {
				name = "Service '" + reg.Name + "' check"
			}
			typ := "script"
			switch {
			case c.TTL != "":
				typ = "ttl"
			case c.HTTP != "":
				typ = "http"
			case c.TCP != "":
				typ = "tcp"
			case c.GRPC != "":
				typ = "grpc"
			}
			s.putCheckLocked(&api.HealthCheck{
				Node: node, CheckID: id, Name: name, Status: c.Status, Notes: c.Notes,
				ServiceID: reg.ID, Type: typ,
			}, idx)
		}
		return nil, 0, nil
	})
}

func (s *Server) agentServiceDeregister(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.write(w, r, func() (any, int, error) {
		if !s.dropServiceLocked(s.opts.Node, id) {
			return nil, http.StatusNotFound, fmt.Errorf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id)
		}
		s.hIndex = s.nextLocked()
		return nil, 0, nil
	})
}

// setCheckLocked updates an agent check's status and output.
func (s *Server) setCheckLocked(id, status, output string) error {
	c, ok := s.checks[svcKey(s.opts.Node, id)]
	if !ok {
		return fmt.Errorf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id)
	}
	idx := s.nextLocked()
	s.hIndex = idx
	c.Status, c.Output, c.ModifyIndex = status, output, idx
	return nil
}

func (s *Server) agentCheckTTL(status string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, note := r.PathValue("id"), r.URL.Query().Get("note")
		s.write(w, r, func() (any, int, error) {
			if err := s.setCheckLocked(id, status, note); err != nil {
				return nil, http.StatusNotFound, err
			}
			return nil, 0, nil
		})
	}
}

func (s *Server) agentCheckUpdate(w http.ResponseWriter, r *http.Request) {
	var upd struct{ Status, Output string }
	if err := json.NewDecoder(r.Body).Decode(&upd); err != nil {
		consulError(w, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	switch upd.Status {
	case api.HealthPassing, api.HealthWarning, api.HealthCritical:
	default:
		consulError(w, http.StatusBadRequest, "Invalid check status: '"+upd.Status+"'")
		return
	}
	id := r.PathValue("id")
	s.write(w, r, func() (any, int, error) {
		if err := s.setCheckLocked(id, upd.Status, upd.Output); err != nil {
			return nil, http.StatusNotFound, err
		}
		return nil, 0, nil
	})
}

func (s *Server) catalogRegister(w http.ResponseWriter, r *http.Request) {
	var reg api.CatalogRegistration
	if err := json.NewDecoder(r.Body).Decode(&reg); err != nil {
		consulError(w, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	switch {
	case reg.Node == "":
		consulError(w, http.StatusInternalServerError, "Must provide node")
		return
	case reg.Address == "" && !reg.SkipNodeUpdate:
		consulError(w, http.StatusInternalServerError, "Must provide address if SkipNodeUpdate is not set")
		return
	case reg.Service != nil && reg.Service.ID != "" && reg.Service.Service == "":
		consulError(w, http.StatusInternalServerError, "Must provide service name (Service.Service) when service ID is provided")
		return
	}
	s.write(w, r, func() (any, int, error) {
		idx := s.nextLocked()
		s.hIndex = idx
		n, ok := s.nodes[reg.Node]
		if !ok {
			n = &api.Node{ID: reg.ID, Node: reg.Node, Datacenter: "dc1", CreateIndex: idx}
			if n.ID == "" {
				n.ID = newID()
			}
			s.nodes[reg.Node] = n
		}
		if !reg.SkipNodeUpdate {
			n.Address, n.TaggedAddresses, n.Meta, n.ModifyIndex = reg.Address, reg.TaggedAddresses, reg.NodeMeta, idx
		}
		if reg.Service != nil {
			svc := *reg.Service
			if svc.ID == "" {
				svc.ID = svc.Service
			}
			svc.Datacenter = "dc1"
			s.registerServiceLocked(reg.Node, &svc, idx)
		}
		checks := append(api.HealthChecks(nil), reg.Checks...)
		if reg.Check != nil {
			c := reg.Check
			checks = append(checks, &api.HealthCheck{Node: c.Node, CheckID: c.CheckID, Name: c.Name, Status: c.Status,
				Notes: c.Notes, Output: c.Output, ServiceID: c.ServiceID, Type: c.Type})
		}
		for _, c := range checks {
			cc := *c
			if cc.Node == "" {
				cc.Node = reg.Node
			}
			if cc.CheckID == "" {
				cc.CheckID = cc.Name
			}
			s.putCheckLocked(&cc, idx)
		}
		return true, 0, nil
	})
}

func (s *Server) catalogDeregister(w http.ResponseWriter, r *http.Request) {
	var d api.CatalogDeregistration
	if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
		consulError(w, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	s.write(w, r, func() (any, int, error) {
		switch {
		case d.ServiceID != "":
			s.dropServiceLocked(d.Node, d.ServiceID)
		case d.CheckID != "":
			delete(s.checks, svcKey(d.Node, d.CheckID))
		default:
			delete(s.nodes, d.Node)
			for k, svc := range s.services {
				if strings.HasPrefix(k, d.Node+"\x00") {
					s.dropServiceLocked(d.Node, svc.ID)
				}
			}
			for k, c := range s.checks {
				if c.Node == d.Node {
					delete(s.checks, k)
				}
			}
		}
		s.hIndex = s.nextLocked()
		return true, 0, nil
	})
}

func (s *Server) healthService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	passing := has(r, api.HealthPassing) && q.Get(api.HealthPassing) != "false" && q.Get(api.HealthPassing) != "0"
	tags := q["tag"]
	s.query(w, r, func() response {
		out := []*api.ServiceEntry{}
		for k, svc := range s.services {
			if svc.Service != name || !hasTags(svc.Tags, tags) {
				continue
			}
			node := k[:strings.IndexByte(k, 0)]
			n, ok := s.nodes[node]
			if !ok {
				continue
			}
			e := &api.ServiceEntry{Node: cloneNode(n), Service: cloneService(svc), Checks: api.HealthChecks{}}
			ok = true
			for _, c := range s.checks {
				if c.Node != node || (c.ServiceID != "" && c.ServiceID != svc.ID) {
					continue
				}
				cc := *c
				e.Checks = append(e.Checks, &cc)
				if c.Status != api.HealthPassing {
					ok = false
				}
			}
			if passing && !ok {
				continue
			}
			sort.Slice(e.Checks, func(i, j int) bool { return e.Checks[i].CheckID < e.Checks[j].CheckID })
			out = append(out, e)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].Node.Node != out[j].Node.Node {
				return out[i].Node.Node < out[j].Node.Node
			}
			return out[i].Service.ID < out[j].Service.ID
		})
		return jsonResponse(s.hIndex, out)
	})
}

func hasTags(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func cloneNode(n *api.Node) *api.Node {
	c := *n
	return &c
}

func cloneService(s *api.AgentService) *api.AgentService {
	c := *s
	c.Tags = append([]string{}, s.Tags...)
	c.Meta = make(map[string]string, len(s.Meta))
	for k, v := range s.Meta {
		c.Meta[k] = v
	}
	return &c
}

// ---- helpers for tests ----

// Client returns a consul/api client of the double.
func (s *Server) Client() (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token = s.Addr(), "http", ""
	return api.NewClient(cfg)
}
