package probe

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func listen(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

func port(l net.Listener) int { return l.Addr().(*net.TCPAddr).Port }

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("User-Agent", "kube-probe/1.30")
	h.ServeHTTP(rec, req)
	return rec
}

func TestForwarding(t *testing.T) {
	// An HTTP application: healthy on /healthz when the probe's header is present.
	appL := listen(t)
	var seenUA string
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenUA = r.Header.Get("User-Agent")
		if r.URL.Path == "/healthz" && r.Header.Get("X-Probe") == "yes" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
	})}
	go app.Serve(appL)
	t.Cleanup(func() { app.Close() })

	tcpUp := listen(t)
	tcpDown := listen(t)
	downPort := port(tcpDown)
	tcpDown.Close()

	// A gRPC application with the standard health service.
	grpcL := listen(t)
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("billing", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	go gs.Serve(grpcL)
	t.Cleanup(gs.Stop)

	probers, err := Parse(fmt.Sprintf(`{
		"/app-health/app/livez": {"httpGet": {"path": "/healthz", "port": %d, "httpHeaders": [{"name": "X-Probe", "value": "yes"}]}, "timeoutSeconds": 2},
		"/app-health/app/startupz": {"httpGet": {"path": "broken", "port": "%d"}},
		"/app-health/app/readyz": {"tcpSocket": {"port": %d}},
		"/app-health/db/readyz": {"tcpSocket": {"port": %d}},
		"/app-health/grpc/livez": {"grpc": {"port": %d}},
		"/app-health/grpc/readyz": {"grpc": {"port": %d, "service": "billing"}}
	}`, port(appL), port(appL), port(tcpUp), downPort, port(grpcL), port(grpcL)))
	require.NoError(t, err)
	h := NewHandler(probers, "127.0.0.1")

	cases := []struct {
		path string
		code int
	}{
		{"/app-health/app/livez", http.StatusNoContent},
		{"/app-health/app/startupz", http.StatusInternalServerError},
		{"/app-health/app/readyz", http.StatusOK},
		{"/app-health/db/readyz", http.StatusServiceUnavailable},
		{"/app-health/grpc/livez", http.StatusOK},
		{"/app-health/grpc/readyz", http.StatusServiceUnavailable},
		{"/app-health/nobody/livez", http.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			assert.Equal(t, c.code, get(t, h, c.path).Code)
		})
	}
	assert.Equal(t, "kube-probe/1.30", seenUA, "the kubelet's headers reach the application")
}

func TestParseErrorsNameTheProbe(t *testing.T) {
	for text, want := range map[string]string{
		`{"/app-health/app/livez": {}}`:                                         "/app-health/app/livez",
		`{"/healthz": {"tcpSocket": {"port": 80}}}`:                             "/healthz",
		`{"/app-health/app/livez": {"tcpSocket": {"port": "http"}}}`:            "port",
		`{"/app-health/app/livez": {"exec": {"command": ["true"]}}}`:            "exec",
		`{"/app-health/app/livez": {"httpGet": {"port": 80, "scheme": "FTP"}}}`: "FTP",
		`not json`: EnvName,
	} {
		_, err := Parse(text)
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want)
		assert.Contains(t, err.Error(), EnvName)
	}
}
