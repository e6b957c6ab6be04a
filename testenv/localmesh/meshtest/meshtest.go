// Package meshtest holds what the tests that run a local mesh share: where the built
// binaries and filters are, the config they write, and steady load judged by its failures.
package meshtest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/internal/meshrunner"
	"github.com/wasmesh/wasmesh/testenv/loadgen"
)

// Root is the repository's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// Binaries returns the directories of the built binaries ($WASMESH_BIN_DIR, else bin/) and
// filters ($WASMESH_WASM_DIR, else build/wasm/). Without the binaries the test is skipped,
// or fails under `make test` (WASMESH_REQUIRE_FIXTURES), which builds them first.
func Binaries(tb testing.TB) (bin, wasm string) {
	tb.Helper()
	bin, wasm = os.Getenv("WASMESH_BIN_DIR"), os.Getenv("WASMESH_WASM_DIR")
	if bin == "" {
		bin = filepath.Join(Root(), "bin")
	}
	if wasm == "" {
		wasm = filepath.Join(Root(), "build", "wasm")
	}
	for _, b := range []string{"discovery", "agent", "meshproxy", "echo"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			if RequireFixtures() {
				tb.Fatalf("%s missing in %s: %v", b, bin, err)
			}
			tb.Skipf("%s missing in %s: run `make build` (make test builds it)", b, bin)
		}
	}
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			tb.Fatal(err)
		}
		return a
	}
	return abs(bin), abs(wasm)
}

// RequireFixtures says whether a missing fixture (a binary, a filter, a tool) fails the
// test rather than skipping it: under `make test`, which installs and builds them first.
func RequireFixtures() bool { return os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" }

// ServiceEntry is a mesh service name.default on port whose pods (app=name) listen on
// targetPort.
func ServiceEntry(name string, port, targetPort int) string {
	return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ` + name + `, namespace: default}
spec:
  hosts: [` + name + `.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: ` + strconv.Itoa(port) + `, name: http, targetPort: ` + strconv.Itoa(targetPort) + `}]
  workloadSelector: {labels: {app: ` + name + `}}
`
}

// SteadyLoad sends GET requests to url at rate until stopped (a non-200 answer fails).
func SteadyLoad(t *testing.T, ctx context.Context, url string, rate float64) *loadgen.Generator {
	t.Helper()
	g, err := meshrunner.StartLoad(ctx, url, rate)
	require.NoError(t, err)
	return g
}

// WaitServed waits until the load has n more successful requests than it had.
func WaitServed(t *testing.T, g *loadgen.Generator, n int) {
	t.Helper()
	base := g.Snapshot().Succeeded
	require.Eventually(t, func() bool { return g.Snapshot().Succeeded >= base+n }, 30*time.Second, 10*time.Millisecond,
		"traffic stopped flowing: %s", func() string { s := g.Snapshot(); return s.String() }())
}

// RequireNoFailures ends the load and fails the test if any request failed.
func RequireNoFailures(t *testing.T, g *loadgen.Generator) *loadgen.Result {
	t.Helper()
	res := g.Stop()
	t.Logf("load: %s", res.String())
	require.Zero(t, res.Failed, "failed requests: %s", res.String())
	require.Positive(t, res.Succeeded)
	return &res
}

// CloseAtEnd runs close when the test ends; when it failed, the mesh's directory dir is kept
// for inspection (WASMESH_KEEP_MESH_DIR, which Close reads) and named in the log.
func CloseAtEnd(t *testing.T, dir string, close func()) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("mesh directory kept for inspection: %s", dir)
			t.Setenv("WASMESH_KEEP_MESH_DIR", "1")
		}
		close()
	})
}
