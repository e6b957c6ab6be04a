package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// 10. With holdApplicationUntilProxyStarts the application's first outbound call, made
// before it serves, succeeds: the proxy had its config before the application started.
func TestStartupHoldApplicationFirstCallSucceeds(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	_, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod(func(s *localmesh.PodSpec) {
		s.HoldApplicationUntilProxyStarts = true
		s.StartupCall = "http://backend.default.svc.cluster.local:9081/"
	}))
	require.NoError(t, err, "the application failed its start-up call")
	assert.True(t, front.AppRunning(), "the application started and kept running")
}

// 6. A certificate rotation hot-restarts the proxy under load without failing a request.
func TestCertificateRotationUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	back, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)

	g := steadyLoad(t, ctx, front.URL("/"), 200)
	waitServed(t, g, 100)
	for _, p := range []*localmesh.Pod{back, front} {
		require.NoError(t, p.RotateCertificates())
		require.Eventually(t, func() bool { return restartEpoch(p) == 1 }, 30*time.Second, 20*time.Millisecond,
			"rotating %s's certificate starts its proxy's epoch 1", p.Spec.Name)
		waitServed(t, g, 200)
	}
	requireNoFailures(t, g)
}

// restartEpoch is the epoch of the proxy answering the pod's admin API (-1 if none).
func restartEpoch(p *localmesh.Pod) int {
	b, err := p.Admin(nilCtx(), "/server_info")
	if err != nil {
		return -1
	}
	var info struct {
		State   string `json:"state"`
		Options struct {
			RestartEpoch int `json:"restart_epoch"`
		} `json:"command_line_options"`
	}
	if json.Unmarshal(b, &info) != nil || info.State != "LIVE" {
		return -1
	}
	return info.Options.RestartEpoch
}

// 7. Discovery restarts under load: traffic flows on the last config meanwhile, the proxies
// reconnect and are brought up to date, and no request fails.
func TestControlPlaneRestartUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	_, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)

	g := steadyLoad(t, ctx, front.URL("/"), 200)
	waitServed(t, g, 100)
	require.NoError(t, m.StopDiscovery(ctx))
	waitServed(t, g, 200) // served on the last config while discovery is away
	require.NoError(t, m.StartDiscovery(ctx))
	require.Eventually(t, func() bool { return connectedProxies(m) == 2 }, 30*time.Second, 50*time.Millisecond,
		"both proxies reconnect to the new discovery")
	// A second backend pod now reaches the frontend through the new discovery.
	back2, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inClusters(front, back2.IP) }, 30*time.Second, 50*time.Millisecond,
		"the reconnected frontend proxy receives the new endpoint")
	waitServed(t, g, 200)
	requireNoFailures(t, g)
}

// connectedProxies counts the proxies discovery has a stream with.
func connectedProxies(m *localmesh.Mesh) int {
	b, err := getURL(m.DiscoveryURL("/debug/syncz"))
	if err != nil {
		return -1
	}
	var conns []struct {
		Proxy string `json:"proxy"`
	}
	if json.Unmarshal(b, &conns) != nil {
		return -1
	}
	return len(conns)
}

// inClusters reports whether ip is an endpoint in the pod's proxy (admin /clusters).
func inClusters(p *localmesh.Pod, ip string) bool {
	b, err := p.Admin(nilCtx(), "/clusters")
	return err == nil && strings.Contains(string(b), "::"+ip+":")
}
