package localmesh

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/testenv/internal/httpget"
)

// PodSpec describes a pod: its identity, the application (the echo sample app) and the
// sidecar's settings.
type PodSpec struct {
	// Name defaults to <app>-<version>-<n>; Namespace to "default"; ServiceAccount to
	// "default".
	Name, Namespace, ServiceAccount string
	// Labels must hold "app"; "version" defaults to v1.
	Labels      map[string]string
	Annotations map[string]string
	// Port is the application's container port (a service's targetPort). Default 8080.
	Port int
	// TCP makes the application a TCP service (echo's line protocol) rather than HTTP.
	TCP bool
	// Calls are the URLs the application calls for every request to "/" (through its
	// sidecar's outbound listeners), FailEvery and Delay its test knobs, StartupCall a
	// call it makes once before serving and without which it does not start (package echo).
	Calls       []string
	StartupCall string
	FailEvery   int
	Delay       time.Duration
	// HoldApplicationUntilProxyStarts starts the application only after `agent wait`
	// succeeds, as the injector's postStart hook does.
	HoldApplicationUntilProxyStarts bool
	// TerminationDrainDuration is the proxy's drain on SIGTERM (default 2s; Istio's is 5s);
	// the application keeps serving a second longer after its own SIGTERM, as an
	// application with a preStop sleep does (appShutdownDelay).
	TerminationDrainDuration time.Duration
	// Env is added to the agent's environment (EXIT_ON_ZERO_ACTIVE_CONNECTIONS,
	// MINIMUM_DRAIN_DURATION, PROXY_CONFIG, ISTIO_META_*, ...).
	Env []string
	// NoWait returns from AddPod without waiting for the pod to be ready.
	NoWait bool
}

// Pod is a running pod: its agent (which runs the proxy) and its application.
type Pod struct {
	Spec PodSpec
	// IP is the pod IP (inbound listeners, status port); Localhost its private loopback
	// address (application, outbound listeners, proxy admin).
	IP, Localhost string
	Dir           string

	mesh  *Mesh
	agent *Process
	app   *Process
	mu    sync.Mutex
}

const statusPort = 15020

// AddPods starts pods at once, as a Deployment's replicas start, and waits for all; the
// first error is returned (the pods started are kept, for Close to stop).
func (m *Mesh) AddPods(ctx context.Context, specs ...PodSpec) ([]*Pod, error) {
	pods := make([]*Pod, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = m.AddPod(ctx, spec)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return pods, err
		}
	}
	return pods, nil
}

