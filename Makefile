# wasmesh build, test, bench and run.
#
# Everything a fresh machine needs is installed from here: Go modules from the module
# proxy, Node.js/npm from Debian when missing (for the AssemblyScript test fixture).

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

# Test binaries read these to find the artifacts built here.
export WASMESH_BIN_DIR := $(BIN)
export WASMESH_WASM_DIR := $(WASM_OUT)
export WASMESH_AS_FIXTURE := $(AS_FIXTURE)

.PHONY: all build deps tools wasm fixtures vet test bench run clean

all: build

deps:
	@for m in $(MODULES); do (cd $$m && $(GO) mod download) || exit 1; done

# Node.js and npm build the AssemblyScript fixture; Debian provides them when absent.
tools:
	@command -v npm >/dev/null 2>&1 || { \
		echo "installing nodejs and npm from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }

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

fixtures: tools
	@mkdir -p $(dir $(AS_FIXTURE))
	@if [ -x wasm/testdata/assemblyscript/build.sh ]; then wasm/testdata/assemblyscript/build.sh $(AS_FIXTURE); fi

vet: deps
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	@for m in $(MODULES); do echo "go vet $$m"; (cd $$m && $(GO) vet ./...) || exit 1; done
	@if [ -d filters ]; then echo "go vet filters (wasip1)"; cd filters && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...; fi

# WASMESH_REQUIRE_FIXTURES turns a missing build artifact into a test failure instead of a skip.
test: vet build fixtures
	@for m in $(MODULES); do echo "go test $$m"; \
		(cd $$m && WASMESH_REQUIRE_FIXTURES=1 $(GO) test -count=1 -timeout 20m ./...) || exit 1; done

bench: build fixtures
	@for m in $(MODULES); do echo "go bench $$m"; \
		(cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...) || exit 1; done

# The local mesh: discovery, the sample application's pods (agent -> proxy -> echo) on
# loopback, steady traffic and a live summary; Ctrl-C drains and stops everything.
# MESH_PROXY=envoy runs a real Envoy from PATH instead of meshproxy.
run: build
	@bin/meshrun

clean:
	rm -rf $(BIN) build

FORCE:
