// Package meshtest holds what the tests that run a local mesh share: where the built
// binaries and filters are, and the config they write.
package meshtest

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
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
			if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
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
