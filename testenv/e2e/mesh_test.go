// Package e2e proves end to end what the mesh promises: each test builds a small mesh on
// loopback (discovery, pods of agent → proxy → echo), sends real traffic with a bounded load
// generator, and checks figures that fail when the behaviour is missing.
package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/loadgen"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// startMesh starts a mesh with config files, closed when the test ends. It skips when the
// binaries are missing (they are built by `make test`, where a missing one fails), and
// when MESH_PROXY=envoy asks for an Envoy the machine does not have.
func startMesh(t *testing.T, config map[string]string) (*localmesh.Mesh, context.Context) {
	t.Helper()
	return startMeshFor(t, config, 3*time.Minute)
}

// startMeshFor is startMesh for a test that runs up to d.
func startMeshFor(t *testing.T, config map[string]string, d time.Duration) (*localmesh.Mesh, context.Context) {
	t.Helper()
	bin, wasmDir := meshtest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	m, err := localmesh.Start(ctx, localmesh.Options{BinDir: bin, WasmDir: wasmDir, Config: config, Logf: t.Logf})
	if err != nil && strings.Contains(err.Error(), "no envoy on PATH") {
		t.Skip("MESH_PROXY=envoy but there is no envoy on PATH: install Envoy to run the suite against it")
	}
	require.NoError(t, err)
	meshtest.CloseAtEnd(t, m.Dir(), m.Close)
	return m, ctx
}

// frontBack is the smallest useful topology: a frontend that calls a backend.
func frontBack() map[string]string {
	return map[string]string{"services.yaml": meshtest.ServiceEntry("frontend", 9080, 8080) + "---\n" + meshtest.ServiceEntry("backend", 9081, 8081)}
}

func backendPod(extra ...func(*localmesh.PodSpec)) localmesh.PodSpec {
	s := localmesh.PodSpec{Labels: map[string]string{"app": "backend"}, Port: 8081}
	for _, f := range extra {
		f(&s)
	}
	return s
}

func frontendPod(extra ...func(*localmesh.PodSpec)) localmesh.PodSpec {
	s := localmesh.PodSpec{Labels: map[string]string{"app": "frontend"}, Port: 8080,
		Calls: []string{"http://backend.default.svc.cluster.local:9081/"}}
	for _, f := range extra {
		f(&s)
	}
	return s
}

// steadyLoad sends requests to url at rate until stopped.
func steadyLoad(t *testing.T, ctx context.Context, url string, rate float64) *loadgen.Generator {
	t.Helper()
	return meshtest.SteadyLoad(t, ctx, url, rate)
}

// waitServed waits until the load has n more successful requests than it had.
func waitServed(t *testing.T, g *loadgen.Generator, n int) {
	t.Helper()
	meshtest.WaitServed(t, g, n)
}

// requireNoFailures ends the load and fails the test if any request failed.
func requireNoFailures(t *testing.T, g *loadgen.Generator) *loadgen.Result {
	t.Helper()
	return meshtest.RequireNoFailures(t, g)
}
