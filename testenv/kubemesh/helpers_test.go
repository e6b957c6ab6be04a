package kubemesh_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/testenv/kubemesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// startMesh starts a mesh on Kubernetes for the test, closed when it ends. It skips when
// the Kubernetes binaries or the mesh's are missing, or no network namespace can be made,
// saying which (under `make test`, WASMESH_REQUIRE_FIXTURES, each of these fails instead).
func startMesh(t *testing.T, opts kubemesh.Options) (*kubemesh.Mesh, context.Context) {
	t.Helper()
	kubecluster.RequireBinaries(t)
	if netnsErr != nil {
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			t.Fatalf("no network namespace for the pod network: %v", netnsErr)
		}
		t.Skipf("no network namespace for the pod network (the API server refuses loopback pod IPs): %v", netnsErr)
	}
	opts.BinDir, opts.WasmDir = meshtest.Binaries(t)
	opts.Logf = t.Logf
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	t.Cleanup(cancel)
	m, err := kubemesh.Start(ctx, opts)
	require.NoError(t, err)
	meshtest.CloseAtEnd(t, m.Dir(), m.Close)
	return m, ctx
}

// applySample applies the sample and waits for the first request through the mesh.
func applySample(t *testing.T, ctx context.Context, m *kubemesh.Mesh) time.Duration {
	t.Helper()
	s, err := m.Sample()
	require.NoError(t, err)
	begin := time.Now()
	require.NoError(t, m.ApplySample(ctx, s))
	first, err := m.WaitFirstRequest(ctx, 3*time.Minute)
	require.NoError(t, err)
	return first.Sub(begin)
}
