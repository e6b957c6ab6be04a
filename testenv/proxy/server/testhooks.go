package server

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// Test hooks: environment variables that only tests set, for what a test of a program that
// drives the proxy (the agent) must see and no real input can produce cheaply. Production
// never sets them; they are listed in testenv/proxy/README.md.
const (
	// EnvTestWasmCounters names a file of "<name> <value>" lines: counters the proxy
	// exposes as if a Wasm filter had defined and counted them (names without the
	// wasmcustom. namespace, tags encoded in the name as the filters do).
	EnvTestWasmCounters = "WASMESH_TEST_WASM_COUNTERS"
	// EnvTestAdminPosts names a file the proxy appends the path and query of every admin
	// POST to, one a line, before serving it.
	EnvTestAdminPosts = "WASMESH_TEST_ADMIN_POSTS"
)

// TestHooks are the test hooks a process was started with (empty in production).
type TestHooks struct {
	// WasmCounters is EnvTestWasmCounters.
	WasmCounters string
	// AdminPosts is EnvTestAdminPosts.
	AdminPosts string
}

// TestHooksFromEnv reads the test hooks from the environment.
func TestHooksFromEnv() TestHooks {
	return TestHooks{WasmCounters: os.Getenv(EnvTestWasmCounters), AdminPosts: os.Getenv(EnvTestAdminPosts)}
}

// wasmCounters reads EnvTestWasmCounters' file into external stats.
func wasmCounters(path string) ([]stats.ExternalStat, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvTestWasmCounters, err)
	}
	defer f.Close()
	var out []stats.ExternalStat
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		v, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if !ok || err != nil || v < 0 {
			return nil, fmt.Errorf("%s: %s:%d: want \"<name> <count>\", got %q", EnvTestWasmCounters, path, n, line)
		}
		out = append(out, stats.ExternalStat{Name: name, Kind: stats.KindCounter, Value: v})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", EnvTestWasmCounters, err)
	}
	return out, nil
}

// applyTestHooks installs the hooks that act on the stats store (before Start).
func (s *Server) applyTestHooks() error {
	if s.opts.Test.WasmCounters == "" {
		return nil
	}
	counters, err := wasmCounters(s.opts.Test.WasmCounters)
	if err != nil {
		return err
	}
	s.store.AddExternal(func() []stats.ExternalStat { return counters })
	return nil
}

// recordAdminPosts opens EnvTestAdminPosts' file for the admin server, when set.
func (s *Server) recordAdminPosts() error {
	if s.opts.Test.AdminPosts == "" {
		return nil
	}
	f, err := os.OpenFile(s.opts.Test.AdminPosts, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvTestAdminPosts, err)
	}
	go func() {
		<-s.ctx.Done()
		_ = f.Close()
	}()
	s.admin.RecordPosts(f)
	return nil
}
