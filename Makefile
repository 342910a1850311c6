# shardmq — the two commands a fresh machine needs are `make run` and
# `make test`; both install what is missing (mariadb-server) first.
SHELL       := /bin/bash
GO          ?= go
VAR         ?= var
SANDBOX_DIR ?= $(VAR)/sandbox
ROUTER_ADDR ?= 127.0.0.1:8080
TOKEN_FILE  ?= $(VAR)/router.token
TOKENS      ?= $(VAR)/tokens.yaml
RECEIPT_KEY ?= $(VAR)/receipt.key
AWS_KEYS    ?= $(VAR)/aws-keys.yaml
AWS_CREDENTIALS ?= $(VAR)/aws-credentials
CLUSTERS    ?= 2
REPLICAS    ?= 1

.PHONY: deps build run restart-router stop add-cluster test vet fmt bench

# deps installs MariaDB from Debian's packages when its server binary is
# missing (the test bed starts its own mariadbd processes).
deps:
	@if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then \
		echo "mariadbd not found: installing mariadb-server"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y mariadb-server mariadb-client; \
	fi
	@command -v $(GO) >/dev/null 2>&1 || { echo "go is not installed (see README)"; exit 1; }

build:
	@mkdir -p bin
	$(GO) build -o bin/router ./cmd/router
	$(GO) build -o bin/sandbox ./cmd/sandbox
	$(GO) build -o bin/shardmqctl ./cmd/shardmqctl

# The key that signs receipts is made once, in $(RECEIPT_KEY) (mode 0600),
# and kept: receipts handed out before a restart stay valid after it. A
# fleet of routers must share it (docs/security.md, "Receipts").
# Each router start makes a fresh admin token: the secret in
# $(TOKEN_FILE) (mode 0600), its hash in the router's token file $(TOKENS)
# (docs/security.md); and a fresh SQS access key acting as that token: in
# the router's access-key file $(AWS_KEYS) and, as the profile `default`
# of an AWS shared-credentials file, in $(AWS_CREDENTIALS) (docs/sqs.md).
# run makes sure a sandbox of $(CLUSTERS) clusters (primary + $(REPLICAS)
# replica each) runs in $(SANDBOX_DIR) and a router on $(ROUTER_ADDR) over
# its generated static topology, in the background, starting only what is
# missing: a sandbox left by `make loadtest`/`make bench-*` or an earlier
# `make run` is reused with its data (servers of it that are down are
# started again on their data directories), and a running router is left
# as it is. `make restart-router` restarts only the router; `make stop`
# stops the router and the sandbox and deletes the sandbox's data.
run: deps build
	bin/sandbox up -reuse -dir $(SANDBOX_DIR) -clusters $(CLUSTERS) -replicas $(REPLICAS)
	@if $(router_running); then \
		echo; echo "router already running (pid $$(cat $(VAR)/router.pid)); 'make restart-router' restarts it"; \
	else $(start_router); fi
	@$(router_info)

# restart-router stops the router `make run` started (if it runs) and
# starts a new one from the current build over the same sandbox, which is
# left untouched.
restart-router: build
	@test -f $(SANDBOX_DIR)/topology.yaml || { echo "no sandbox in $(SANDBOX_DIR): run 'make run'"; exit 1; }
	@$(stop_router)
	@$(start_router)
	@$(router_info)

# add-cluster starts one more cluster beside the running sandbox and lists
# it in its topology owning no vshards; move vshards onto it with
# POST /v1/admin/reshard (docs/resharding.md).
add-cluster: build
	bin/sandbox add-cluster -dir $(SANDBOX_DIR) -replicas $(REPLICAS)

stop:
	@$(stop_router)
	@if [ -x bin/sandbox ]; then bin/sandbox down -dir $(SANDBOX_DIR); else $(GO) run ./cmd/sandbox down -dir $(SANDBOX_DIR); fi

