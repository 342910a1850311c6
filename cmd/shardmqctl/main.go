// Command shardmqctl is the operator's command line over a router's HTTP
// API (see internal/ctl for the commands).
package main

import (
	"flag"
	"os"

	"github.com/shardmq/shardmq/internal/ctl"
)

func main() {
	def := os.Getenv("SHARDMQ_ROUTER")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	router := flag.String("router", def, "the router's base URL")
	flag.Parse()
	os.Exit(ctl.Run(flag.Args(), *router, os.Stdout, os.Stderr, nil))
}