// AddPod starts a pod and, unless spec.NoWait, waits until it is ready.
func (m *Mesh) AddPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	if spec.Labels["app"] == "" {
		return nil, fmt.Errorf("localmesh: pod %q has no app label", spec.Name)
	}
	spec.Labels = clone(spec.Labels)
	if spec.Labels["version"] == "" {
		spec.Labels["version"] = "v1"
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if spec.ServiceAccount == "" {
		spec.ServiceAccount = "default"
	}
	if spec.Port == 0 {
		spec.Port = 8080
	}
	if spec.TerminationDrainDuration == 0 {
		spec.TerminationDrainDuration = 2 * time.Second
	}
	if m.identity != nil && spec.Labels[tlsModeLabel] == "" {
		spec.Labels[tlsModeLabel] = "istio" // as Istio's injector labels a pod with a sidecar
	}
	m.mu.Lock()
	m.podSeq++
	n := m.podSeq
	m.mu.Unlock()
	if spec.Name == "" {
		spec.Name = fmt.Sprintf("%s-%s-%d", spec.Labels["app"], spec.Labels["version"], n)
	}
	p := &Pod{Spec: spec, mesh: m,
		IP:        fmt.Sprintf("127.%d.%d.%d", m.net, n/250, n%250+1),
		Localhost: fmt.Sprintf("127.%d.%d.%d", m.net+100, n/250, n%250+1),
		Dir:       filepath.Join(m.opts.Dir, "pods", spec.Name)}
	if err := p.writeFiles(); err != nil {
		return nil, err
	}
	if err := p.startAgent(n); err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.pods = append(m.pods, p)
	m.mu.Unlock()
	if spec.HoldApplicationUntilProxyStarts {
		// The injector's postStart hook: the application container starts only once
		// `agent wait` has seen the proxy ready.
		wait, err := m.startProcess(spec.Name+".wait", p.logDir(), filepath.Join(m.opts.BinDir, "agent"),
			[]string{"wait", "--url", p.readyURL(), "--timeoutSeconds", "60", "--periodMillis", "100"}, nil)
		if err != nil {
			return nil, err
		}
		select {
		case <-wait.Done():
		case <-ctx.Done():
			wait.Kill()
			return nil, ctx.Err()
		}
		if err := wait.exitError(); err != nil {
			return nil, fmt.Errorf("localmesh: pod %s: postStart `agent wait` failed: %w\n%s", spec.Name, err, wait.Tail(2000))
		}
	}
	if err := p.startApp(); err != nil {
		return nil, err
	}
	if !spec.NoWait {
		if err := p.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	m.opts.Logf("pod %s/%s ready: pod IP %s, localhost %s", spec.Namespace, spec.Name, p.IP, p.Localhost)
	return p, nil
}

func (p *Pod) logDir() string { return filepath.Join(p.Dir, "logs") }

func (p *Pod) readyURL() string {
	return "http://" + net.JoinHostPort(p.IP, "15021") + "/healthz/ready"
}

// WaitReady waits until the pod is ready as the kubelet sees it: the sidecar's readiness
// (the agent's /healthz/ready) passes and the application accepts connections (its
// readiness probe). An application that exits meanwhile is an error.
func (p *Pod) WaitReady(ctx context.Context) error {
	if err := waitFor(ctx, p.agent, "pod "+p.Spec.Name+" to be ready", func() error {
		return httpOK(p.StatusURL("/healthz/ready"))
	}); err != nil {
		return err
	}
	p.mu.Lock()
	app := p.app
	p.mu.Unlock()
	if err := waitFor(ctx, app, "application of pod "+p.Spec.Name+" to listen", func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(p.Localhost, strconv.Itoa(p.Spec.Port)), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		return err
	}
	// Ready as the mesh sees it: discovery has the pod's workload healthy (its agent
	// reported), and the endpoints it makes are in the latest snapshot, so every proxy that
	// connects from now on is sent them, as a ready pod's are in Kubernetes' EndpointSlices.
	return waitFor(ctx, p.agent, "discovery to see pod "+p.Spec.Name+" healthy", p.healthyInDiscovery)
}

// discoveryPage is the part of /debug/registryz and /debug/endpointz the pod reads.
type discoveryPage struct {
	Services []struct {
		Hostname  string `json:"hostname"`
		Endpoints []struct {
			Address string `json:"address"`
			Health  int    `json:"health"`
		} `json:"endpoints"`
	} `json:"services"`
	Workloads []struct {
		Name, Namespace string
		Health          int
	} `json:"workloads"`
}

func (p *Pod) discoveryPage(path string) (*discoveryPage, error) {
	b, err := httpget.Get(context.Background(), p.mesh.DiscoveryURL(path))
	if err != nil {
		return nil, err
	}
	var page discoveryPage
	if err := json.Unmarshal(b, &page); err != nil {
		return nil, fmt.Errorf("discovery %s: %w", path, err)
	}
	return &page, nil
}

// healthyHosts are the hosts of which the pod is a healthy endpoint on a page.
func (p *Pod) healthyHosts(page *discoveryPage) map[string]bool {
	hosts := map[string]bool{}
	for _, s := range page.Services {
		for _, e := range s.Endpoints {
			if e.Address == p.IP && e.Health == 0 {
				hosts[s.Hostname] = true
			}
		}
	}
	return hosts
}

func (p *Pod) healthyInDiscovery() error {
	reg, err := p.discoveryPage("/debug/registryz")
	if err != nil {
		return err
	}
	registered := false
	for _, w := range reg.Workloads {
		if w.Name == p.Spec.Name && w.Namespace == p.Spec.Namespace {
			if w.Health != 0 {
				return fmt.Errorf("workload %s/%s is not healthy in discovery", w.Namespace, w.Name)
			}
			registered = true
		}
	}
	if !registered {
		return fmt.Errorf("workload %s/%s is not registered in discovery", p.Spec.Namespace, p.Spec.Name)
	}
	snap, err := p.discoveryPage("/debug/endpointz")
	if err != nil {
		return err
	}
	pushed := p.healthyHosts(snap)
	for host := range p.healthyHosts(reg) {
		if !pushed[host] {
			return fmt.Errorf("pod %s/%s is not yet an endpoint of %s in discovery's latest snapshot", p.Spec.Namespace, p.Spec.Name, host)
		}
	}
	return nil
}

// StatusURL is a URL on the agent's status server.
func (p *Pod) StatusURL(path string) string {
	return "http://" + net.JoinHostPort(p.IP, strconv.Itoa(statusPort)) + path
}

// Workload is the pod's workload name (WORKLOAD_NAME: app-version), as its telemetry
// reports it.
func (p *Pod) Workload() string { return p.Spec.Labels["app"] + "-" + p.Spec.Labels["version"] }

// AdminURL is a URL on the proxy's admin API.
func (p *Pod) AdminURL(path string) string {
	return "http://" + net.JoinHostPort(p.Localhost, "15000") + path
}

// URL is a URL on the pod's inbound listener (what other pods' proxies call).
func (p *Pod) URL(path string) string {
	return "http://" + net.JoinHostPort(p.IP, strconv.Itoa(p.Spec.Port)) + path
}

// Client is an HTTP client that, like the pod's application, sends every request to the
// pod's outbound listeners: a request for http://reviews.default.svc.cluster.local:9080/
// goes to <localhost>:9080 with that Host, and the sidecar routes it.
func (p *Pod) Client() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return d.DialContext(ctx, network, net.JoinHostPort(p.Localhost, port))
		}}}
}

