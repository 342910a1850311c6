// Command shardmqctl is the operator's command line over a router's HTTP
// API (see internal/ctl for the commands).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/shardmq/shardmq/internal/ctl"
)

func main() {
	def := os.Getenv("SHARDMQ_ROUTER")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	router := flag.String("router", def, "the router's base URL")
	token := flag.String("token", "", "API token (default $SHARDMQ_TOKEN, else the first line of -token-file)")
	tokenFile := flag.String("token-file", "", "file holding the API token (default "+ctl.DefaultTokenFile+" when it exists)")
	asJSON := flag.Bool("json", false, "print the router's JSON answers instead of tables")
	flag.Parse()
	args := flag.Args()
	if len(args) > 0 && args[0] == "completion" {
		os.Exit(ctl.Run(args, *router, os.Stdout, os.Stderr, nil))
	}
	if *asJSON {
		args = append([]string{"-json"}, args...)
	}
	if len(args) > 0 && args[0] == "token" {
		os.Exit(ctl.RunToken(args[1:], os.Stdout, os.Stderr))
	}
	if len(args) > 0 && args[0] == "aws-key" {
		os.Exit(ctl.RunAccessKey(args[1:], os.Stdout, os.Stderr))
	}
	tok, err := ctl.ResolveToken(*token, *tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shardmqctl:", err)
		os.Exit(2)
	}
	os.Exit(ctl.Run(args, *router, os.Stdout, os.Stderr, ctl.WithToken(nil, tok)))
}
