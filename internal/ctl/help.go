package ctl

import (
	"fmt"
	"io"
	"strings"
)

// command is one shardmqctl command as its help shows it. The table is
// the single source of the usage summary, `help` and every `--help`, so
// a command cannot exist without a help text of its own.
type command struct {
	name        string // the words that select it: "sub delete"
	args        string // what follows them: "TOPIC SUB [-yes]"
	summary     string // one line for the list of commands
	detail      string // the rest of its --help: what it does, its flags
	destructive bool   // asks for confirmation (or -yes) before acting
}

var commands = []command{
	{name: "topology", summary: "clusters, endpoints, breakers, replica lag",
		detail: "GET /v1/admin/topology: each cluster's endpoints, their health and breaker state,\nthe replicas' lag, and which clusters cannot be served now."},
	{name: "shardmap", args: "[-heat]", summary: "the shard map: ranges, or a text heat map of the 1024 vshards",
		detail: "GET /v1/admin/shardmap as a table of vshard ranges and their clusters.\n  -heat   one letter per vshard, 64 to a line, one letter per cluster"},
	{name: "stats", summary: "queue depth per subscription",
		detail: "GET /v1/admin/stats: ready, in flight and dead deliveries per topic and subscription."},
	{name: "trace", args: "KEY -topic T [-order-key K]", summary: "a message's full trace",
		detail: "GET /v1/messages/KEY/trace: the message, its deliveries and every event.\n  -topic T       the message's topic (required)\n  -order-key K   the message's order_key, if it had one"},
	{name: "tx", args: "TRANSACTION_ID", summary: "every message of a transaction",
		detail: "GET /v1/transactions/TRANSACTION_ID: the messages of one transaction from every cluster."},
	{name: "reconcile", args: "[-tx ID,ID,…]", summary: "run reconciliation now (or ask which transaction ids have no message)",
		detail: "POST /v1/admin/reconcile: repair and report message statuses that disagree with\ntheir deliveries.\n  -tx ID,ID,…   only report which of these transaction ids have no message"},
	{name: "sub get", args: "TOPIC SUB", summary: "a subscription's settings",
		detail: "GET /v1/topics/TOPIC/subscriptions/SUB."},
	{name: "sub put", args: "TOPIC SUB [-config JSON]", summary: "create or change a subscription",
		detail: "PUT /v1/topics/TOPIC/subscriptions/SUB.\n  -config JSON   max_attempts, backoff, ordered, dead_letter_alarm (default {})"},
	{name: "sub delete", args: "TOPIC SUB [-yes]", destructive: true, summary: "delete a subscription and its deliveries",
		detail: "DELETE /v1/topics/TOPIC/subscriptions/SUB: the subscription stops receiving messages\nand its pending deliveries and dead letters are gone.\n  -yes   do not ask (needed when standard input is not a terminal)"},
	{name: "dlq list", args: "TOPIC SUB [-error-code E] [-limit N] [-cursor C]", summary: "dead letters, newest first",
		detail: "GET …/dead-letters.\n  -error-code E   only dead letters with this error code\n  -limit N        page size (default 100)\n  -cursor C       next_cursor of the previous page"},
	{name: "dlq codes", args: "TOPIC SUB", summary: "dead letters counted by error code",
		detail: "GET …/dead-letters/codes: how many dead letters carry each error code."},
	{name: "dlq redrive", args: "TOPIC SUB (-ids ID,ID,… | -error-code E | -all) [-dry-run]", summary: "make dead letters ready again",
		detail: "POST …/dead-letters/redrive: the chosen dead letters become ready, attempts reset.\n  -ids ID,ID,…    these message ids\n  -error-code E   every dead letter with this error code\n  -all            every dead letter\n  -dry-run        count what would be redriven, change nothing"},
	{name: "dlq purge", args: "TOPIC SUB [-error-code E] [-yes]", destructive: true, summary: "delete dead letters for good",
		detail: "DELETE …/dead-letters: the dead letters (of one error code, or all) are deleted.\n  -error-code E   only dead letters with this error code\n  -yes            do not ask (needed when standard input is not a terminal)"},
	{name: "reshard plan", args: "WHAT", summary: "what a reshard would move, starting nothing",
		detail: "POST /v1/admin/reshard with dry_run.\n  WHAT is: move FROM-TO:TARGET[,…] | add-cluster NAME | drain NAME"},
	{name: "reshard start", args: "WHAT [-follow]", summary: "start a reshard (and follow it to its end)",
		detail: "POST /v1/admin/reshard.\n  WHAT is: move FROM-TO:TARGET[,…] | add-cluster NAME | drain NAME\n  -follow   a progress bar until the job ends"},
	{name: "reshard status", args: "[JOB] [-watch]", summary: "every job, or one",
		detail: "GET /v1/admin/reshard[/JOB].\n  -watch   a progress bar until the job ends (needs JOB)"},
	{name: "reshard pause", args: "JOB", summary: "pause a job between batches",
		detail: "POST /v1/admin/reshard/JOB/pause."},
	{name: "reshard resume", args: "JOB", summary: "resume a paused job",
		detail: "POST /v1/admin/reshard/JOB/resume."},
	{name: "reshard abort", args: "JOB [-yes]", destructive: true, summary: "abort a job",
		detail: "POST /v1/admin/reshard/JOB/abort: before the flip the source keeps serving and the\ncopies are deleted; after it, the job moves the vshards back.\n  -yes   do not ask (needed when standard input is not a terminal)"},
	{name: "reshard move", args: "FROM-TO:TARGET[,…] [-dry-run]", summary: "plan and start in one (kept for scripts)",
		detail: "Starts a reshard moving these vshard ranges; -dry-run only plans."},
	{name: "reshard add-cluster", args: "NAME [-dry-run]", summary: "plan and start in one (kept for scripts)",
		detail: "Starts a reshard giving cluster NAME an even share; -dry-run only plans."},
	{name: "reshard drain", args: "NAME [-dry-run]", summary: "plan and start in one (kept for scripts)",
		detail: "Starts a reshard moving every vshard off cluster NAME; -dry-run only plans."},
	{name: "archive status", summary: "retention: partitions, warm and cold archive, upkeep",
		detail: "GET /v1/admin/retention."},
	{name: "archive run", summary: "run a retention pass now",
		detail: "POST /v1/admin/retention/run."},
	{name: "archive restore", args: "-month YYYY-MM", summary: "put a cold month back into the archive cluster",
		detail: "POST /v1/admin/retention/restore."},
	{name: "archive release", args: "-month YYYY-MM", summary: "let a restored month go cold again",
		detail: "POST /v1/admin/retention/release."},
	{name: "completion", args: "bash", summary: "a bash completion script: source <(shardmqctl completion bash)",
		detail: "Prints a bash completion script for commands, subcommands, flags and job ids."},
	{name: "token new", args: "-name N [-produce|-consume|-admin PATTERNS] [-tokens FILE] [-out FILE]", summary: "make an API token",
		detail: strings.TrimPrefix(tokenUsage, "usage: ")},
	{name: "aws-key new", args: "-token NAME -keys FILE [-out FILE]", summary: "make an SQS access key acting as a token",
		detail: strings.TrimPrefix(accessKeyUsage, "usage: ")},
	{name: "help", args: "[COMMAND]", summary: "this list, or one command's help",
		detail: "Every command also takes -h, -help or --help, which prints its help and does nothing else."},
}

