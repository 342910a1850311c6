# shardmq — the two commands a fresh machine needs are `make run` and
# `make test`; both install what is missing (mariadb-server) first.
SHELL       := /bin/bash
GO          ?= go
VAR         ?= var
SANDBOX_DIR ?= $(VAR)/sandbox
ROUTER_ADDR ?= 127.0.0.1:8080
CLUSTERS    ?= 2
REPLICAS    ?= 1

.PHONY: deps build run stop test vet fmt bench

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

# run starts a sandbox of $(CLUSTERS) clusters (primary + $(REPLICAS)
# replica each) and a router on $(ROUTER_ADDR) over its generated static
# topology, in the background. `make stop` stops it all.
run: deps build
	@if [ -f $(VAR)/router.pid ] && kill -0 $$(cat $(VAR)/router.pid) 2>/dev/null; then \
		echo "a router is already running (pid $$(cat $(VAR)/router.pid)); run 'make stop' first"; exit 1; fi
	bin/sandbox up -dir $(SANDBOX_DIR) -clusters $(CLUSTERS) -replicas $(REPLICAS)
	@nohup bin/router -listen $(ROUTER_ADDR) -topology $(SANDBOX_DIR)/topology.yaml > $(VAR)/router.log 2>&1 & echo $$! > $(VAR)/router.pid
	@for i in $$(seq 1 100); do \
		if curl -fsS http://$(ROUTER_ADDR)/readyz >/dev/null 2>&1; then break; fi; \
		if ! kill -0 $$(cat $(VAR)/router.pid) 2>/dev/null; then echo "router exited:"; tail -20 $(VAR)/router.log; exit 1; fi; \
		sleep 0.2; done
	@curl -fsS http://$(ROUTER_ADDR)/readyz >/dev/null || { echo "router not ready after 20s:"; tail -20 $(VAR)/router.log; exit 1; }
	@echo
	@echo "router:   http://$(ROUTER_ADDR)  (pid $$(cat $(VAR)/router.pid), log $(VAR)/router.log)"
	@echo "topology: $(SANDBOX_DIR)/topology.yaml (edit it: the router reloads it within a second)"
	@echo "try:      curl -s -XPOST http://$(ROUTER_ADDR)/v1/topics/orders/messages -d '{\"messages\":[{\"key\":\"order-42-paid\",\"payload\":{\"amount\":42}}]}'"
	@echo "stop:     make stop"

stop:
	@if [ -f $(VAR)/router.pid ]; then \
		pid=$$(cat $(VAR)/router.pid); \
		if kill -0 $$pid 2>/dev/null; then kill $$pid; for i in $$(seq 1 50); do kill -0 $$pid 2>/dev/null || break; sleep 0.2; done; fi; \
		rm -f $(VAR)/router.pid; echo "router stopped"; fi
	@if [ -x bin/sandbox ]; then bin/sandbox down -dir $(SANDBOX_DIR); else $(GO) run ./cmd/sandbox down -dir $(SANDBOX_DIR); fi

# test runs every package with -race against one shared sandbox of real
# MariaDB servers that lives as long as the run.
test: deps vet
	@mkdir -p bin
	$(GO) build -o bin/sandbox ./cmd/sandbox
	bin/sandbox exec -clusters 2 -replicas 1 -- $(GO) test -race -count=1 -timeout 15m ./...

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# bench runs the Go micro-benchmarks of the hot functions.
bench: build
	bin/sandbox exec -- $(GO) test -run '^$$' -bench . -benchmem ./shard/ ./broker/ ./store/
