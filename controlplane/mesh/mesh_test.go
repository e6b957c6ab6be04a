package mesh

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	meshconfig "istio.io/api/mesh/v1alpha1"
)

func TestParseOverlaysDefaults(t *testing.T) {
	m, err := Parse("mesh.yaml", []byte("connectTimeout: 2s\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\ndefaultConfig: {drainDuration: 3s}\n"))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, m.GetConnectTimeout().AsDuration())
	assert.Equal(t, meshconfig.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY, m.GetOutboundTrafficPolicy().GetMode())
	assert.Equal(t, "istio-system", m.GetRootNamespace())
	assert.Equal(t, 3*time.Second, m.GetDefaultConfig().GetDrainDuration().AsDuration())
	assert.Equal(t, int32(15020), m.GetDefaultConfig().GetStatusPort())
}

func TestParseRejectsUnknownField(t *testing.T) {
	_, err := Parse("mesh.yaml", []byte("connectTimeout: 2s\nbogus: 1\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "mesh.yaml")
	assert.Contains(t, err.Error(), "bogus")
}

func TestReloadKeepsLastGood(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mesh.yaml")
	require.NoError(t, os.WriteFile(p, []byte("connectTimeout: 2s\n"), 0o644))
	w, err := NewWatcher(p, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	calls := 0
	w.AddHandler(func() { calls++ })
	require.NoError(t, os.WriteFile(p, []byte("connectTimeout: [\n"), 0o644))
	w.Reload()
	assert.Error(t, w.LastError())
	assert.Equal(t, 2*time.Second, w.Mesh().GetConnectTimeout().AsDuration())
	require.NoError(t, os.WriteFile(p, []byte("connectTimeout: 4s\n"), 0o644))
	w.Reload()
	assert.NoError(t, w.LastError())
	assert.Equal(t, 4*time.Second, w.Mesh().GetConnectTimeout().AsDuration())
	assert.Equal(t, 1, calls)
}
