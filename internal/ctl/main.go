package ctl

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRouterFile is where `make run` writes the router's URL.
const DefaultRouterFile = "var/router.url"

// DefaultRouter is the router shardmqctl talks to when nothing names one.
const DefaultRouter = "http://127.0.0.1:8080"

// Env is the process around shardmqctl: its environment, the directory
// var/ is found in, and its standard streams. cmd/shardmqctl fills it
// from the real process; tests fill it by hand.
type Env struct {
	Getenv   func(string) string // nil: no environment
	Dir      string              // where var/ lives; "" is the working directory
	In       io.Reader
	Terminal bool // In is a terminal, so destructive commands may ask on it
	Out, Err io.Writer
}

// Main is shardmqctl: global flags, then one command. It returns the
// process's exit code.
func Main(args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	fs := flag.NewFlagSet("shardmqctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	router := fs.String("router", "", "the router's base URL")
	token := fs.String("token", "", "API token")
	tokenFile := fs.String("token-file", "", "file holding the API token")
	asJSON := fs.Bool("json", false, "print the router's JSON answers instead of tables")
	yes := fs.Bool("yes", false, "do not ask before destructive commands")
	// Help anywhere on the line is help for what the rest names
	// (`shardmqctl -h sub delete` as `shardmqctl sub delete -h`).
	help, args := wantsHelp(args)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(env.Err, "shardmqctl: %v\n\n%s", err, usageText())
		return 2
	}
	rest := fs.Args()
	if help {
		rest = append(rest, "--help")
	}
	if *asJSON {
		rest = append([]string{"-json"}, rest...)
	}
	if *yes {
		rest = append([]string{"-yes"}, rest...)
	}
	s := Session{In: env.In, Terminal: env.Terminal, Out: env.Out, Err: env.Err}
	if needsRouter(rest) {
		s.Router = resolveRouter(*router, env.Getenv, env.Dir)
		tok, err := resolveToken(*token, *tokenFile, env.Getenv, env.Dir)
		if err != nil {
			fmt.Fprintln(env.Err, "shardmqctl:", err)
			return 2
		}
		s.Client = WithToken(nil, tok)
	}
	return s.Run(rest)
}

// needsRouter says whether the command line talks to a router (help,
// completion, token and aws-key do not, so they work without one).
func needsRouter(args []string) bool {
	if help, _ := wantsHelp(args); help {
		return false
	}
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		switch a {
		case "help", "completion", "token", "aws-key":
			return false
		}
		return true
	}
	return false
}

// resolveRouter picks the router: the -router flag, else $SHARDMQ_URL
// (or its older name $SHARDMQ_ROUTER), else the first line of
// var/router.url, else DefaultRouter. An address without a scheme
// (127.0.0.1:8080) means http.
func resolveRouter(flagRouter string, getenv func(string) string, dir string) string {
	r := flagRouter
	for _, name := range []string{"SHARDMQ_URL", "SHARDMQ_ROUTER"} {
		if r == "" {
			r = strings.TrimSpace(getenv(name))
		}
	}
	if r == "" {
		if data, err := os.ReadFile(filepath.Join(dir, DefaultRouterFile)); err == nil {
			line, _, _ := strings.Cut(string(data), "\n")
			r = strings.TrimSpace(line)
		}
	}
	if r == "" {
		r = DefaultRouter
	}
	if !strings.Contains(r, "://") {
		r = "http://" + r
	}
	return r
}
