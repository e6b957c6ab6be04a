package sidecar_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/agent/sidecar"
	"github.com/wasmesh/wasmesh/agent/statsmerge"
	"github.com/wasmesh/wasmesh/agent/supervisor"
)

var proxyBinary string

func TestMain(m *testing.M) { os.Exit(proxytest.Main(m, &proxyBinary)) }

// pod describes one test pod; the agent runs in-process, the proxy as a real process.
type pod struct {
	env         []string
	labels      map[string]string
	annotations map[string]string
	proxyEnv    []string
	appPorts    []int
	retry       supervisor.Retry
}

type running struct {
	ip      string
	dir     string
	certs   string
	starts  string
	agent   *sidecar.Agent
	cancel  context.CancelFunc
	done    chan error
	client  *http.Client
	stopped time.Time
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func options(t testing.TB, p pod) (sidecar.Options, string, string) {
	ip := proxytest.Loopback(t, 15000, 15020, 15021, 15090)
	dir := t.TempDir()
	podDir := filepath.Join(dir, "pod")
	require.NoError(t, os.MkdirAll(podDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(podDir, "labels"), []byte(podinfo.Format(p.labels)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(podDir, "annotations"), []byte(podinfo.Format(p.annotations)), 0o644))
	env := append([]string{
		"POD_NAME=web-5d9c7b6f4-x7k2p", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web",
		"INSTANCE_IP=" + ip, "WASMESH_LOCALHOST=" + ip, "WASMESH_WILDCARD=" + ip,
		"ISTIO_META_INTERCEPTION_MODE=NONE",
	}, p.env...)
	if !hasPrefix(env, "PROXY_CONFIG=") {
		env = append(env, `PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010"}`)
	}
	retry := p.retry
	if retry.MaxRetries == 0 {
		retry = supervisor.Retry{MaxRetries: 3, InitialInterval: 20 * time.Millisecond}
	}
	starts := filepath.Join(dir, "starts")
	return sidecar.Options{
		BinaryPath: proxyBinary, ConfigPath: filepath.Join(dir, "proxy"), PodInfoDir: podDir,
		DrainDuration: time.Second, ParentShutdownDuration: time.Second,
		ApplicationPorts: p.appPorts,
		CertFiles:        []string{filepath.Join(dir, "cert-chain.pem")}, CertCheckInterval: time.Hour,
		Env: env, Retry: retry, DrainPollInterval: 50 * time.Millisecond, QuitGrace: 2 * time.Second,
		ProxyEnv: append([]string{"TESTPROXY_STARTS_FILE=" + starts}, p.proxyEnv...),
		Stdout:   io.Discard, Stderr: logWriter{t},
		Log: slog.New(slog.NewTextHandler(logWriter{t}, nil)), Version: "test",
	}, ip, dir
}

func hasPrefix(env []string, p string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, p) {
			return true
		}
	}
	return false
}

func start(t *testing.T, p pod) *running {
	t.Helper()
	o, ip, dir := options(t, p)
	a, err := sidecar.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{ip: ip, dir: dir, certs: o.CertFiles[0], starts: filepath.Join(dir, "starts"), agent: a, cancel: cancel,
		done:   make(chan error, 1),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	go func() {
		err := a.Run(ctx)
		r.stopped = time.Now()
		r.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.done:
			r.done <- err
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
	})
	return r
}

// wait returns the agent's result, failing the test after timeout.
func (r *running) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(timeout):
		t.Fatal("agent still running")
		return nil
	}
}

func (r *running) get(path string, port int) (int, string) {
	return r.getFrom(net.JoinHostPort(r.ip, strconv.Itoa(port)), path)
}

func (r *running) getFrom(hostPort, path string) (int, string) {
	resp, err := r.client.Get("http://" + hostPort + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *running) adminPost(t *testing.T, path, body string) {
	t.Helper()
	resp, err := r.client.Post("http://"+r.agent.Admin().Address()+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
}

func (r *running) readyIs(code int, contains string) func() bool {
	return func() bool {
		c, body := r.get("/healthz/ready", 15020)
		return c == code && strings.Contains(body, contains)
	}
}

func (r *running) epochLive(epoch int) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		si, err := r.agent.Admin().ServerInfo(ctx)
		return err == nil && si.State == "LIVE" && si.CommandLineOptions.RestartEpoch == epoch
	}
}

