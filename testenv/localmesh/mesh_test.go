package localmesh

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/echo"
)

// binDir finds the built binaries, or skips the test when they are missing (fails under
// make test, which builds them first).
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WASMESH_BIN_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "bin")
	}
	if _, err := os.Stat(filepath.Join(dir, "agent")); err != nil {
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			t.Fatalf("binaries missing in %s: %v", dir, err)
		}
		t.Skipf("binaries missing in %s (run `make build`, or `make test`)", dir)
	}
	abs, err := filepath.Abs(dir)
	require.NoError(t, err)
	return abs
}

const twoServices = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: frontend, namespace: default}
spec:
  hosts: [frontend.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, targetPort: 8080}]
  workloadSelector: {labels: {app: frontend}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: default}
spec:
  hosts: [backend.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9081, name: http, targetPort: 8081}]
  workloadSelector: {labels: {app: backend}}
`

func TestTwoPodsTalkThroughTheirSidecars(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Start(ctx, Options{BinDir: binDir(t), Config: map[string]string{"services.yaml": twoServices}, Logf: t.Logf})
	require.NoError(t, err)
	defer m.Close()

	backend, err := m.AddPod(ctx, PodSpec{Labels: map[string]string{"app": "backend"}, Port: 8081})
	require.NoError(t, err)
	frontend, err := m.AddPod(ctx, PodSpec{Labels: map[string]string{"app": "frontend"},
		Calls: []string{"http://backend.default.svc.cluster.local:9081/"}, HoldApplicationUntilProxyStarts: true})
	require.NoError(t, err)

	var a echo.Answer
	require.Eventually(t, func() bool {
		resp, err := http.Get(frontend.URL("/"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && json.Unmarshal(b, &a) == nil
	}, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, "frontend", a.Service)
	require.Len(t, a.Upstream, 1)
	require.NotNil(t, a.Upstream[0].Answer)
	assert.Equal(t, backend.Spec.Name, a.Upstream[0].Answer.Pod)

	// Every process ends with Close.
	m.Close()
	for _, p := range m.Pods() {
		assert.False(t, p.Running(), p.Spec.Name)
	}
}
