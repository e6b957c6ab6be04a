package sidecar_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
)

// The pod tells discovery it is unhealthy until ready, healthy once ready, and
// unhealthy again as soon as it is asked to terminate, before it drains.
func TestHealthReportedToDiscovery(t *testing.T) {
	r := start(t, pod{appPorts: []int{18080}, proxyConfig: `"terminationDrainDuration":"1s"`})
	disc := r.discovery
	require.Eventually(t, func() bool { s, _ := disc.LastReport(); return s != "<none>" && s != "" }, 10*time.Second, 20*time.Millisecond,
		"a pod whose proxy has no config yet is reported unhealthy")
	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond)

	disc.Configure(proxytest.Config{Inbound: []string{r.ip + ":18080"}})
	require.Eventually(t, func() bool { s, _ := disc.LastReport(); return s == "" }, 10*time.Second, 20*time.Millisecond,
		"a ready pod is reported healthy")
	_, node := disc.Reports()
	assert.Contains(t, node, "sidecar~"+r.ip+"~web-5d9c7b6f4-x7k2p.shop~shop.svc.cluster.local")

	r.cancel()
	require.Eventually(t, func() bool { s, _ := disc.LastReport(); return s == "pod is terminating" }, 5*time.Second, 10*time.Millisecond)
	_, n := disc.LastReport()
	assert.Equal(t, 503, func() int { c, _ := r.get("/healthz/ready", 15020); return c }(), "still draining when the report arrived")
	require.NoError(t, r.wait(t, 10*time.Second))
	_, after := disc.LastReport()
	assert.Equal(t, n, after, "nothing reported after termination began")
}

// A certificate rotation hot-restarts the proxy; while the new epoch initializes (its
// admin answers INITIALIZING: discovery holds its answer) the old one serves, so the pod
// stays ready and discovery hears nothing but healthy.
func TestCertificateRotationKeepsPodReady(t *testing.T) {
	r := start(t, pod{appPorts: []int{18080}, configured: true})
	disc := r.discovery
	// The application listens on the pod's localhost, its inbound listener elsewhere.
	app := serveApplication(t, r.ip+":18080")
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	disc.Configure(proxytest.Config{Inbound: []string{proxytest.Loopback(t, 18080) + ":18080"}})
	require.Eventually(t, r.readyIs(200, ""), 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { s, _ := disc.LastReport(); return s == "" }, 10*time.Second, 20*time.Millisecond)
	_, before := disc.LastReport()

	disc.HoldNewStreams()
	require.NoError(t, os.WriteFile(r.certs, []byte("rotated"), 0o600))
	// Epoch 1 initializes until discovery answers it: the test lets it initialize for 50
	// polls after it first saw it, checking that the pod stays ready throughout.
	sawInit, polls := false, 0
	deadline := time.After(15 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !r.epochLive(1)() {
		if state, _, err := r.agent.Admin().Ready(context.Background()); err == nil && state == "INITIALIZING" {
			sawInit = true // epoch 1's admin: not live yet
		}
		code, body := r.get("/healthz/ready", 15020)
		require.Equal(t, 200, code, "the pod stays ready during the hot restart: %s", body)
		if sawInit {
			if polls++; polls == 50 {
				disc.Release()
			}
		}
		select {
		case <-deadline:
			t.Fatal("epoch 1 never became live")
		case <-tick.C:
		}
	}
	require.True(t, sawInit, "the admin API answered for the initializing epoch 1 at some point")

	// The application stops listening: the next health check, made after the hand-over,
	// reports it. Reports reach discovery in order, so once that one arrived every report
	// of a check made during or after the rotation has too; and its reason shows that
	// check found the proxy ready (readiness is checked before the application ports).
	require.NoError(t, app.Close())
	var marker int
	var reports []string
	require.Eventually(t, func() bool {
		reports, _ = disc.Reports()
		for i := before; i < len(reports); i++ {
			if strings.HasPrefix(reports[i], "application port 18080") {
				marker = i
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the closed application port is reported")
	for _, s := range reports[before:marker] {
		assert.Empty(t, s, "only healthy reports during and after the rotation")
	}
}

// serveApplication accepts (and closes) connections on addr, as the application's port
// does for the agent's check, until the returned listener is closed.
func serveApplication(t *testing.T, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l
}