func freePort(t *testing.T, ip string) int {
	l, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestReadinessTransitions(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, pod{appPorts: []int{18080}, env: []string{`PROXY_CONFIG={"discoveryAddress":"127.0.0.1:15010","terminationDrainDuration":"1s"}`}})

	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond,
		"a proxy waiting for its first config from discovery is not ready")
	// The agent's status port answers before the proxy process has opened its 15021
	// listener (as in a pod, where the probe is refused until Envoy starts); once open,
	// it must route to the agent and answer the agent's 503.
	require.Eventually(t, func() bool {
		code, _ := r.get("/healthz/ready", 15021)
		return code != 0
	}, 10*time.Second, 20*time.Millisecond, "the proxy opens its readiness listener")
	code, _ := r.get("/healthz/ready", 15021)
	assert.Equal(t, 503, code, "the proxy's readiness listener routes to the agent")

	r.adminPost(t, "/testproxy/xds", `{}`)
	require.Eventually(t, r.readyIs(503, "application ports 18080"), 5*time.Second, 20*time.Millisecond)

	r.adminPost(t, "/testproxy/xds", fmt.Sprintf(`{"inbound":["%s:18080"]}`, r.ip))
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)
	code, _ = r.get("/healthz/ready", 15021)
	assert.Equal(t, 200, code, "ready through the proxy's 15021 listener too")

	r.adminPost(t, "/healthcheck/fail", "")
	require.Eventually(t, r.readyIs(503, "DRAINING"), 5*time.Second, 20*time.Millisecond)
	r.adminPost(t, "/healthcheck/ok", "")
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)

	r.cancel()
	require.Eventually(t, r.readyIs(503, "draining"), 5*time.Second, 10*time.Millisecond, "a terminating pod is not ready")
	require.NoError(t, r.wait(t, 10*time.Second))
}

func TestCertificateChangeStartsNewEpoch(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, pod{proxyEnv: []string{"TESTPROXY_CONFIG_ON_START=1"}})
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)

	require.NoError(t, os.WriteFile(r.certs, []byte("rotated"), 0o600))
	require.Eventually(t, r.epochLive(1), 10*time.Second, 20*time.Millisecond, "a new certificate starts epoch 1")
	b, err := os.ReadFile(r.starts)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2)
	pid0, _ := strconv.Atoi(strings.Fields(lines[0])[1])
	assert.NoError(t, syscallKill0(pid0), "epoch 0 still runs (draining) while epoch 1 is live")
	require.FileExists(t, filepath.Join(r.dir, "proxy", "envoy-rev1.json"))
	require.Eventually(t, func() bool { return syscallKill0(pid0) != nil }, 10*time.Second, 20*time.Millisecond,
		"epoch 0 exits after the parent shutdown time")
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(r.dir, "proxy", "envoy-rev0.json"))
		return os.IsNotExist(err)
	}, 5*time.Second, 20*time.Millisecond, "the old epoch's bootstrap is cleaned up")
	code, _ := r.get("/healthz/ready", 15021)
	assert.Equal(t, 200, code)
}

func TestSpentBudgetEndsAgentWithError(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, pod{proxyEnv: []string{"TESTPROXY_EXIT_CODE=3"}, retry: supervisor.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}})
	err := r.wait(t, 20*time.Second)
	require.ErrorIs(t, err, supervisor.ErrBudgetExhausted)
	assert.Contains(t, err.Error(), "exit status 3")
}

