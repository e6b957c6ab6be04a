package kubemesh_test

import (
	"testing"

	"github.com/wasmesh/wasmesh/testenv/kubemesh"
)

// The sample on Kubernetes: discovery's two replicas from its manifests, the bookinfo
// Deployments with sidecars, and a request through the mesh.
func TestSampleOnKubernetes(t *testing.T) {
	m, ctx := startMesh(t, kubemesh.Options{})
	took := applySample(t, ctx, m)
	t.Logf("first successful request through the mesh %v after the sample was applied", took)
}
