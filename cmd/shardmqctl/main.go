// Command shardmqctl is the operator's command line over a router's HTTP
// API (see internal/ctl for the commands; `shardmqctl help` lists them).
package main

import (
	"os"

	"github.com/mattn/go-isatty"

	"github.com/shardmq/shardmq/internal/ctl"
)

func main() {
	// A terminal, not merely a character device: /dev/null is one too,
	// and a script's stdin of /dev/null must not count as a person.
	terminal := isatty.IsTerminal(os.Stdin.Fd())
	os.Exit(ctl.Main(os.Args[1:], ctl.Env{Getenv: os.Getenv, In: os.Stdin, Terminal: terminal, Out: os.Stdout, Err: os.Stderr}))
}