func TestProbeForwarding(t *testing.T) {
	proxytest.RequireKnobs(t)
	o, ip, _ := options(t, pod{})
	_ = o
	// The application listens on the pod's localhost, as in the local mesh.
	appL, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	defer appL.Close()
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/live" {
			w.WriteHeader(200)
			return
		}
		w.WriteHeader(500)
	})}
	go app.Serve(appL)
	defer app.Close()
	port := appL.Addr().(*net.TCPAddr).Port
	probers := fmt.Sprintf(`{"/app-health/web/livez":{"httpGet":{"path":"/live","port":%d}},"/app-health/web/readyz":{"httpGet":{"path":"/ready","port":%d}},"/app-health/web/startupz":{"tcpSocket":{"port":%d}}}`, port, port, port)

	o.Env = append(o.Env, "ISTIO_KUBE_APP_PROBERS="+probers)
	a, err := sidecar.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r := &running{ip: ip, agent: a, client: &http.Client{Timeout: 5 * time.Second}}
	require.Eventually(t, func() bool { c, _ := r.get("/app-health/web/livez", 15020); return c == 200 }, 10*time.Second, 20*time.Millisecond)
	c, _ := r.get("/app-health/web/readyz", 15020)
	assert.Equal(t, 500, c)
	c, _ = r.get("/app-health/web/startupz", 15020)
	assert.Equal(t, 200, c)
}

func TestMergedMetrics(t *testing.T) {
	proxytest.RequireKnobs(t)
	o, ip, _ := options(t, pod{
		annotations: map[string]string{"sidecar.istio.io/extraStatTags": "tenant"},
	})
	// An application exposing its own metrics, Go runtime included (as the agent's are).
	reg := prometheus.NewRegistry()
	orders := prometheus.NewCounter(prometheus.CounterOpts{Name: "shop_orders_total", Help: "Orders."})
	orders.Add(5)
	reg.MustRegister(orders, collectors.NewGoCollector())
	appPort := freePort(t, ip)
	appL, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, appPort))
	require.NoError(t, err)
	app := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go app.Serve(appL)
	defer app.Close()
	o.Env = append(o.Env, fmt.Sprintf(`ISTIO_PROMETHEUS_ANNOTATIONS={"scrape":"true","port":"%d","path":"/metrics"}`, appPort))
	o.ProxyEnv = append(o.ProxyEnv, "TESTPROXY_CONFIG_ON_START=1")

	a, err := sidecar.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r := &running{ip: ip, agent: a, client: &http.Client{Timeout: 5 * time.Second}}
	require.Eventually(t, r.readyIs(200, ""), 10*time.Second, 20*time.Millisecond)

	// A filter-encoded metric, as the telemetry filter names it, with the pod's extra tag.
	r.adminPost(t, "/testproxy/stat?name="+urlEscape("wasmcustom.reporter=.=destination;.;tenant=.=acme;.;response_code=.=200;.;istio_requests_total")+"&value=3", "")

	code, page := r.get("/stats/prometheus", 15020)
	require.Equal(t, 200, code)
	fams, err := statsmerge.ParseText(strings.NewReader(page))
	require.NoError(t, err, "the merged page is valid exposition with each family once")
	byName := map[string]int{}
	for _, f := range fams {
		byName[f.GetName()]++
		if f.GetName() == "istio_requests_total" {
			require.Len(t, f.GetMetric(), 1)
			labels := map[string]string{}
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			assert.Equal(t, map[string]string{"reporter": "destination", "tenant": "acme", "response_code": "200"}, labels,
				"the annotation's extra tag became a label")
			assert.Equal(t, 3.0, f.GetMetric()[0].GetCounter().GetValue())
		}
	}
	for _, name := range []string{"istio_requests_total", "envoy_server_live", "shop_orders_total", "go_goroutines", "wasmesh_agent_proxy_epoch"} {
		assert.Equal(t, 1, byName[name], name)
	}

	code, proxyPage := r.get("/stats/prometheus", 15090)
	require.Equal(t, 200, code, "the proxy's Prometheus listener routes to its admin")
	assert.Contains(t, proxyPage, "istio_requests_total{")
	assert.NotContains(t, proxyPage, "shop_orders_total")
}

func urlEscape(s string) string {
	var b bytes.Buffer
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