# The router's shell snippets. alive: process $(1) runs (a zombie left
# by kill -9 where nothing reaps it does not). router_running: its pid file
# names a live process. start_router keeps the previous log as router.log.1 and waits
# up to 20 s for /readyz.
alive = { [ -r /proc/$(1)/stat ] && [ "$$(sed 's/.*) //' /proc/$(1)/stat | cut -c1)" != Z ]; }
router_running = [ -f $(VAR)/router.pid ] && $(call alive,$$(cat $(VAR)/router.pid))
start_router = mkdir -p $(VAR); \
	if [ ! -s $(RECEIPT_KEY) ]; then (umask 077; head -c 48 /dev/urandom | base64 > $(RECEIPT_KEY)) || exit 1; fi; \
	bin/shardmqctl token new -name sandbox-admin -admin '*' -tokens $(TOKENS) -out $(TOKEN_FILE) || exit 1; \
	bin/shardmqctl aws-key new -token sandbox-admin -keys $(AWS_KEYS) -out $(AWS_CREDENTIALS) -replace || exit 1; \
	if [ -f $(VAR)/router.log ]; then mv -f $(VAR)/router.log $(VAR)/router.log.1; fi; \
	echo "http://$(ROUTER_ADDR)" > $(VAR)/router.url; \
	nohup bin/router -listen $(ROUTER_ADDR) -topology $(SANDBOX_DIR)/topology.yaml -tokens $(TOKENS) -aws-credentials $(AWS_KEYS) -receipt-key-file $(RECEIPT_KEY) -disk-path $(SANDBOX_DIR) > $(VAR)/router.log 2>&1 & echo $$! > $(VAR)/router.pid; \
	for i in $$(seq 1 100); do \
		if curl -fsS http://$(ROUTER_ADDR)/readyz >/dev/null 2>&1; then break; fi; \
		if ! $(call alive,$$(cat $(VAR)/router.pid)); then echo "router exited:"; tail -20 $(VAR)/router.log; exit 1; fi; \
		sleep 0.2; done; \
	curl -fsS http://$(ROUTER_ADDR)/readyz >/dev/null || { echo "router not ready after 20s:"; tail -20 $(VAR)/router.log; exit 1; }
stop_router = if [ -f $(VAR)/router.pid ]; then \
		pid=$$(cat $(VAR)/router.pid); \
		if $(call alive,$$pid); then kill $$pid; for i in $$(seq 1 50); do $(call alive,$$pid) || break; sleep 0.2; done; fi; \
		rm -f $(VAR)/router.pid; echo "router stopped"; fi
router_info = echo; \
	echo "router:   http://$(ROUTER_ADDR)  (pid $$(cat $(VAR)/router.pid), log $(VAR)/router.log)"; \
	echo "topology: $(SANDBOX_DIR)/topology.yaml (edit it: the router reloads it within a second)"; \
	echo "token:    $(TOKEN_FILE) (admin on every topic; bin/shardmqctl reads it; new one at each router start)"; \
	echo "sqs:      AWS_SHARED_CREDENTIALS_FILE=$(AWS_CREDENTIALS) AWS_REGION=us-east-1 aws --endpoint-url http://$(ROUTER_ADDR) sqs list-queues"; \
	echo "try:      curl -s -XPOST http://$(ROUTER_ADDR)/v1/topics/orders/messages -H \"Authorization: Bearer \$$(cat $(TOKEN_FILE))\" -H 'Content-Type: application/json' -d '{\"messages\":[{\"key\":\"order-42-paid\",\"payload\":{\"amount\":42}}]}'"; \
	echo "restart:  make restart-router (the sandbox and its data stay)"; \
	echo "stop:     make stop (stops the sandbox too and deletes its data)"

# test runs every package with -race against one shared sandbox of real
# MariaDB servers that lives as long as the run — the product's module,
# then the SQS clients' module (test-sqs) —, then the partition suite's
# quick set (test-partitions-quick), then the bounded fuzz run.
test: deps browser-deps sqs-deps vet promtool-test
	@mkdir -p bin
	$(GO) build -o bin/sandbox ./cmd/sandbox
	bin/sandbox exec -clusters 2 -replicas 1 -- sh -c '$(GO) test -race -count=1 -timeout 15m ./...; a=$$?; ($(test_sqs)); b=$$?; [ $$a -eq 0 ] && [ $$b -eq 0 ]'
	@$(MAKE) --no-print-directory test-partitions-quick
	@$(MAKE) --no-print-directory fuzz

# test-partitions runs the partition suite (docs/testing.md): routers and
# MariaDB servers on test hosts of their own (network namespaces joined by
# veth pairs; root on Linux with iproute2), links cut, slowed and healed
# under load. About 3.5 minutes on a quiet 2-core machine, 5–8 on a loaded
# one. Where namespaces are not allowed every test skips and says why.
.PHONY: test-partitions test-partitions-quick
test-partitions: deps
	SHARDMQ_PARTITIONS=1 $(GO) test -race -count=1 -v -timeout 20m ./internal/netbed ./internal/partition

