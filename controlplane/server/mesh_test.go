package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/debug"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/meshstate"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source"
	"github.com/wasmesh/wasmesh/controlplane/source/filedir"
)

// The small mesh every test starts from: two services in namespace demo whose endpoints
// are workloads (registered by the helper), so an endpoint change is a registry event, as
// a proxy registering itself makes one.
const (
	frontendYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: frontend, namespace: demo}
spec:
  hosts: [frontend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http, targetPort: 8080}]
  workloadSelector: {labels: {app: frontend}}
`
	backendYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9081, name: http, targetPort: 8081}]
  workloadSelector: {labels: {app: backend}}
`
	extraYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec:
  hosts: [extra.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9082, name: http}]
  endpoints: [{address: 127.10.9.9}]
`

	frontendCluster = "outbound|9080||frontend.demo.svc.cluster.local"
	backendCluster  = "outbound|9081||backend.demo.svc.cluster.local"
	extraCluster    = "outbound|9082||extra.demo.svc.cluster.local"
)

// testMesh is an xDS server serving the small mesh on a loopback listener, and the levers
// that change the mesh through the paths discovery wires: config files read by the
// directory source (a full push) and workloads in the registry (an endpoints-only push).
type testMesh struct {
	t       testing.TB
	srv     *server.Server
	pusher  *pusher.Pusher
	metrics *metrics.Metrics
	state   *meshstate.State
	configs *filedir.Source
	dir     string
	conn    *grpc.ClientConn
	ads     discoverygrpc.AggregatedDiscoveryServiceClient
	// warnings are the server's log records at level WARN and above.
	warnings *warnings
}

// warnings keeps the log lines at level WARN and above (a slog TextHandler writes each
// record in one Write).
type warnings struct {
	mu    sync.Mutex
	lines []string
}

func (w *warnings) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte(" level=WARN ")) || bytes.Contains(b, []byte(" level=ERROR ")) {
		w.mu.Lock()
		w.lines = append(w.lines, string(b))
		w.mu.Unlock()
	}
	return len(b), nil
}

// count is the number of warnings containing s.
func (w *warnings) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, l := range w.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// newMesh is the one place that knows how a server is built (as discovery.New assembles
// it): when the construction API changes, only this function does. tune, if given, changes
// the server's options.
func newMesh(t testing.TB, tune ...func(*server.Options)) *testMesh {
	t.Helper()
	var logOut io.Writer = io.Discard
	if os.Getenv("WASMESH_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	m := &testMesh{t: t, dir: t.TempDir(), metrics: metrics.New(prometheus.NewRegistry()), warnings: &warnings{}}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logOut, m.warnings), &slog.HandlerOptions{Level: slog.LevelDebug}))
	m.writeFile("frontend.yaml", frontendYAML)
	m.writeFile("backend.yaml", backendYAML)
	m.configs = filedir.New(m.dir, log, m.metrics)
	m.state = meshstate.New(log, registry.NewServiceEntries(log, m.metrics), func(r *push.Request) { m.pusher.ConfigUpdate(r) },
		filedir.Name, registry.ProxiesSource)

	m.pusher = pusher.New(log, m.metrics, push.DebounceOptions{After: 10 * time.Millisecond, Max: time.Second, EnableEDS: true},
		pusher.Deps{Registry: m.state.Registry, Configs: m.state, Mesh: mesh.Default})
	opts := server.Defaults()
	// Tests reconnect at once on purpose; they are not proxies coming back after a restart.
	opts.ReconnectWindow = 0
	for _, f := range tune {
		f(&opts)
	}
	m.srv = server.New(log, m.metrics, opts, server.Deps{Generator: server.Pushes(m.pusher)})
	// The first workloads come before the directory has synced: they are in the first
	// snapshot, and nothing is pushed for them.
	m.setWorkload("frontend", "frontend-1", "127.10.0.1")
	m.setWorkload("backend", "backend-1", "127.10.0.2")
	require.NoError(t, m.configs.Publish(m.state))

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran, pushed, served := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() { m.srv.Run(ctx); close(ran) }()
	go func() { m.pusher.Run(ctx); close(pushed) }()
	go func() { served <- server.Serve(ctx, m.srv.GRPCServer(), lis, time.Second) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		cc.Close()
		cancel()
		<-ran
		<-pushed
		require.NoError(t, <-served)
	})
	require.Eventually(t, m.srv.Ready, 10*time.Second, time.Millisecond)
	m.conn, m.ads = cc, discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
	return m
}

// in returns the mesh for a subtest: what it opens fails that test.
func (m *testMesh) in(t *testing.T) *testMesh {
	sub := *m
	sub.t = t
	return &sub
}

func (m *testMesh) writeFile(name, data string) {
	require.NoError(m.t, os.WriteFile(filepath.Join(m.dir, name), []byte(data), 0o644))
}

// writeConfig changes a config file and has the source read it (a full push).
func (m *testMesh) writeConfig(name, data string) {
	m.writeFile(name, data)
	require.NoError(m.t, m.configs.Sync())
}

// removeConfig deletes a config file and has the source read the directory (a full push).
func (m *testMesh) removeConfig(name string) {
	require.NoError(m.t, os.Remove(filepath.Join(m.dir, name)))
	require.NoError(m.t, m.configs.Sync())
}

// setWorkload adds or updates a workload of app in demo (an endpoints-only push of its
// service).
func (m *testMesh) setWorkload(app, name, ip string) {
	m.state.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{
		{Name: name, Namespace: "demo", Labels: map[string]string{"app": app}, IPs: []string{ip}}}})
}

// syncz returns what /debug/syncz shows of a proxy's connection, by short type ("cds", ...);
// nil while the proxy is not connected.
func (m *testMesh) syncz(proxyID string) map[string]server.TypeStatus {
	rec := httptest.NewRecorder()
	debug.Handler(debug.Deps{Server: m.srv}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/syncz", nil))
	require.Equal(m.t, http.StatusOK, rec.Code)
	var conns []debug.SyncStatus
	require.NoError(m.t, json.Unmarshal(rec.Body.Bytes(), &conns))
	for _, c := range conns {
		if c.ProxyID == proxyID {
			out := map[string]server.TypeStatus{}
			for _, ts := range c.Types {
				out[ts.Type] = ts
			}
			return out
		}
	}
	return nil
}
