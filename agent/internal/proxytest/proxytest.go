// Package proxytest gives the agent's tests a real proxy process, meshproxy (the mesh's
// Envoy stand-in), a stand-in for discovery to configure it (discovery.go), and loopback
// addresses with free ports.
//
// The agent's tests need the testenv module in the Go workspace (go.work): Build runs
// `go build github.com/wasmesh/wasmesh/testenv/cmd/meshproxy`, once per test binary, unless
// $WASMESH_BIN_DIR/meshproxy exists. Building a binary is not importing it: the agent
// still imports nothing of testenv.
package proxytest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/wasmesh/wasmesh/agent/bootstrap"
	"github.com/wasmesh/wasmesh/agent/proxyconfig"
)

// meshproxy's test hooks (testenv/proxy/README.md): environment variables only tests set.
const (
	// EnvWasmCounters names a file of "<name> <value>" lines the proxy exposes as counters
	// of a Wasm filter.
	EnvWasmCounters = "WASMESH_TEST_WASM_COUNTERS"
	// EnvAdminPosts names a file the proxy appends every admin POST (path and query) to.
	EnvAdminPosts = "WASMESH_TEST_ADMIN_POSTS"
)

// meshproxyPkg is the proxy the agent's tests run.
const meshproxyPkg = "github.com/wasmesh/wasmesh/testenv/cmd/meshproxy"

// Build returns the meshproxy binary: $WASMESH_BIN_DIR/meshproxy when it exists (the
// Makefile builds it), else meshproxy built into dir. Call it from TestMain so the build
// happens once per test binary.
func Build(dir string) (string, error) {
	if bin := os.Getenv("WASMESH_BIN_DIR"); bin != "" {
		p := filepath.Join(bin, "meshproxy")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := BuildPackage(dir, meshproxyPkg, "meshproxy")
	if err != nil {
		return "", fmt.Errorf("%w\n(the agent's tests run meshproxy: they need the testenv module in the Go workspace, go.work)", err)
	}
	return p, nil
}

// BuildPackage builds a main package of the workspace into dir (the agent itself, for
// tests that run it as a process).
func BuildPackage(dir, pkg, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// Loopback returns a 127.x.y.z address, away from the ranges the local mesh uses, on
// which every given port is free, so tests can use the mesh's fixed ports (15000, 15020,
// 15021, 15090) side by side.
func Loopback(t testing.TB, ports ...int) string {
	t.Helper()
	for range 100 {
		ip := fmt.Sprintf("127.%d.%d.%d", 100+rand.IntN(150), rand.IntN(256), 1+rand.IntN(254))
		if free(ip, ports) {
			return ip
		}
	}
	t.Fatal("no free loopback address")
	return ""
}

func free(ip string, ports []int) bool {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ls = append(ls, l)
	}
	return true
}

// BaseID returns a hot-restart domain (--base-id, WASMESH_BASE_ID) of the test's own, so
// a new epoch never reaches another test's proxy, as each pod of the local mesh has its own.
func BaseID() uint64 { return 1<<20 + rand.Uint64N(1<<31) }

// Bootstrap returns a bootstrap renderer for a pod whose localhost, wildcard and
// instance IP are all ip, as in the local mesh, and whose discovery is at discovery.
func Bootstrap(ip, discovery string) func() ([]byte, error) {
	pc := proxyconfig.Default()
	pc.DiscoveryAddress = discovery
	return func() ([]byte, error) {
		p, err := bootstrap.NewParams(bootstrap.Input{
			PodName: "test-7d4b9c8f6d-abcde", PodNamespace: "test", InstanceIP: ip,
			Localhost: ip, Wildcard: ip, ProxyConfig: pc, Version: "test",
		})
		if err != nil {
			return nil, err
		}
		return bootstrap.DefaultTemplate().Render(p, nil, "")
	}
}

// Main is a TestMain body: it builds the proxy into a temporary directory, stores its
// path in *binary, runs the tests and removes the directory.
func Main(m *testing.M, binary *string) int {
	dir, err := os.MkdirTemp("", "agent-proxytest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if *binary, err = Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// Processes returns the running proxy processes (not zombies) whose bootstrap (-c) is
// under dir, pid by epoch: what a test learns of the processes without asking them.
func Processes(dir string) map[int]int {
	out := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		epoch, ok := proxyEpoch(pid, dir)
		if ok && running(pid) {
			out[epoch] = pid
		}
	}
	return out
}

// proxyEpoch reads pid's command line: Envoy's, with -c under dir.
func proxyEpoch(pid int, dir string) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	under, epoch := false, 0
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-c":
			under = strings.HasPrefix(args[i+1], dir+string(filepath.Separator))
		case "--restart-epoch":
			epoch, _ = strconv.Atoi(args[i+1])
		}
	}
	return epoch, under
}

// running reports whether pid is a running process, not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	return i > 0 && len(f) > 0 && f[0] != "Z"
}

// WasmCounters writes the counters file of meshproxy's WASMESH_TEST_WASM_COUNTERS hook
// into dir and returns the variable to add to the proxy's environment.
func WasmCounters(t testing.TB, dir string, lines []string) string {
	t.Helper()
	p := filepath.Join(dir, "wasm-counters")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return EnvWasmCounters + "=" + p
}

// AdminPosts reads the file of meshproxy's WASMESH_TEST_ADMIN_POSTS hook: the admin
// POSTs the proxy received, in order (none before the first).
func AdminPosts(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return strings.Fields(string(b)), err
}

// Output collects a process's output: os/exec copies into it from its own goroutine
// while the test reads it for messages.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