# test-partitions-quick is the part of the partition suite that make test
# runs, within its budget (91 s measured on a quiet 2-core machine): the test bed's own test and
# the two stale-router cases of the Consul routers — a router cut off from
# Consul during a reshard, and one stopped with SIGSTOP through the copy and
# woken in the cleanup. The rest (a router killed in cleanup and started on
# an older map, the leader killed in the cut-over, a slow then cut primary,
# a primary cut from its replica) runs under make test-partitions; their
# in-process counterparts run under make test. Skips, saying why, where
# namespaces are not allowed.
PARTITIONS_QUICK ?= TestCutAndHeal|TestRouterCutFromConsulDuringReshard|TestRouterFrozenThroughReshard
test-partitions-quick: deps
	SHARDMQ_PARTITIONS=1 $(GO) test -race -count=1 -v -timeout 10m -run '^($(PARTITIONS_QUICK))$$' ./internal/netbed ./internal/partition

# test-fast runs every test that needs no database, with no MariaDB
# started (internal/testbed: Need skips the others, Start refuses).
.PHONY: test-fast
test-fast:
	SHARDMQ_TEST_FAST=1 $(GO) test -count=1 ./...

# test-sqs drives the router's SQS API (docs/sqs.md) through real clients
# over a fresh test bed: the AWS SDK for Go v2 (JSON protocol) and Debian's
# AWS CLI and boto3 (query protocol, sqs/sdktest/testdata). sqs/sdktest is
# a Go module of its own, as client/watermill is, so that the product's
# go.mod does not depend on the AWS SDK. Ends with go test's ok line.
.PHONY: sqs-deps test-sqs
test_sqs = cd sqs/sdktest && SQS_E2E=require $(GO) test -race -count=1 -timeout 10m .
test-sqs: deps sqs-deps
	@mkdir -p bin
	$(GO) build -o bin/sandbox ./cmd/sandbox
	bin/sandbox exec -clusters 2 -replicas 1 -- sh -c '$(test_sqs)'

# sqs-deps installs Debian's awscli and python3-boto3 when /usr/bin/aws or
# boto3 for /usr/bin/python3 is missing (the query-protocol clients).
sqs-deps:
	@if [ ! -x /usr/bin/aws ] || ! /usr/bin/python3 -c 'import boto3' >/dev/null 2>&1; then \
		echo "awscli or python3-boto3 not found: installing them"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends awscli python3-boto3; \
	fi

# browser-deps installs Debian's chromium when it is missing: the
# headless-browser test of the operators' page (server's TestUIBrowser,
# docs/ui.md) drives it; without it that test skips and says why.
.PHONY: browser-deps ui-test
browser-deps:
	@if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then \
		echo "chromium not found: installing chromium"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	fi

# ui-test runs only the tests of the operators' page and CLI, and the one
# that renders a short load test's report.html (the browser tests'
# screenshots go to var/ui-test/).
ui-test: deps browser-deps
	@mkdir -p bin
	$(GO) build -o bin/sandbox ./cmd/sandbox
	bin/sandbox exec -clusters 2 -replicas 1 -- $(GO) test -race -count=1 ./ui/ ./server/ ./loadtest/ -run 'TestHistory|TestUI|TestOperatorCLI|TestReportHTML'

# fuzz runs each fuzz target of the request decoders, the query strings,
# the strictness scan, the receipt parser and the hand-written answer
# encoders (held to encoding/json) for FUZZTIME inputs (13 targets x 40,000
# inputs: 55-80 s on 2 cores, as the inputs found meanwhile grow the
# corpus). One instrumented test binary serves every target (go test -c
# -fuzz): a go test -fuzz per target linked it again each time, 1.2-1.9 s
# a target before any input ran. The budget is a
# count, not a duration: with a duration Go's fuzz coordinator runs under a
# deadline, and on a loaded machine a worker still starting or measuring its
# baseline coverage when it passes makes the target fail with "context
# deadline exceeded" although no input failed (seen in CI). A count has no
# deadline; the test binary's -timeout still bounds a hung run. A crash is
# written to api/testdata/fuzz/ and fails the run; commit it as a seed once
# fixed. No database is needed. FUZZTIME=30s still works for a longer local run.
FUZZTIME     ?= 40000x
FUZZ_TARGETS ?= FuzzProduce FuzzClaim FuzzAckExtend FuzzNack FuzzSubscriptionPut FuzzRedrive FuzzQuery FuzzDecodeReceipt FuzzCheckJSON \
	FuzzAppendClaimed FuzzIsCompactJSON FuzzPlainReceiptList FuzzDecodeProduce

