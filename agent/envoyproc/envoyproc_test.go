package envoyproc

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The command line is Envoy's; --base-id appears only when the pod has its own.
func TestArgs(t *testing.T) {
	p, err := New(Config{BinaryPath: "true", ServiceCluster: "web.default", ServiceNode: "sidecar~1~web-1.default~default.svc.cluster.local",
		LogLevel: "warning", Concurrency: 2})
	require.NoError(t, err)
	args := p.Args("/etc/istio/proxy/envoy-rev3.json", 3)
	assert.Equal(t, []string{"-c", "/etc/istio/proxy/envoy-rev3.json", "--restart-epoch", "3",
		"--drain-time-s", "1", "--drain-strategy", "immediate", "--parent-shutdown-time-s", "1", "--service-cluster", "web.default",
		"--service-node", "sidecar~1~web-1.default~default.svc.cluster.local", "--local-address-ip-version", "v4",
		"--log-level", "warning", "--concurrency", "2"}, args)
	assert.NotContains(t, args, "--base-id")

	id := uint64(3007)
	p.c.BaseID = &id
	got := p.Args("f", 0)
	assert.Equal(t, []string{"--base-id", "3007"}, got[len(got)-2:])
}