func (p *Pod) writeFiles() error {
	for _, d := range []string{"pod", "certs", "proxy", "logs"} {
		if err := os.MkdirAll(filepath.Join(p.Dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(p.Dir, "pod", "labels"), []byte(podinfo.Format(p.Spec.Labels)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.Dir, "pod", "annotations"), []byte(podinfo.Format(p.Spec.Annotations)), 0o644); err != nil {
		return err
	}
	return p.RotateCertificates()
}

// RotateCertificates writes a fresh workload certificate (a new key and a self-signed
// certificate for the pod's SPIFFE identity), as a certificate rotation does; the agent
// sees the new hash and hot-restarts its proxy.
func (p *Pod) RotateCertificates() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	spiffe := fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/%s", p.Spec.Namespace, p.Spec.ServiceAccount)
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{Organization: []string{"wasmesh"}},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour)}
	if u, err := url.Parse(spiffe); err == nil {
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	cert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	files := map[string][]byte{
		"cert-chain.pem": cert,
		"root-cert.pem":  cert,
		"key.pem":        pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	for name, b := range files {
		path := filepath.Join(p.Dir, "certs", name)
		if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return err
		}
	}
	return nil
}

func (p *Pod) startAgent(n int) error {
	m := p.mesh
	portName := "http" // Istio's protocol selection by port name
	if p.Spec.TCP {
		portName = "tcp"
	}
	ports, _ := json.Marshal([]map[string]any{{"name": portName, "containerPort": p.Spec.Port, "protocol": "TCP"}})
	env := []string{
		"POD_NAME=" + p.Spec.Name, "POD_NAMESPACE=" + p.Spec.Namespace, "INSTANCE_IP=" + p.IP,
		"SERVICE_ACCOUNT=" + p.Spec.ServiceAccount,
		"WASMESH_LOCALHOST=" + p.Localhost, "WASMESH_WILDCARD=" + p.IP,
		"WASMESH_BASE_ID=" + strconv.Itoa(int(m.net)*10000+n),
		"ISTIO_META_INTERCEPTION_MODE=NONE", "ISTIO_META_POD_PORTS=" + string(ports),
		// The pod's Deployment, as Kubernetes would name it (Istio's workload name).
		"ISTIO_META_WORKLOAD_NAME=" + p.Workload(),
		"PROXY_CONFIG=" + fmt.Sprintf(`{"terminationDrainDuration": %q}`, p.Spec.TerminationDrainDuration.String()),
	}
	// With identity the agent's XDS proxy dials discovery's TLS port with the pod's
	// credential (docs/contracts.md); without, plaintext to the loopback xDS port.
	if m.identity != nil {
		idEnv, err := m.identity.podEnv(p)
		if err != nil {
			return err
		}
		env = append(env, idEnv...)
	} else {
		env = append(env, "WASMESH_XDS_PLAINTEXT=true")
	}
	env = append(env, p.Spec.Env...)
	agent, err := m.startProcess("agent", p.logDir(), filepath.Join(m.opts.BinDir, "agent"), []string{
		"proxy", "sidecar",
		"--binaryPath", m.proxyBin,
		"--configPath", filepath.Join(p.Dir, "proxy"),
		"--podInfoDir", filepath.Join(p.Dir, "pod"),
		"--certDir", filepath.Join(p.Dir, "certs"),
		// The agent's sockets and mounted credentials are relative to its working directory
		// in a pod (Istio's paths); here every pod has its own.
		"--sdsSocket", filepath.Join(p.Dir, "run", "sds.sock"),
		"--xdsSocket", filepath.Join(p.Dir, "run", "xds.sock"),
		"--credentialsDir", filepath.Join(p.Dir, "workload-certs"),
		"--certCheckInterval", "1s",
		"--discoveryAddress", m.grpcAddr,
		"--statusPort", strconv.Itoa(statusPort),
		"--applicationPorts", strconv.Itoa(p.Spec.Port),
		"--concurrency", "2",
	}, env)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.agent = agent
	p.mu.Unlock()
	return nil
}