.PHONY: fuzz
fuzz:
	@mkdir -p bin
	$(GO) test -c -fuzz=. -o bin/api-fuzz.test ./api/
	@set -o pipefail; cache=$$($(GO) env GOCACHE)/fuzz; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $$t for $(FUZZTIME)"; \
		(cd api && ../bin/api-fuzz.test -test.run '^$$' -test.fuzz "^$$t\$$" -test.fuzztime $(FUZZTIME) \
			-test.fuzzcachedir "$$cache" -test.timeout 5m 2>&1) | grep -v '^fuzz: elapsed' || exit 1; \
	done

vet:
	$(GO) vet ./...
	cd sqs/sdktest && $(GO) vet .
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# promtool-test checks the alert rules and runs their unit tests
# (deploy/prometheus/alerts_test.yml); it installs Debian's prometheus
# package, which ships promtool, when promtool is missing.
.PHONY: promtool-test
promtool-test:
	@if ! command -v promtool >/dev/null 2>&1; then \
		echo "promtool not found: installing prometheus"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; \
	fi
	promtool check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && promtool test rules alerts_test.yml

# bench runs the Go micro-benchmarks of the hot functions (-tags dbbench
# builds the broker benchmarks that need the bed).
bench: build
	bin/sandbox exec -- $(GO) test -tags dbbench -run '^$$' -bench . -benchmem ./shard/ ./broker/ ./store/

# --- load tests and benchmarks (issue 7; docs/loadtest.md, docs/performance.md)
# loadtest, bench-produce and bench-consume use the sandbox in
# $(SANDBOX_DIR), starting one as `make run` does when none answers there
# (it keeps running; `make stop` stops it), and run their own router built
# from the current source on a free loopback port, stopped at the end — a
# router started by `make run` is neither needed nor touched.
# LOADTEST_ROUTER=http://… uses a running router instead. Reports
# (report.md, report.html, report.json) go to $(LOADTEST_OUT)/<name>.
LOADTEST_OUT    ?= $(VAR)/loadtest
LOADTEST_ROUTER ?=
LOADTEST_ARGS   ?=
FAULT           ?=
FAULT_AT        ?= 20s
FAULT_DOWN      ?= 5s
ROUTERS         ?= 1
WORKERS         ?= 1
LOADTEST_FLAGS   = -sandbox $(SANDBOX_DIR) $(if $(LOADTEST_ROUTER),-router $(LOADTEST_ROUTER),-router-bin bin/router) \
	$(if $(filter-out 1,$(ROUTERS)),-routers $(ROUTERS)) $(if $(filter-out 1,$(WORKERS)),-workers $(WORKERS)) \
	$(if $(filter-out 2,$(CLUSTERS)),-sandbox-clusters $(CLUSTERS)) $(if $(filter-out 1,$(REPLICAS)),-sandbox-replicas $(REPLICAS))

.PHONY: loadtest bench-produce bench-consume bench-peers loadtest-build

loadtest-build:
	@mkdir -p bin
	$(GO) build -o bin/router ./cmd/router
	$(GO) build -o bin/sandbox ./cmd/sandbox
	$(GO) build -o bin/loadtest ./cmd/loadtest

