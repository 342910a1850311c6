// Package ctl is the operator's command line over a router's HTTP API:
// topology, shard map, stats, trace, transactions, reconciliation,
// subscriptions, dead letters, resharding and the archive. It only speaks HTTP, so it works against
// any router.
package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Run executes one command and returns the process exit code: 0 on a 2xx
// answer, 1 when the router answered an error, 2 on bad usage. It never
// asks: destructive commands need -yes (Session.Run asks on a terminal).
func Run(args []string, router string, stdout, stderr io.Writer, client *http.Client) int {
	return Session{Router: router, Out: stdout, Err: stderr, Client: client}.Run(args)
}

// Session is what one command runs with besides its arguments: the
// router, the client, and where it reads a confirmation from.
type Session struct {
	Router   string
	Client   *http.Client // nil: a plain client with a 60 s timeout
	In       io.Reader    // read for a confirmation when Terminal
	Terminal bool         // In is a person at a terminal who can be asked
	Out, Err io.Writer
}

// Run executes one command (help, -json and -yes anywhere on the line)
// and returns the exit code as Run does.
func (s Session) Run(args []string) int {
	if s.Client == nil {
		s.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if help, rest := wantsHelp(args); help || (len(rest) > 0 && rest[0] == "help") {
		if len(rest) > 0 && rest[0] == "help" {
			rest = rest[1:]
		}
		var words []string
		for _, a := range rest {
			if a != "-json" && a != "--json" && a != "-yes" && a != "--yes" {
				words = append(words, a)
			}
		}
		if !writeHelp(s.Out, words) {
			fmt.Fprintf(s.Err, "shardmqctl: no command %q\n\n%s", strings.Join(words, " "), usageText())
			return 2
		}
		return 0
	}
	if len(args) == 0 {
		fmt.Fprint(s.Err, usageText())
		return 2
	}
	c := &cmd{router: strings.TrimSuffix(s.Router, "/"), out: s.Out, errw: s.Err, client: s.Client,
		in: s.In, terminal: s.Terminal, every: 500 * time.Millisecond}
	rest := args[:0:0]
	for _, a := range args {
		switch a {
		case "-json", "--json":
			c.json = true
			continue
		case "-yes", "--yes":
			c.yes = true
			continue
		}
		rest = append(rest, a)
	}
	if len(rest) == 0 {
		fmt.Fprint(s.Err, usageText())
		return 2
	}
	switch rest[0] {
	case "token":
		return RunToken(rest[1:], s.Out, s.Err)
	case "aws-key":
		return RunAccessKey(rest[1:], s.Out, s.Err)
	}
	err := c.dispatch(rest)
	var ue usageError
	var nc notConfirmed
	switch {
	case err == nil:
		return 0
	case errors.As(err, &nc):
		fmt.Fprintf(s.Err, "shardmqctl: %v\n", err)
		return 2
	case errors.As(err, &ue):
		fmt.Fprintf(s.Err, "shardmqctl: %v\n\n%s", err, usageText())
		return 2
	default:
		fmt.Fprintf(s.Err, "shardmqctl: %v\n", err)
		return 1
	}
}

// notConfirmed is a destructive command that was not confirmed: refused
// without -yes off a terminal, or declined at the prompt. Nothing was sent.
type notConfirmed string

func (n notConfirmed) Error() string { return string(n) }

// confirm asks before a destructive command: -yes answers for the
// operator; on a terminal the operator types y or yes; anywhere else
// (a script, a pipe, cron) it refuses, so that a script that forgot -yes
// fails loudly instead of acting or hanging.
func (c *cmd) confirm(what string) error {
	if c.yes {
		return nil
	}
	if !c.terminal || c.in == nil {
		return notConfirmed("refusing to " + what + ": standard input is not a terminal; add -yes to do it")
	}
	fmt.Fprintf(c.errw, "%s? [y/N] ", strings.ToUpper(what[:1])+what[1:])
	line, _ := bufio.NewReader(c.in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return notConfirmed("not confirmed: nothing done")
}

type usageError string

func (u usageError) Error() string { return string(u) }

type cmd struct {
	router string
	out    io.Writer
	errw   io.Writer
	client *http.Client
	json   bool          // print the router's JSON instead of tables
	every  time.Duration // how often -watch and -follow ask

	yes      bool      // -yes: destructive commands do not ask
	terminal bool      // in is a terminal: destructive commands ask on it
	in       io.Reader // where the answer to a confirmation comes from
}

func (c *cmd) dispatch(args []string) error {
	name, rest := args[0], args[1:]
	switch name {
	case "topology":
		return c.show("GET", "/v1/admin/topology", nil, c.topologyTable)
	case "shardmap":
		fs := newFlags("shardmap")
		heat := fs.Bool("heat", false, "a text heat map of the 1024 vshards")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		if *heat && !c.json {
			return c.heatMap()
		}
		return c.show("GET", "/v1/admin/shardmap", nil, c.shardMapTable)
	case "stats":
		return c.show("GET", "/v1/admin/stats", nil, c.statsTable)
	case "completion":
		if len(rest) != 1 || rest[0] != "bash" {
			return usageError("completion takes bash")
		}
		_, err := io.WriteString(c.out, bashCompletion)
		return err
	case "trace":
		return c.trace(rest)
	case "tx":
		if len(rest) != 1 {
			return usageError("tx takes one transaction id")
		}
		return c.call("GET", "/v1/transactions/"+url.PathEscape(rest[0]), nil)
	case "reconcile":
		fs := newFlags("reconcile")
		tx := fs.String("tx", "", "comma-separated transaction ids to check for a missing message")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		if *tx != "" {
			return c.call("POST", "/v1/admin/reconcile/transactions", map[string]any{"transaction_ids": strings.Split(*tx, ",")})
		}
		return c.call("POST", "/v1/admin/reconcile", map[string]any{})
	case "sub":
		return c.sub(rest)
	case "dlq":
		return c.dlq(rest)
	case "reshard":
		return c.reshard(rest)
	case "archive":
		return c.archive(rest)
	}
	return usageError("unknown command " + name)
}

// archive is retention (docs/retention.md): its status, a pass now, and
// the restore and release of a cold month.
func (c *cmd) archive(args []string) error {
	if len(args) == 0 {
		return usageError("archive takes status|run|restore|release")
	}
	fs := newFlags("archive " + args[0])
	month := fs.String("month", "", "restore, release: the month, YYYY-MM")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError(err.Error())
	}
	switch args[0] {
	case "status":
		return c.call("GET", "/v1/admin/retention", nil)
	case "run":
		return c.call("POST", "/v1/admin/retention/run", map[string]any{})
	case "restore", "release":
		if *month == "" {
			return usageError("archive " + args[0] + " needs -month YYYY-MM")
		}
		return c.call("POST", "/v1/admin/retention/"+args[0], map[string]any{"month": *month})
	}
	return usageError("archive takes status, run, restore or release")
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// positional splits leading positional arguments from flags.
func positional(args []string, n int) ([]string, []string, error) {
	if len(args) < n {
		return nil, nil, usageError(fmt.Sprintf("expected %d arguments", n))
	}
	return args[:n], args[n:], nil
}

func (c *cmd) trace(args []string) error {
	pos, rest, err := positional(args, 1)
	if err != nil {
		return usageError("trace takes a key")
	}
	fs := newFlags("trace")
	topic := fs.String("topic", "", "the message's topic (required)")
	orderKey := fs.String("order-key", "", "the message's order_key, if it had one")
	if err := fs.Parse(rest); err != nil {
		return usageError(err.Error())
	}
	if *topic == "" {
		return usageError("trace needs -topic")
	}
	q := url.Values{"topic": {*topic}}
	if *orderKey != "" {
		q.Set("order_key", *orderKey)
	}
	return c.call("GET", "/v1/messages/"+url.PathEscape(pos[0])+"/trace?"+q.Encode(), nil)
}

func (c *cmd) sub(args []string) error {
	pos, rest, err := positional(args, 3)
	if err != nil {
		return usageError("sub takes get|put|delete TOPIC SUB")
	}
	path := "/v1/topics/" + url.PathEscape(pos[1]) + "/subscriptions/" + url.PathEscape(pos[2])
	switch pos[0] {
	case "get":
		return c.call("GET", path, nil)
	case "delete":
		if len(rest) > 0 {
			return usageError("sub delete takes TOPIC SUB and -yes, not " + strings.Join(rest, " "))
		}
		if err := c.confirm("delete subscription " + pos[2] + " of topic " + pos[1] + " with its deliveries and dead letters"); err != nil {
			return err
		}
		return c.call("DELETE", path, nil)
	case "put":
		fs := newFlags("sub put")
		cfg := fs.String("config", "{}", "the subscription as JSON (max_attempts, backoff, ordered, dead_letter_alarm)")
		if err := fs.Parse(rest); err != nil {
			return usageError(err.Error())
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(*cfg), &body); err != nil {
			return usageError("-config is not a JSON object: " + err.Error())
		}
		return c.call("PUT", path, body)
	}
	return usageError("sub takes get, put or delete")
}

func (c *cmd) dlq(args []string) error {
	pos, rest, err := positional(args, 3)
	if err != nil {
		return usageError("dlq takes list|redrive|purge TOPIC SUB")
	}
	path := "/v1/topics/" + url.PathEscape(pos[1]) + "/subscriptions/" + url.PathEscape(pos[2]) + "/dead-letters"
	fs := newFlags("dlq " + pos[0])
	code := fs.String("error-code", "", "only dead letters with this error code")
	limit := fs.Int("limit", 100, "list: page size")
	cursor := fs.String("cursor", "", "list: next_cursor of the previous page")
	ids := fs.String("ids", "", "redrive: comma-separated message ids")
	all := fs.Bool("all", false, "redrive: every dead letter")
	dry := fs.Bool("dry-run", false, "redrive: count what would be redriven, change nothing")
	if err := fs.Parse(rest); err != nil {
		return usageError(err.Error())
	}
	switch pos[0] {
	case "list":
		q := url.Values{"limit": {fmt.Sprint(*limit)}}
		if *code != "" {
			q.Set("error_code", *code)
		}
		if *cursor != "" {
			q.Set("cursor", *cursor)
		}
		return c.show("GET", path+"?"+q.Encode(), nil, c.deadTable)
	case "codes":
		return c.show("GET", path+"/codes", nil, c.codesTable)
	case "purge":
		q, which := "", "every dead letter"
		if *code != "" {
			q = "?error_code=" + url.QueryEscape(*code)
			which = "the dead letters with error code " + *code
		}
		if err := c.confirm("delete " + which + " of " + pos[1] + "/" + pos[2] + " for good"); err != nil {
			return err
		}
		return c.show("DELETE", path+q, nil, func(m map[string]any) error {
			_, err := fmt.Fprintf(c.out, "purged: %v\n", num(m["purged"]))
			return err
		})
	case "redrive":
		body := map[string]any{}
		switch {
		case *ids != "":
			body["ids"] = strings.Split(*ids, ",")
		case *code != "":
			body["error_code"] = *code
		case *all:
			body["all"] = true
		default:
			return usageError("dlq redrive needs -ids, -error-code or -all")
		}
		if *dry {
			body["dry_run"] = true
		}
		return c.show("POST", path+"/redrive", body, c.redriveText)
	}
	return usageError("dlq takes list, codes, redrive or purge")
}

// apiError is a non-2xx answer: its status and the router's error code.
type apiError struct {
	method, path, status, code string
}

func (e *apiError) Error() string {
	if e.code != "" {
		return fmt.Sprintf("%s %s: %s (%s)", e.method, e.path, e.status, e.code)
	}
	return fmt.Sprintf("%s %s: %s", e.method, e.path, e.status)
}

// fetch sends one request and returns the answer's body. A non-2xx
// answer is printed to stderr and returned as an *apiError.
func (c *cmd) fetch(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, c.router+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		json.Unmarshal(data, &e)
		c.errw.Write(indent(data))
		return nil, &apiError{method: method, path: path, status: resp.Status, code: e.Error.Code}
	}
	return data, nil
}

func indent(data []byte) []byte {
	var pretty bytes.Buffer
	if json.Indent(&pretty, data, "", "  ") == nil {
		return append(pretty.Bytes(), '\n')
	}
	return data
}

// call sends one request and prints the JSON answer indented.
func (c *cmd) call(method, path string, body any) error {
	data, err := c.fetch(method, path, body)
	if err != nil {
		return err
	}
	_, err = c.out.Write(indent(data))
	return err
}

// show sends one request and prints its answer with table, or as JSON
// under -json.
func (c *cmd) show(method, path string, body any, table func(map[string]any) error) error {
	if c.json {
		return c.call(method, path, body)
	}
	data, err := c.fetch(method, path, body)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("%s %s: the answer is not a JSON object: %w", method, path, err)
	}
	return table(m)
}

// fetchQuiet is fetch without printing an error answer.
func (c *cmd) fetchQuiet(method, path string) ([]byte, error) {
	errw := c.errw
	c.errw = io.Discard
	defer func() { c.errw = errw }()
	return c.fetch(method, path, nil)
}

func jsonObject(data []byte, v *map[string]any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("the answer is not a JSON object: %w", err)
	}
	return nil
}