func (p *Pod) startApp() error {
	args := []string{"--listen", net.JoinHostPort(p.Localhost, strconv.Itoa(p.Spec.Port)),
		"--service", p.Spec.Labels["app"], "--version", p.Spec.Labels["version"], "--pod", p.Spec.Name,
		"--outboundAddress", p.Localhost, "--shutdownDelay", appShutdownDelay(p.Spec.TerminationDrainDuration).String()}
	for _, c := range p.Spec.Calls {
		args = append(args, "--call", c)
	}
	if p.Spec.StartupCall != "" {
		args = append(args, "--startupCall", p.Spec.StartupCall)
	}
	if p.Spec.TCP {
		args = append(args, "--tcp")
	}
	if p.Spec.FailEvery > 0 {
		args = append(args, "--failEvery", strconv.Itoa(p.Spec.FailEvery))
	}
	if p.Spec.Delay > 0 {
		args = append(args, "--delay", p.Spec.Delay.String())
	}
	app, err := p.mesh.startProcess("app", p.logDir(), filepath.Join(p.mesh.opts.BinDir, "echo"), args, nil)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.app = app
	p.mu.Unlock()
	return nil
}

// appShutdownDelay is how long the application keeps serving after its SIGTERM, as an
// application with a preStop sleep does: past the proxy's drain and its exit, so the proxy
// never takes a connection its application is no longer there to answer (a 503).
func appShutdownDelay(drain time.Duration) time.Duration { return drain + time.Second }

// Stop terminates the pod as the kubelet does: SIGTERM to every container at once (the
// agent drains its proxy; the application keeps serving for the drain duration), then
// waits for both to exit or ctx to end, and kills what is left.
func (p *Pod) Stop(ctx context.Context) error {
	p.mu.Lock()
	agent, app := p.agent, p.app
	p.mu.Unlock()
	var errs []error
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, proc := range []*Process{agent, app} {
		if proc == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := proc.Stop(ctx); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("localmesh: stopping pod %s: %v", p.Spec.Name, errs)
	}
	return nil
}

// Running reports whether the pod's agent is still running.
func (p *Pod) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.agent != nil && p.agent.Running()
}

// AppRunning reports whether the pod's application is running.
func (p *Pod) AppRunning() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.app != nil && p.app.Running()
}

// Agent is the pod's agent process.
func (p *Pod) Agent() *Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.agent
}

// Scrape returns the pod's merged metrics page (agent :15020/stats/prometheus).
func (p *Pod) Scrape(ctx context.Context) ([]byte, error) {
	return httpget.Get(ctx, p.StatusURL("/stats/prometheus"))
}

// Admin GETs path from the proxy's admin API.
func (p *Pod) Admin(ctx context.Context, path string) ([]byte, error) {
	return httpget.Get(ctx, p.AdminURL(path))
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
