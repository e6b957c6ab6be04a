# wasmesh build, test, bench and run.
#
# Everything a fresh machine needs is installed from here: Go modules from the module
# proxy; Node.js/npm, prometheus, chromium and redis-server from Debian when missing (the
# AssemblyScript test fixture; the metrics beside `make run` and in the tests; the mesh page's
# test; the rate-limit service's counters in its tests and `make run`).

SHELL := /bin/bash
GO ?= go
ROOT := $(CURDIR)
BIN := $(ROOT)/bin
WASM_OUT := $(ROOT)/build/wasm

# Modules of the workspace that hold Go packages (a room with only a go.mod is skipped).
MODULES := $(shell for m in agent controlplane filters testenv wasm; do \
	find $$m -name '*.go' -not -path '*/testdata/*' 2>/dev/null | grep -q . && echo $$m; done)

# Every filter is a main package directly under filters/ (filters/<name>/main.go).
FILTERS := $(notdir $(patsubst %/,%,$(dir $(wildcard filters/*/main.go))))
FILTER_WASM := $(addprefix $(WASM_OUT)/,$(addsuffix .wasm,$(FILTERS)))

# Binaries: every main package under <module>/cmd/<name>.
COMMANDS := $(wildcard $(addsuffix /cmd/*,$(MODULES)))

AS_FIXTURE := $(WASM_OUT)/testdata/as_filter.wasm

# The Kubernetes control plane the tests run (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd), built from Go modules (testenv/kubebin) into a cache
# directory named by the hash of that module's go.mod and go.sum: about 20 minutes cold on
# 2 cores, then reused by every checkout on this machine.
CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/wasmesh
KUBE_BIN := $(CACHE)/kubebin/$(shell cat testenv/kubebin/go.mod testenv/kubebin/go.sum | sha256sum | cut -c1-12)

# Test binaries read these to find the artifacts built here.
export WASMESH_KUBE_BIN_DIR := $(KUBE_BIN)
export WASMESH_BIN_DIR := $(BIN)
export WASMESH_WASM_DIR := $(WASM_OUT)
export WASMESH_AS_FIXTURE := $(AS_FIXTURE)

.PHONY: all build deps tools wasm fixtures kube-bin vet test test-unit test-race fuzz mutate bench soak run run-k8s manifests clean

all: build

deps:
	@for m in $(MODULES); do (cd $$m && $(GO) mod download) || exit 1; done

# Debian provides what is absent: Node.js and npm build the AssemblyScript fixture;
# prometheus (with promtool) runs beside `make run` and in the metrics tests; headless
# chromium loads the mesh page in its test; redis-server holds the rate-limit service's
# counters (controlplane/ratelimit tests, `make run`).
tools:
	@command -v npm >/dev/null 2>&1 || { \
		echo "installing nodejs and npm from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || { \
		echo "installing prometheus from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing chromium from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }

build: deps wasm
	@mkdir -p $(BIN)
	@for c in $(COMMANDS); do \
		m=$${c%%/*}; echo "go build $$c -> bin/$$(basename $$c)"; \
		(cd $$m && $(GO) build -o $(BIN)/$$(basename $$c) ./$${c#*/}) || exit 1; \
	done

wasm: $(FILTER_WASM)

# Filters are built with the standard Go toolchain as wasip1 reactors. Always invoked so
# the go build cache, not make's timestamps, decides what is stale.
$(WASM_OUT)/%.wasm: FORCE
	@mkdir -p $(WASM_OUT)
	@echo "go build filters/$* -> build/wasm/$*.wasm"
	@cd filters && GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $@ ./$*

# Built with the same flags every time, so the Go build cache is reused; a partial build
# (interrupted) is finished on the next call.
kube-bin:
	@if [ ! -f $(KUBE_BIN)/.complete ]; then \
		echo "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and etcd from Go modules into $(KUBE_BIN)"; \
		echo "(about 20 minutes on 2 cores the first time; cached afterwards)"; \
		mkdir -p $(KUBE_BIN) && cd testenv/kubebin && GOWORK=off $(GO) build -trimpath -o $(KUBE_BIN)/ tool && touch $(KUBE_BIN)/.complete; \
	fi

fixtures: tools
	@mkdir -p $(dir $(AS_FIXTURE))
	@if [ -x wasm/testdata/assemblyscript/build.sh ]; then wasm/testdata/assemblyscript/build.sh $(AS_FIXTURE); fi

vet: deps
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	@for m in $(MODULES); do echo "go vet $$m"; (cd $$m && $(GO) vet ./...) || exit 1; done
	@if [ -d filters ]; then echo "go vet filters (wasip1)"; cd filters && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...; fi

# WASMESH_REQUIRE_FIXTURES turns a missing build artifact into a test failure instead of a skip.
test: vet build fixtures test-unit test-race

test-unit: build fixtures kube-bin
	@for m in $(MODULES); do echo "go test $$m"; \
		(cd $$m && WASMESH_REQUIRE_FIXTURES=1 $(GO) test -count=1 -timeout 20m ./...) || exit 1; done

# The concurrent packages under the race detector: the xDS server and push pipeline, the
# registry, the Wasm host, the agent's supervisor and sidecar; then meshproxy's end-to-end
# tests against a race-built meshproxy (its listeners and upstreams run concurrently only in
# a running proxy), which exits on the first race it sees (GORACE halt_on_error).
RACE_PKGS := controlplane:./server/...,./pusher/...,./push/...,./registry/...,./meshstate/...,./discovery/... \
	wasm:./host \
	agent:./supervisor/...,./sidecar/...,./envoyproc/...,./cmd/agent/...,./xdsproxy/...,./sds/...,./workloadcert/... \
	testenv:./proxy/upstream/...,./proxy/router/...,./proxy/listener/...,./proxy/sds/...,./proxy/tlsctx/...,./proxy/rbac/...
RACE_BIN := $(ROOT)/build/race-bin
test-race: build fixtures
	@for e in $(RACE_PKGS); do m=$${e%%:*}; pkgs=$${e#*:}; echo "go test -race $$m $$pkgs"; \
		(cd $$m && WASMESH_REQUIRE_FIXTURES=1 $(GO) test -race -count=1 -timeout 20m $${pkgs//,/ }) || exit 1; done
	@mkdir -p $(RACE_BIN) && cp $(BIN)/* $(RACE_BIN)/
	@echo "go build -race testenv/cmd/meshproxy -> build/race-bin/meshproxy"
	@cd testenv && $(GO) build -race -o $(RACE_BIN)/meshproxy ./cmd/meshproxy
	@echo "go test testenv ./proxy/e2e/... (race-built meshproxy)"
	@cd testenv && WASMESH_BIN_DIR=$(RACE_BIN) GORACE=halt_on_error=1 WASMESH_REQUIRE_FIXTURES=1 \
		$(GO) test -count=1 -timeout 20m ./proxy/e2e/...

# Fuzzing: every Go fuzz target of the workspace (func FuzzXxx(f *testing.F) in a _test.go
# file, found by grep, so a new one is picked up), one after another, each for FUZZTIME (Go's
# -fuzztime: a duration, or Nx for N inputs) with two workers. A crash is written to the
# target's testdata/fuzz/FuzzXxx/ (commit it: it is then a regression test of plain go test);
# the targets that failed are listed at the end. `make test` runs the checked-in corpora.
FUZZTIME ?= 30s
fuzz:
	@failed=""; start=$$(date +%s); \
	for f in $$(grep -rl --include='*_test.go' -E '^func Fuzz\w*\(f \*testing\.F\)' $(MODULES) | grep -v /testdata/ | sort); do \
		m=$${f%%/*}; d=$$(dirname $${f#*/}); \
		for t in $$(grep -oE '^func Fuzz\w*\(f \*testing\.F\)' $$f | sed -E 's/^func (Fuzz\w*).*/\1/'); do \
			echo "fuzz $$m/$$d $$t for $(FUZZTIME)"; \
			(cd $$m && $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -parallel 2 ./$$d) || failed="$$failed $$m/$$d:$$t"; \
		done; \
	done; \
	echo "fuzz: $$(( $$(date +%s) - start ))s in all"; \
	if [ -n "$$failed" ]; then echo "fuzz targets that failed:$$failed"; exit 1; fi

# Mutation testing (gremlins) of the core packages: each mutant is run against the package's
# own tests; the table of killed and lived mutants is printed per package. Not run in CI.
GREMLINS_VERSION := v0.6.0
TOOLS := $(CACHE)/tools
MUTATE_PKGS ?= controlplane:./server controlplane:./push controlplane:./pusher controlplane:./meshstate \
	controlplane:./xds controlplane:./registry wasm:./host agent:./drain agent:./supervisor filters:./quota filters:./telemetry
# Extra gremlins flags for every package, e.g. MUTATE_FLAGS=--dry-run (count the mutants), or
# -E 'regexp' to leave files out (docs/mutation.md: sampling the big packages).
MUTATE_FLAGS ?=
mutate:
	@test -x $(TOOLS)/gremlins-$(GREMLINS_VERSION) || { mkdir -p $(TOOLS) && \
		GOBIN=$(TOOLS) $(GO) install github.com/go-gremlins/gremlins/cmd/gremlins@$(GREMLINS_VERSION) && \
		mv $(TOOLS)/gremlins $(TOOLS)/gremlins-$(GREMLINS_VERSION); }
	@mkdir -p build/mutate
	@for e in $(MUTATE_PKGS); do m=$${e%%:*}; p=$${e#*:}; n=$$(echo $$m/$${p#./} | tr / -); \
		echo "gremlins $$m $$p"; \
		(cd $$m && $(TOOLS)/gremlins-$(GREMLINS_VERSION) unleash --workers 1 --timeout-coefficient 10 \
			$(MUTATE_FLAGS) -o $(ROOT)/build/mutate/$$n.json $$p > $(ROOT)/build/mutate/$$n.txt 2>&1); \
		tail -n 8 build/mutate/$$n.txt; done

bench: build fixtures
	@for m in $(MODULES); do echo "go bench $$m"; \
		(cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...) || exit 1; done

# The soak (testenv/e2e TestSoak): the local mesh at 300 requests/s with a route change every
# second, a backend scaled down and up every 30 s and a certificate rotation every 5 minutes,
# for DURATION; it fails on any failed request, on growth of a process's memory, goroutines or
# descriptors, or of push convergence P99, and logs the figures. make test runs a 150 s one.
DURATION ?= 30m
soak: build fixtures
	@mkdir -p build; echo "soak for $(DURATION), log in build/soak.log"; \
	(cd testenv && WASMESH_SOAK_DURATION=$(DURATION) WASMESH_REQUIRE_FIXTURES=1 \
		$(GO) test -count=1 -v -timeout 0 -run '^TestSoak$$' ./e2e) > build/soak.log 2>&1; rc=$$?; \
	grep -E '^(---|ok|FAIL)|soak_test.go|Error' build/soak.log; exit $$rc

# The local mesh: discovery, the sample application's pods (agent -> proxy -> echo) on
# loopback, steady traffic and a live summary; Ctrl-C drains and stops everything.
# MESH_PROXY=envoy runs a real Envoy from PATH instead of meshproxy.
run: build tools
	@bin/meshrun

# The same mesh on a real Kubernetes control plane (kube-apiserver, etcd, controller manager,
# scheduler from kube-bin), one node running the pods as processes, discovery installed from
# controlplane/deploy as 2 replicas, the sample as Deployments and Services with sidecars,
# steady traffic and a live summary, in a network namespace of its own; Ctrl-C stops it.
run-k8s: build kube-bin
	@bin/meshrun-k8s

# Kubernetes: Istio's CRDs of the kinds discovery watches, taken from the istio.io/api module
# it builds with, and controlplane/deploy's manifests, into build/deploy/ for
# `kubectl apply --server-side -f build/deploy/`. DISCOVERY_IMAGE is the image the Deployment runs.
DISCOVERY_IMAGE ?= wasmesh/discovery:latest
manifests:
	@cd controlplane && $(GO) run ./deploy/cmd/manifests --out $(ROOT)/build/deploy --image $(DISCOVERY_IMAGE)

clean:
	rm -rf $(BIN) build

FORCE:
