package sidecar_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/wasmesh/wasmesh/agent/healthreport"
	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
)

// discoveryRecorder stands where discovery is and records the agent's health reports.
type discoveryRecorder struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	mu      sync.Mutex
	reports []string // "" for healthy
	node    string
}

func (d *discoveryRecorder) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if req.GetTypeUrl() != healthreport.TypeURL {
			continue
		}
		d.mu.Lock()
		d.reports = append(d.reports, req.GetErrorDetail().GetMessage())
		d.node = req.GetNode().GetId()
		d.mu.Unlock()
	}
}

// startRecorder serves a discoveryRecorder until the test ends and returns its address.
func startRecorder(t *testing.T) (*discoveryRecorder, string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rec := &discoveryRecorder{}
	srv := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, rec)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return rec, l.Addr().String()
}

func (d *discoveryRecorder) last() (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.reports) == 0 {
		return "<none>", 0
	}
	return d.reports[len(d.reports)-1], len(d.reports)
}

// The pod tells discovery it is unhealthy until ready, healthy once ready, and
// unhealthy again as soon as it is asked to terminate, before it drains.
func TestHealthReportedToDiscovery(t *testing.T) {
	proxytest.RequireKnobs(t)
	rec, addr := startRecorder(t)

	r := start(t, pod{appPorts: []int{18080}, env: []string{
		fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress":%q,"terminationDrainDuration":"1s"}`, addr)}})
	require.Eventually(t, func() bool { s, _ := rec.last(); return s != "<none>" && s != "" }, 10*time.Second, 20*time.Millisecond,
		"a pod whose proxy has no config yet is reported unhealthy")
	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond)

	r.adminPost(t, "/testproxy/xds", fmt.Sprintf(`{"inbound":["%s:18080"]}`, r.ip))
	require.Eventually(t, func() bool { s, _ := rec.last(); return s == "" }, 10*time.Second, 20*time.Millisecond,
		"a ready pod is reported healthy")
	rec.mu.Lock()
	assert.Contains(t, rec.node, "sidecar~"+r.ip+"~web-5d9c7b6f4-x7k2p.shop~shop.svc.cluster.local")
	rec.mu.Unlock()

	r.cancel()
	require.Eventually(t, func() bool { s, _ := rec.last(); return s == "pod is terminating" }, 5*time.Second, 10*time.Millisecond)
	_, n := rec.last()
	assert.Equal(t, 503, func() int { c, _ := r.get("/healthz/ready", 15020); return c }(), "still draining when the report arrived")
	require.NoError(t, r.wait(t, 10*time.Second))
	_, after := rec.last()
	assert.Equal(t, n, after, "nothing reported after termination began")
}

// A certificate rotation hot-restarts the proxy; while the new epoch initializes (its
// admin answers INITIALIZING) the old one serves, so the pod stays ready and discovery
// hears nothing but healthy.
func TestCertificateRotationKeepsPodReady(t *testing.T) {
	proxytest.RequireKnobs(t)
	rec, addr := startRecorder(t)

	r := start(t, pod{appPorts: []int{18080},
		proxyEnv: []string{"TESTPROXY_CONFIG_ON_START=1", "TESTPROXY_CHILD_INIT=1500ms"},
		env:      []string{fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress":%q}`, addr)}})
	// The application listens on the pod's localhost, its inbound listener elsewhere.
	app := serveApplication(t, r.ip+":18080")
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	r.adminPost(t, "/testproxy/xds", fmt.Sprintf(`{"inbound":["%s:18080"]}`, proxytest.Loopback(t, 18080)))
	require.Eventually(t, r.readyIs(200, ""), 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { s, _ := rec.last(); return s == "" }, 10*time.Second, 20*time.Millisecond)
	_, before := rec.last()

	require.NoError(t, os.WriteFile(r.certs, []byte("rotated"), 0o600))
	sawInit := false
	deadline := time.After(15 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !r.epochLive(1)() {
		if state, _, err := r.agent.Admin().Ready(context.Background()); err == nil && state == "INITIALIZING" {
			sawInit = true // epoch 1's admin: not live yet
		}
		code, body := r.get("/healthz/ready", 15020)
		require.Equal(t, 200, code, "the pod stays ready during the hot restart: %s", body)
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
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for i := before; i < len(rec.reports); i++ {
			if strings.HasPrefix(rec.reports[i], "application port 18080") {
				marker = i
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the closed application port is reported")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.reports[before:marker] {
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