# loadtest is the quarterly mixed test for 60 s (targets 100k messages/s
# written, 50k/s consumed), then a drain and the proof that every
# acknowledged message was consumed once; report.md, report.html (charts
# over time, inline SVG) and report.json in $(LOADTEST_OUT)/mixed….
# FAULT=c1-primary (any sandbox instance) or FAULT=router kills it -9
# FAULT_AT into the run and restarts
# it FAULT_DOWN later. Last line: lost: N, duplicated: N, produced/s: X,
# consumed/s: Y; exit status 1 if anything was lost. ROUTERS=N runs N
# routers over the same sandbox and spreads the requests over them;
# WORKERS=N runs N generator processes on loopback that share the run, and
# this one merges their books and histograms (docs/loadtest.md, "A fleet").
# Either prints `routers: N, workers: M` before the last line.
loadtest: deps loadtest-build
	bin/loadtest -scenario mixed -duration 60s $(LOADTEST_FLAGS) \
		$(if $(FAULT),-fault $(FAULT) -fault-at $(FAULT_AT) -fault-down $(FAULT_DOWN)) \
		-out $(LOADTEST_OUT)/mixed$(if $(FAULT),-fault-$(FAULT))$(if $(filter-out 1,$(ROUTERS)),-r$(ROUTERS))$(if $(filter-out 1,$(WORKERS)),-w$(WORKERS)) $(LOADTEST_ARGS)

# bench-produce: batched produce through the router and straight into
# MySQL (the baseline), one message per request from 64 clients, 64
# goroutines sending through the Go client's Producer, and one goroutine
# publishing 200,000 messages through its asynchronous Publisher, in
# alternating rounds. Lines before the last: client single-message ratio,
# client async ratio. Last line: produce ratio router/baseline: R.
bench-produce: deps loadtest-build
	bin/loadtest -scenario bench-produce $(LOADTEST_FLAGS) -out $(LOADTEST_OUT)/bench-produce $(LOADTEST_ARGS)

# bench-consume: the same preloaded backlog drained through the router and
# straight from MySQL (claim 100 + ack), then the SQS leg (docs/sqs.md).
# Last lines: sqs consume ratio sqs/native: R, consume ratio
# router/baseline: R.
bench-consume: deps loadtest-build
	bin/loadtest -scenario bench-consume $(LOADTEST_FLAGS) -out $(LOADTEST_OUT)/bench-consume $(LOADTEST_ARGS)

# bench-peers (issue 15): the router against a real peer, Watermill-SQL's
# MySQL queue schema with delete on ack, on the same sandbox primary in
# the same run: the peer publishes (100 per call) and consumes (batch 100)
# before and after one round of bench-produce and of bench-consume. Its
# own Go module (loadtest/peers) keeps Watermill out of the product's
# go.mod. The same run drives loadtest.Floor, DESIGN §6's rows written by
# hand with no router, to show what the contract allows on this machine,
# and the floors of the inline layout (no delivery row for the default
# subscription) and of the one-row layout (the message row is the dedup
# key as well, and its retention: rows deleted, keys kept; the line
# `floor onerow lifetime` sums the two; docs/performance.md). Last lines: consume ratio
# router/peer: R, produce ratio router/peer: R.
bench-peers: deps loadtest-build
	cd loadtest/peers && $(GO) build -o ../../bin/bench-peers .
	bin/bench-peers -sandbox $(SANDBOX_DIR) -loadtest bin/loadtest -router-bin bin/router -out $(LOADTEST_OUT)/bench-peers $(if $(LOADTEST_ARGS),-loadtest-args '$(LOADTEST_ARGS)')

# --- the Go client (issue 17; docs/client.md)
# example-orders runs seed 001's order → points flow through the client's
# outbox and inbox over the sandbox in $(SANDBOX_DIR) (started as `make run`
# does when none answers there), with a router built from the current
# source on a free port. Its two service databases, example_orders and
# example_points, live on the sandbox's first primary. Last line:
# orders: N, points changes: N, duplicates: 0.
EXAMPLE_ORDERS ?= 500
.PHONY: example-orders
example-orders: deps loadtest-build
	$(GO) build -o bin/example-orders ./examples/orders
	bin/example-orders -sandbox $(SANDBOX_DIR) -router-bin bin/router -orders $(EXAMPLE_ORDERS) -out $(VAR)/example-orders

# test-watermill runs Watermill's universal Pub/Sub suite
# (pubsub/tests.TestPubSub) against a router over a fresh test bed, through
# the adapter in client/watermill — a Go module of its own, so the
# product's go.mod does not depend on Watermill. Ends with go test's ok
# line for the adapter's package.
.PHONY: test-watermill
test-watermill: deps
	@mkdir -p bin
	$(GO) build -o bin/sandbox ./cmd/sandbox
	cd client/watermill && ../../bin/sandbox exec -clusters 2 -replicas 1 -- $(GO) test -race -count=1 -timeout 15m .