const globalHelp = `Global flags (before the command):
  -router URL        the router (default: $SHARDMQ_URL, else the first line of
                     var/router.url that make run writes, else http://127.0.0.1:8080)
  -token T           API token (default: $SHARDMQ_TOKEN, else the first line of
                     -token-file, var/router.token by default)
  -token-file FILE   file holding the API token
  -json              print the router's JSON answers instead of tables
  -yes               do not ask before destructive commands

Exit codes: 0 done, 1 the router answered an error (printed), 2 bad usage,
a refused or unconfirmed destructive command.
`

// usageText is the list of commands: their words, arguments and summary.
func usageText() string {
	var b strings.Builder
	b.WriteString("usage: shardmqctl [global flags] COMMAND [ARGS]\n\n")
	for _, c := range commands {
		line := c.name
		if c.args != "" {
			line += " " + c.args
		}
		if len(line) > 38 {
			fmt.Fprintf(&b, "  %s\n  %-38s  %s\n", line, "", c.summary)
			continue
		}
		fmt.Fprintf(&b, "  %-38s  %s\n", line, c.summary)
	}
	b.WriteString("\n")
	b.WriteString(globalHelp)
	b.WriteString("\n`shardmqctl COMMAND --help` shows one command's help.\n")
	return b.String()
}

// isHelp says whether an argument asks for help.
func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// wantsHelp says whether any argument asks for help, and returns the
// arguments without it: help wins over everything else on the line, so
// `sub delete T S --help` never deletes.
func wantsHelp(args []string) (bool, []string) {
	var rest []string
	found := false
	for _, a := range args {
		if isHelp(a) {
			found = true
			continue
		}
		rest = append(rest, a)
	}
	return found, rest
}

// writeHelp prints the help of the command the words select: the exact
// command ("sub delete"), or every command of a group ("sub"). It returns
// false when the words name no command.
func writeHelp(w io.Writer, words []string) bool {
	var name []string
	for _, a := range words {
		if strings.HasPrefix(a, "-") {
			break
		}
		name = append(name, a)
		if len(name) == 2 {
			break
		}
	}
	if len(name) == 0 {
		io.WriteString(w, usageText())
		return true
	}
	find := func(n string) []command {
		var out []command
		for _, c := range commands {
			if c.name == n || strings.HasPrefix(c.name, n+" ") {
				out = append(out, c)
			}
		}
		return out
	}
	matched := find(strings.Join(name, " "))
	if len(matched) == 0 && len(name) == 2 {
		matched = find(name[0])
	}
	if len(matched) == 0 {
		return false
	}
	for i, c := range matched {
		if i > 0 {
			io.WriteString(w, "\n")
		}
		if strings.HasPrefix(c.detail, "shardmqctl ") {
			fmt.Fprintf(w, "usage: %s", c.detail) // token and aws-key keep their own full usage
			continue
		}
		fmt.Fprintf(w, "usage: shardmqctl %s", c.name)
		if c.args != "" {
			fmt.Fprintf(w, " %s", c.args)
		}
		fmt.Fprintf(w, "\n\n%s%s.\n%s\n", strings.ToUpper(c.summary[:1]), c.summary[1:], c.detail)
		if c.destructive {
			io.WriteString(w, "On a terminal it asks before acting; elsewhere it refuses without -yes.\n")
		}
	}
	return true
}
