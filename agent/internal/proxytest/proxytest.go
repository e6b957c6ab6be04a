// Package proxytest gives the agent's tests a real proxy process: the test proxy in
// internal/testproxy built once per test binary, or the binary named by
// WASMESH_TEST_PROXY (for example meshproxy), and loopback addresses with free ports.
package proxytest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/wasmesh/wasmesh/agent/bootstrap"
	"github.com/wasmesh/wasmesh/agent/proxyconfig"
)

// EnvOverride names the variable that replaces the test proxy with another binary.
const EnvOverride = "WASMESH_TEST_PROXY"

// Overridden reports whether the tests run another proxy than the test proxy; tests that
// need the test proxy's knobs skip then.
func Overridden() bool { return os.Getenv(EnvOverride) != "" }

// RequireKnobs skips a test that drives the test proxy's /testproxy/* knobs.
func RequireKnobs(t testing.TB) {
	t.Helper()
	if Overridden() {
		t.Skipf("%s is set: this test needs the test proxy's knobs", EnvOverride)
	}
}

// Build returns the proxy binary: $WASMESH_TEST_PROXY, or the test proxy built into dir.
// Call it from TestMain so the build happens once per test binary.
func Build(dir string) (string, error) {
	if p := os.Getenv(EnvOverride); p != "" {
		return p, nil
	}
	out := filepath.Join(dir, "testproxy")
	cmd := exec.Command("go", "build", "-o", out, "github.com/wasmesh/wasmesh/agent/internal/testproxy")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build testproxy: %w\n%s", err, b)
	}
	return out, nil
}

// Build builds a main package of this module into dir (the agent itself, for tests that
// run it as a process).
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

// Bootstrap returns a bootstrap renderer for a pod whose localhost, wildcard and
// instance IP are all ip, as in the local mesh.
func Bootstrap(ip string) func() ([]byte, error) {
	pc := proxyconfig.Default()
	pc.DiscoveryAddress = "127.0.0.1:15010"
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
