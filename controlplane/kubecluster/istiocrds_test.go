package kubecluster_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The CRD file is the one of the istio.io/api module this module builds with.
func TestIstioCRDFileIsTheModules(t *testing.T) {
	f, err := kubecluster.IstioCRDFile()
	require.NoError(t, err)
	assert.Contains(t, f, "istio.io/api@")
	data, err := os.ReadFile(f)
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(data), "name: virtualservices.networking.istio.io"))
}
