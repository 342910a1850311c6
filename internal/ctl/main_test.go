package ctl

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// recorder is a router double that answers {} to everything and
// remembers each request as "METHOD PATH" with its Authorization header.
type recorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []string
	auth []string
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.RequestURI())
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"job":"rs-1","state":"aborting","purged":3}`))
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reqs...)
}

// run is shardmqctl against the recorder with no environment, stdin
// in (a terminal when terminal) and var/ under dir.
func (r *recorder) run(t *testing.T, in string, terminal bool, args ...string) (int, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	env := Env{Dir: t.TempDir(), In: strings.NewReader(in), Terminal: terminal, Out: &out, Err: &errw}
	code := Main(append([]string{"-router", r.srv.URL}, args...), env)
	return code, out.String(), errw.String()
}

// placeholder arguments for a command's words, so that `--help` is tried
// where a real invocation would put it: after the arguments.
func exampleArgs(c command) []string {
	args := strings.Fields(c.name)
	for _, f := range strings.Fields(c.args) {
		switch {
		case strings.HasPrefix(f, "[") || strings.HasPrefix(f, "(") || strings.HasPrefix(f, "-"):
		case f == "bash" || f == "WHAT":
			args = append(args, map[string]string{"bash": "bash", "WHAT": "drain"}[f])
		default:
			args = append(args, "x")
		}
	}
	return args
}

// Every command has its own --help (and -h, -help) that prints its usage
// and does nothing else: no request reaches the router, whatever else is
// on the line. `sub delete T S --help` used to delete the subscription.
func TestEveryCommandHelpDoesNothingElse(t *testing.T) {
	t.Parallel()
	r := newRecorder(t)
	for _, c := range commands {
		for _, h := range []string{"--help", "-help", "-h"} {
			for _, args := range [][]string{append(exampleArgs(c), h), append([]string{h}, exampleArgs(c)...)} {
				code, out, errs := r.run(t, "y\n", true, append(args, "-yes")...)
				want := "usage: shardmqctl " + c.name
				if c.name == "help" {
					want = "usage: shardmqctl [global flags]"
				}
				if code != 0 || !strings.Contains(out, want) {
					t.Errorf("%q: exit %d, stdout lacks %q:\n%s%s", args, code, want, out, errs)
				}
			}
		}
	}
	if got := r.requests(); len(got) != 0 {
		t.Fatalf("--help sent requests: %v", got)
	}
	// The commands of the issue, as typed.
	for _, line := range []string{"sub delete orders billing --help", "topology --help", "stats --help", "tx --help", "dlq purge orders default -yes --help", "reshard abort rs-1 --help"} {
		if code, out, _ := r.run(t, "", false, strings.Fields(line)...); code != 0 || !strings.HasPrefix(out, "usage: shardmqctl ") {
			t.Errorf("%s: exit %d\n%s", line, code, out)
		}
	}
	if got := r.requests(); len(got) != 0 {
		t.Fatalf("--help sent requests: %v", got)
	}
}

// help lists every command; help of a group lists its subcommands; help
// of something that is no command is bad usage.
func TestHelpListsCommands(t *testing.T) {
	t.Parallel()
	r := newRecorder(t)
	code, out, _ := r.run(t, "", false, "help")
	if code != 0 {
		t.Fatalf("help: exit %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(out, "  "+c.name) {
			t.Errorf("help does not list %q", c.name)
		}
	}
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"help", "sub"}, 0, []string{"shardmqctl sub get", "shardmqctl sub put", "shardmqctl sub delete"}},
		{[]string{"help", "dlq", "purge"}, 0, []string{"shardmqctl dlq purge", "-yes"}},
		{[]string{"sub", "--help"}, 0, []string{"shardmqctl sub delete"}},
		{[]string{"--help"}, 0, []string{"usage: shardmqctl [global flags]"}},
		{[]string{"help", "nope"}, 2, nil},
	}
	for _, tt := range tests {
		code, out, _ := r.run(t, "", false, tt.args...)
		if code != tt.code {
			t.Errorf("%v: exit %d, want %d", tt.args, code, tt.code)
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", tt.args, w, out)
			}
		}
	}
	if got := r.requests(); len(got) != 0 {
		t.Fatalf("help sent requests: %v", got)
	}
}

// Destructive commands ask on a terminal, act on y or yes only, refuse
// without -yes when standard input is not a terminal, and act at once
// with -yes (before or after the command).
func TestDestructiveCommandsConfirm(t *testing.T) {
	t.Parallel()
	destructive := []struct {
		args []string
		req  string
	}{
		{[]string{"sub", "delete", "orders", "billing"}, "DELETE /v1/topics/orders/subscriptions/billing"},
		{[]string{"dlq", "purge", "orders", "default", "-error-code", "E_STOCK"}, "DELETE /v1/topics/orders/subscriptions/default/dead-letters?error_code=E_STOCK"},
		{[]string{"reshard", "abort", "rs-1"}, "POST /v1/admin/reshard/rs-1/abort"},
	}
	cases := []struct {
		name     string
		in       string
		terminal bool
		yesFirst bool // -yes as a global flag
		yesLast  bool // -yes after the command
		code     int
		acts     bool
	}{
		{name: "script without -yes refuses", code: 2},
		{name: "script with -yes acts", yesLast: true, acts: true},
		{name: "global -yes acts", yesFirst: true, acts: true},
		{name: "terminal y acts", in: "y\n", terminal: true, acts: true},
		{name: "terminal yes acts", in: "YES\n", terminal: true, acts: true},
		{name: "terminal n declines", in: "n\n", terminal: true, code: 2},
		{name: "terminal empty line declines", in: "\n", terminal: true, code: 2},
		{name: "terminal closed declines", terminal: true, code: 2},
	}
	seen := map[string]bool{}
	for _, d := range destructive {
		seen[strings.Join(d.args[:2], " ")] = true
		for _, tc := range cases {
			t.Run(strings.Join(d.args[:2], "_")+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				r := newRecorder(t)
				args := append([]string(nil), d.args...)
				if tc.yesLast {
					args = append(args, "-yes")
				}
				if tc.yesFirst {
					args = append([]string{"-yes"}, args...)
				}
				code, _, errs := r.run(t, tc.in, tc.terminal, args...)
				if code != tc.code {
					t.Fatalf("exit %d, want %d: %s", code, tc.code, errs)
				}
				got := r.requests()
				switch {
				case tc.acts && (len(got) != 1 || got[0] != d.req):
					t.Fatalf("requests %v, want [%s]", got, d.req)
				case !tc.acts && len(got) != 0:
					t.Fatalf("unconfirmed, yet sent %v", got)
				}
				if tc.terminal && !strings.Contains(errs, "[y/N]") {
					t.Fatalf("no question asked: %q", errs)
				}
				if !tc.terminal && !tc.acts && !strings.Contains(errs, "-yes") {
					t.Fatalf("the refusal does not mention -yes: %q", errs)
				}
			})
		}
	}
	for _, c := range commands {
		if c.destructive != seen[c.name] {
			t.Errorf("%s: destructive %v in the table, tested %v", c.name, c.destructive, seen[c.name])
		}
	}
}

// The router comes from -router, else $SHARDMQ_URL (older name
// $SHARDMQ_ROUTER), else var/router.url, else the default; the token
// from -token, else $SHARDMQ_TOKEN, else var/router.token.
func TestRouterAndTokenResolution(t *testing.T) {
	t.Parallel()
	flagSrv, envSrv, fileSrv := newRecorder(t), newRecorder(t), newRecorder(t)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "var"), 0o755)
	os.WriteFile(filepath.Join(dir, DefaultRouterFile), []byte(fileSrv.srv.URL+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, DefaultTokenFile), []byte("smq_file\n"), 0o600)
	empty := t.TempDir()
	tests := []struct {
		name     string
		flags    []string
		env      map[string]string
		dir      string
		want     *recorder
		wantAuth string
	}{
		{"flags win", []string{"-router", flagSrv.srv.URL, "-token", "smq_flag"},
			map[string]string{"SHARDMQ_URL": envSrv.srv.URL, "SHARDMQ_TOKEN": "smq_env"}, dir, flagSrv, "Bearer smq_flag"},
		{"environment next", nil, map[string]string{"SHARDMQ_URL": envSrv.srv.URL, "SHARDMQ_TOKEN": "smq_env"}, dir, envSrv, "Bearer smq_env"},
		{"older variable", nil, map[string]string{"SHARDMQ_ROUTER": envSrv.srv.URL}, dir, envSrv, "Bearer smq_file"},
		{"var/ last", nil, nil, dir, fileSrv, "Bearer smq_file"},
		{"address without scheme", []string{"-router", strings.TrimPrefix(flagSrv.srv.URL, "http://")}, nil, empty, flagSrv, ""},
	}
	for _, tt := range tests {
		var out, errw bytes.Buffer
		env := Env{Dir: tt.dir, Out: &out, Err: &errw, Getenv: func(k string) string { return tt.env[k] }}
		before := len(tt.want.requests())
		if code := Main(append(tt.flags, "stats"), env); code != 0 {
			t.Fatalf("%s: exit %d: %s", tt.name, code, errw.String())
		}
		tt.want.mu.Lock()
		n, auth := len(tt.want.reqs), tt.want.auth[len(tt.want.auth)-1]
		tt.want.mu.Unlock()
		if n != before+1 || auth != tt.wantAuth {
			t.Fatalf("%s: %d new requests with %q, want 1 with %q", tt.name, n-before, auth, tt.wantAuth)
		}
	}
	if got := resolveRouter("", func(string) string { return "" }, empty); got != DefaultRouter {
		t.Fatalf("nothing set: %q, want %q", got, DefaultRouter)
	}
}

// An answer gathered from several clusters that lacks some says so on
// standard error (the table on standard output stays as it is); a
// complete one says nothing.
func TestTablesNameMissingClusters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		answer, want string
	}{
		{`{"subscriptions":[],"missing_clusters":["c1","c3"],"clusters":[]}`, "MISSING: c1, c3 did not answer"},
		{`{"subscriptions":[],"missing_clusters":[],"clusters":[]}`, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(tc.answer)) }))
		for _, cmd := range []string{"stats", "topology"} {
			var out, errw bytes.Buffer
			if code := Run([]string{cmd}, srv.URL, &out, &errw, nil); code != 0 {
				t.Fatalf("%s: exit %d: %s", cmd, code, errw.String())
			}
			if got := errw.String(); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("%s over %s: stderr %q, want %q", cmd, tc.answer, got, tc.want)
			}
		}
		srv.Close()
	}
}
