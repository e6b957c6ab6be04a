package sidecar_test

import (
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

func TestMain(m *testing.M) {
	// discoveryBinary builds the real discovery here when a test needs it.
	dir, err := os.MkdirTemp("", "agent-sidecar-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	discoveryBuild.dir = dir
	code := proxytest.Main(m, &proxyBinary)
	os.RemoveAll(dir)
	os.Exit(code)
}

// pod describes one test pod; the agent runs in-process, the proxy (meshproxy) as a real
// process, configured by a discovery of the pod's own.
type pod struct {
	env         []string
	labels      map[string]string
	annotations map[string]string
	// proxyConfig are ProxyConfig fields (JSON members) beside the discovery address, when
	// env has no PROXY_CONFIG.
	proxyConfig string
	// configured has discovery give the proxy an empty configuration from the start
	// (else the proxy waits for its first one until the test configures it).
	configured bool
	proxyEnv   []string
	appPorts   []int
	retry      supervisor.Retry
}

type running struct {
	ip        string
	dir       string
	certs     string
	discovery *proxytest.Discovery
	agent     *sidecar.Agent
	cancel    context.CancelFunc
	done      chan error
	client    *http.Client
	stopped   time.Time
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// options prepares a pod (its files, loopback address and discovery) and the agent's
// options; run starts the agent.
func options(t testing.TB, p pod) (sidecar.Options, *running) {
	ip := proxytest.Loopback(t, 15000, 15020, 15021, 15090)
	dir := t.TempDir()
	podDir := filepath.Join(dir, "pod")
	require.NoError(t, os.MkdirAll(podDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(podDir, "labels"), []byte(podinfo.Format(p.labels)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(podDir, "annotations"), []byte(podinfo.Format(p.annotations)), 0o644))
	disc := proxytest.StartDiscovery(t)
	if p.configured {
		disc.Configure(proxytest.Config{})
	}
	env := append([]string{
		"POD_NAME=web-5d9c7b6f4-x7k2p", "POD_NAMESPACE=shop", "SERVICE_ACCOUNT=web",
		"INSTANCE_IP=" + ip, "WASMESH_LOCALHOST=" + ip, "WASMESH_WILDCARD=" + ip,
		"ISTIO_META_INTERCEPTION_MODE=NONE", fmt.Sprintf("WASMESH_BASE_ID=%d", proxytest.BaseID()),
		// The test discovery is plaintext on loopback (xds_test.go runs the XDS proxy).
		"WASMESH_XDS_PLAINTEXT=true",
	}, p.env...)
	if !hasPrefix(env, "PROXY_CONFIG=") {
		pc := fmt.Sprintf(`"discoveryAddress":%q`, disc.Addr())
		if p.proxyConfig != "" {
			pc += "," + p.proxyConfig
		}
		env = append(env, "PROXY_CONFIG={"+pc+"}")
	}
	retry := p.retry
	if retry.MaxRetries == 0 {
		retry = supervisor.Retry{MaxRetries: 3, InitialInterval: 20 * time.Millisecond}
	}
	o := sidecar.Options{
		BinaryPath: proxyBinary, ConfigPath: filepath.Join(dir, "proxy"), PodInfoDir: podDir,
		DrainDuration: time.Second, ParentShutdownDuration: time.Second,
		ApplicationPorts: p.appPorts,
		CertFiles:        []string{filepath.Join(dir, "cert-chain.pem")}, CertCheckInterval: time.Hour,
		Env: env, Retry: retry, DrainPollInterval: 50 * time.Millisecond, QuitGrace: 2 * time.Second,
		ProxyEnv: p.proxyEnv,
		Stdout:   io.Discard, Stderr: logWriter{t},
		Log: slog.New(slog.NewTextHandler(logWriter{t}, nil)), Version: "test",
	}
	return o, &running{ip: ip, dir: dir, certs: o.CertFiles[0], discovery: disc, done: make(chan error, 1),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
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
	o, r := options(t, p)
	r.run(t, o)
	return r
}

// run starts the agent with o until the test ends.
func (r *running) run(t *testing.T, o sidecar.Options) {
	t.Helper()
	a, err := sidecar.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r.agent, r.cancel = a, cancel
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
	r := start(t, pod{appPorts: []int{18080}, proxyConfig: `"terminationDrainDuration":"1s"`})

	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond,
		"a proxy waiting for its first config from discovery is not ready")

	r.discovery.Configure(proxytest.Config{})
	require.Eventually(t, r.readyIs(503, "application ports 18080"), 5*time.Second, 20*time.Millisecond)
	// The agent's status port answers before the proxy serves its 15021 listener (as in a
	// pod, where the probe fails until Envoy's workers start, once it is initialized);
	// the proxy's listener must route to the agent and answer the agent's 503.
	code, _ := r.get("/healthz/ready", 15021)
	assert.Equal(t, 503, code, "the proxy's readiness listener routes to the agent")

	r.discovery.Configure(proxytest.Config{Inbound: []string{r.ip + ":18080"}})
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

// agentCounter sums a counter's series on the agent's merged /stats/prometheus.
func (r *running) agentCounter(t *testing.T, name string) float64 {
	t.Helper()
	code, page := r.get("/stats/prometheus", 15020)
	require.Equal(t, 200, code)
	fams, err := statsmerge.ParseText(strings.NewReader(page))
	require.NoError(t, err)
	sum := 0.0
	for _, f := range fams {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func TestCertificateChangeStartsNewEpoch(t *testing.T) {
	r := start(t, pod{configured: true})
	require.Eventually(t, r.epochLive(0), 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, r.readyIs(200, ""), 5*time.Second, 20*time.Millisecond)
	pid0, ok := proxytest.Processes(filepath.Join(r.dir, "proxy"))[0]
	require.True(t, ok, "epoch 0's process runs")

	require.NoError(t, os.WriteFile(r.certs, []byte("rotated"), 0o600))
	require.Eventually(t, r.epochLive(1), 10*time.Second, 20*time.Millisecond, "a new certificate starts epoch 1")
	assert.NoError(t, syscallKill0(pid0), "epoch 0 still runs (draining) while epoch 1 is live")
	assert.Equal(t, 2.0, r.agentCounter(t, "wasmesh_agent_proxy_starts_total"), "two proxy starts, no other")
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

// A proxy that cannot start (its admin port is taken, so meshproxy, as Envoy, exits
// with 1 at once) spends the retry budget, and the agent ends with the proxy's exit status.
func TestSpentBudgetEndsAgentWithError(t *testing.T) {
	o, r := options(t, pod{retry: supervisor.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}})
	taken, err := net.Listen("tcp", r.ip+":15000")
	require.NoError(t, err)
	defer taken.Close()
	stderr := &proxytest.Output{}
	o.Stderr = io.MultiWriter(stderr, o.Stderr)
	r.run(t, o)
	err = r.wait(t, 20*time.Second)
	require.ErrorIs(t, err, supervisor.ErrBudgetExhausted)
	assert.Contains(t, err.Error(), "exit status 1")
	assert.Equal(t, 3, strings.Count(stderr.String(), "admin: cannot bind "+r.ip+":15000"),
		"three starts, each failing to bind the admin port:\n%s", stderr)
}

func TestProbeForwarding(t *testing.T) {
	o, r := options(t, pod{})
	// The application listens on the pod's localhost, as in the local mesh.
	appL, err := net.Listen("tcp", r.ip+":0")
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
	r.run(t, o)
	require.Eventually(t, func() bool { c, _ := r.get("/app-health/web/livez", 15020); return c == 200 }, 10*time.Second, 20*time.Millisecond)
	c, _ := r.get("/app-health/web/readyz", 15020)
	assert.Equal(t, 500, c)
	c, _ = r.get("/app-health/web/startupz", 15020)
	assert.Equal(t, 200, c)
}

func TestMergedMetrics(t *testing.T) {
	o, r := options(t, pod{
		annotations: map[string]string{"sidecar.istio.io/extraStatTags": "tenant"},
		configured:  true,
	})
	// An application exposing its own metrics, Go runtime included (as the agent's are).
	reg := prometheus.NewRegistry()
	orders := prometheus.NewCounter(prometheus.CounterOpts{Name: "shop_orders_total", Help: "Orders."})
	orders.Add(5)
	reg.MustRegister(orders, collectors.NewGoCollector())
	appPort := freePort(t, r.ip)
	appL, err := net.Listen("tcp", fmt.Sprintf("%s:%d", r.ip, appPort))
	require.NoError(t, err)
	app := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go app.Serve(appL)
	defer app.Close()
	o.Env = append(o.Env, fmt.Sprintf(`ISTIO_PROMETHEUS_ANNOTATIONS={"scrape":"true","port":"%d","path":"/metrics"}`, appPort))
	// A filter-encoded metric, as the telemetry filter names it, with the pod's extra tag:
	// meshproxy's test hook has the proxy expose it as a Wasm filter's counter.
	o.ProxyEnv = append(o.ProxyEnv, proxytest.WasmCounters(t, r.dir, []string{
		"reporter=.=destination;.;tenant=.=acme;.;response_code=.=200;.;istio_requests_total 3"}))

	r.run(t, o)
	require.Eventually(t, r.readyIs(200, ""), 10*time.Second, 20*time.Millisecond)

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

// A hot restart's old epoch is shut down the drain duration plus 15 s after the restart,
// unless the flag says otherwise: Istio's 45 s drain and 60 s shutdown, and a pod that
// shortens its drain in ProxyConfig shortens both.
func TestParentShutdownFollowsTheDrain(t *testing.T) {
	for _, tc := range []struct {
		name           string
		parentShutdown time.Duration
		drain, want    string
	}{
		{name: "ProxyConfig drain", drain: "7s", want: "22s"},
		{name: "flag", parentShutdown: 9 * time.Second, drain: "7s", want: "9s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, r := options(t, pod{proxyConfig: fmt.Sprintf(`"drainDuration":%q`, tc.drain), configured: true})
			o.DrainDuration, o.ParentShutdownDuration = 0, tc.parentShutdown
			r.run(t, o)
			require.Eventually(t, r.epochLive(0), 20*time.Second, 20*time.Millisecond)
			si, err := r.agent.Admin().ServerInfo(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.drain, si.CommandLineOptions.DrainTime)
			assert.Equal(t, tc.want, si.CommandLineOptions.ParentShutdownTime)
		})
	}
}
