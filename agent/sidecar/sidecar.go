// Package sidecar assembles the long-running `agent proxy sidecar` mode: it turns flags,
// environment and pod info into a checked configuration (bad input fails here, naming
// it), then runs the status server, the certificate watcher and the proxy supervisor,
// and on termination drains the proxy before stopping it.
package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/bootstrap"
	"github.com/wasmesh/wasmesh/agent/certwatch"
	"github.com/wasmesh/wasmesh/agent/drain"
	"github.com/wasmesh/wasmesh/agent/envoyproc"
	"github.com/wasmesh/wasmesh/agent/healthreport"
	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/agent/probe"
	"github.com/wasmesh/wasmesh/agent/proxyconfig"
	"github.com/wasmesh/wasmesh/agent/sds"
	"github.com/wasmesh/wasmesh/agent/status"
	"github.com/wasmesh/wasmesh/agent/supervisor"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/agent/xdsproxy"
)

// Options are the agent's inputs. Zero values mean "not given": the ProxyConfig (from
// PROXY_CONFIG and the proxy.istio.io/config annotation) or Istio's default applies.
type Options struct {
	BinaryPath       string
	ConfigPath       string
	ServiceCluster   string
	DiscoveryAddress string
	DrainDuration    time.Duration
	// ParentShutdownDuration is when a hot restart's old epoch is shut down; 0 means the
	// drain duration plus 15 s (parentShutdown).
	ParentShutdownDuration time.Duration
	ProxyLogLevel          string
	ProxyComponentLogLevel string
	Concurrency            int
	StatusPort             int
	ApplicationPorts       []int
	TemplateFile           string
	PodInfoDir             string
	CertFiles              []string
	CertCheckInterval      time.Duration
	// CredentialsDir holds mounted workload credentials served by SDS (default Istio's
	// ./var/run/secrets/workload-spiffe-credentials).
	CredentialsDir string
	// SDSSocket is where the agent serves SDS (default Istio's
	// ./var/run/secrets/workload-spiffe-uds/socket).
	SDSSocket string
	// XDSSocket is where the agent's XDS proxy serves the proxy (default Istio's
	// ./etc/istio/proxy/XDS).
	XDSSocket string
	// Env is the agent's environment (os.Environ()).
	Env []string
	// Retry is the restart policy (default 10 retries from 200 ms).
	Retry supervisor.Retry
	// DrainPollInterval is how often active connections are polled (default 1s).
	DrainPollInterval time.Duration
	// QuitGrace is how long the proxy has to exit after /quitquitquit before it is killed.
	QuitGrace time.Duration
	// LogLevel, if set, is the agent's log level, changeable at run time on the status
	// server's /debug/logging.
	LogLevel *slog.LevelVar
	// HealthPeriod is how often the pod's health is checked and, when it changed, reported
	// to discovery (default 500ms).
	HealthPeriod time.Duration
	// ProxyEnv is added to the proxy's environment.
	ProxyEnv       []string
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	Version        string
}

// Agent is a checked configuration, ready to run.
type Agent struct {
	o          Options
	log        *slog.Logger
	env        map[string]string
	pc         *meshconfig.ProxyConfig
	params     *bootstrap.Params
	tmpl       *bootstrap.Template
	override   []byte
	overrideAt string
	admin      *admin.Client
	proxy      *envoyproc.Proxy
	probes     map[string]probe.Prober
	appMetrics *status.AppMetrics
	policy     drain.Policy
	statusAddr string
	registry   *prometheus.Registry
	certs      *certSource
	xds        *discoveryConn
	sup        *supervisor.Supervisor
	draining   atomic.Bool
}

// parentShutdown is when a hot restart's old epoch is shut down: the flag's value, or by
// default 15 s after its drain ends (Istio's parentShutdownDuration of 60 s against its
// drainDuration of 45 s).
func parentShutdown(flag, drain time.Duration) time.Duration {
	if flag > 0 {
		return flag
	}
	return drain + 15*time.Second
}

// New checks every input and returns the agent, or an error naming the bad input.
func New(o Options) (*Agent, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Retry.MaxRetries == 0 && o.Retry.InitialInterval == 0 {
		o.Retry = supervisor.DefaultRetry()
	}
	if o.HealthPeriod <= 0 {
		o.HealthPeriod = 500 * time.Millisecond
	}
	if o.DrainPollInterval <= 0 {
		o.DrainPollInterval = time.Second
	}
	if o.QuitGrace <= 0 {
		o.QuitGrace = 5 * time.Second
	}
	if o.PodInfoDir == "" {
		o.PodInfoDir = podinfo.DefaultDir
	}
	if o.ProxyLogLevel == "" {
		o.ProxyLogLevel = "warning"
	}
	if o.CredentialsDir == "" {
		o.CredentialsDir = workloadcert.DefaultCredentialsDir
	}
	if o.SDSSocket == "" {
		o.SDSSocket = sds.DefaultSocketPath
	}
	if o.XDSSocket == "" {
		o.XDSSocket = xdsproxy.DefaultSocketPath
	}
	a := &Agent{o: o, log: o.Log, env: bootstrap.EnvMap(o.Env), registry: prometheus.NewRegistry()}
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	pod, err := podinfo.Read(o.PodInfoDir)
	if err != nil {
		return nil, err
	}
	pc, err := proxyconfig.Effective(proxyconfig.Layers{Env: a.env["PROXY_CONFIG"], Annotations: pod.Annotations,
		// Not in a pod: only cluster DNS knows istiod's Service name.
		OutsideKubernetes: a.env["KUBERNETES_SERVICE_HOST"] == ""})
	if err != nil {
		return nil, err
	}
	// Command-line flags are the most specific layer.
	if o.BinaryPath != "" {
		pc.BinaryPath = o.BinaryPath
	}
	if o.ConfigPath != "" {
		pc.ConfigPath = o.ConfigPath
	}
	if o.DiscoveryAddress != "" {
		pc.DiscoveryAddress = o.DiscoveryAddress
	}
	if o.DrainDuration > 0 {
		pc.DrainDuration = durationpb.New(o.DrainDuration)
	}
	if o.StatusPort > 0 {
		pc.StatusPort = int32(o.StatusPort)
	}
	if o.Concurrency > 0 {
		pc.Concurrency = wrapperspb.Int32(int32(o.Concurrency))
	}
	a.pc = pc
	served := workloadcert.NewServed(a.registry, nil)
	if a.certs, err = newCertSource(a.env, o, pc.GetDiscoveryAddress(), served, a.registry, a.log); err != nil {
		return nil, err
	}

	in := bootstrap.InputFromEnv(o.Env)
	if a.certs != nil {
		in.SDSSocketPath = o.SDSSocket
	}
	in.Labels, in.Annotations = pod.Labels, pod.Annotations
	in.ProxyConfig = pc
	in.ServiceCluster = o.ServiceCluster
	in.Version = o.Version
	if a.params, err = bootstrap.NewParams(in); err != nil {
		return nil, err
	}
	if a.xds, err = newDiscoveryConn(a.env, pc.GetDiscoveryAddress(), served, a.registry, a.log); err != nil {
		return nil, err
	}
	if a.xds.proxy != nil {
		a.params.XDSSocketPath = o.XDSSocket
	}
	a.tmpl = bootstrap.DefaultTemplate()
	if o.TemplateFile == "" {
		o.TemplateFile = pc.GetProxyBootstrapTemplatePath()
	}
	if o.TemplateFile != "" {
		if a.tmpl, err = bootstrap.LoadTemplate(o.TemplateFile); err != nil {
			return nil, fmt.Errorf("--templateFile: %w", err)
		}
	}
	if p := a.env["ISTIO_BOOTSTRAP_OVERRIDE"]; p != "" {
		if a.override, err = os.ReadFile(p); err != nil {
			return nil, fmt.Errorf("ISTIO_BOOTSTRAP_OVERRIDE: %w", err)
		}
		a.overrideAt = p
	}
	// Render once now: a template or override that cannot produce a valid bootstrap
	// is an input error, not a proxy crash to retry ten times.
	if _, err := a.render(); err != nil {
		return nil, err
	}

	a.admin = admin.New(net.JoinHostPort(a.params.AdminAddress, strconv.Itoa(a.params.AdminPort)), 2*time.Second)
	if a.probes, err = probe.Parse(a.env[probe.EnvName]); err != nil {
		return nil, err
	}
	if a.appMetrics, err = appMetrics(a.env, pod.Annotations, a.params.Localhost, int(pc.GetStatusPort())); err != nil {
		return nil, err
	}
	if a.policy, err = policy(a.env, pc, o.DrainPollInterval); err != nil {
		return nil, err
	}
	a.statusAddr = net.JoinHostPort(a.params.Wildcard, strconv.Itoa(int(pc.GetStatusPort())))

	baseID, err := baseID(a.env)
	if err != nil {
		return nil, err
	}
	drain := proxyconfig.Duration(pc.GetDrainDuration(), 45*time.Second)
	if a.proxy, err = envoyproc.New(envoyproc.Config{
		BinaryPath:             pc.GetBinaryPath(),
		ConfigPath:             pc.GetConfigPath(),
		DrainDuration:          drain,
		ParentShutdownDuration: parentShutdown(o.ParentShutdownDuration, drain),
		ServiceCluster:         a.params.Cluster,
		ServiceNode:            a.params.NodeID,
		LogLevel:               o.ProxyLogLevel,
		ComponentLogLevel:      o.ProxyComponentLogLevel,
		Concurrency:            int(pc.GetConcurrency().GetValue()),
		BaseID:                 baseID,
		Bootstrap:              a.render,
		Admin:                  a.admin,
		Env:                    o.ProxyEnv,
		Stdout:                 o.Stdout,
		Stderr:                 o.Stderr,
		Log:                    o.Log,
	}); err != nil {
		return nil, err
	}
	a.sup = supervisor.New(a.proxy, o.Retry, o.Log, a.registry)
	return a, nil
}

func (a *Agent) render() ([]byte, error) {
	return a.tmpl.Render(a.params, a.override, a.overrideAt)
}

// Params is the bootstrap data the agent computed (node id, addresses, ...).
func (a *Agent) Params() *bootstrap.Params { return a.params }

// Admin is the proxy's admin client.
func (a *Agent) Admin() *admin.Client { return a.admin }

// Run runs until ctx ends (SIGTERM) or a POST to /quitquitquit, then drains and stops
// the proxy; it returns an error when the proxy could not be kept running.
func (a *Agent) Run(ctx context.Context) error {
	l, err := net.Listen("tcp", a.statusAddr)
	if err != nil {
		return fmt.Errorf("status server (--statusPort) on %s: %w", a.statusAddr, err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	// Stop, then wait: an early return (a socket that cannot be served) must not wait for
	// goroutines that run until runCtx ends.
	defer func() { stopRun(); wg.Wait() }()

	quit := make(chan struct{})
	var quitOnce sync.Once
	var upstream func() error
	if a.xds.proxy != nil {
		upstream = a.xds.proxy.Upstream
	}
	srv := status.New(status.Config{
		XDSUpstream: upstream,
		Admin:       a.admin, ApplicationPorts: a.o.ApplicationPorts,
		Probes: probe.NewHandler(a.probes, a.params.Localhost), AppMetrics: a.appMetrics,
		Gatherer: a.registry, Draining: a.draining.Load, HotRestarting: a.sup.HotRestarting,
		Quit:     func() { quitOnce.Do(func() { close(quit) }) },
		Log:      a.log,
		LogLevel: a.o.LogLevel,
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(runCtx, l); err != nil {
			a.log.Error("status server", "err", err)
		}
	}()

	a.log.Info("agent starting", "node", a.params.NodeID,
		"discoveryAddress", a.pc.GetDiscoveryAddress(), "proxy", a.pc.GetBinaryPath(), "status", a.statusAddr)
	reporter, err := a.healthReporter()
	if err != nil {
		return err
	}
	wg.Add(2)
	go func() { defer wg.Done(); reporter.Run(runCtx) }()
	go func() { defer wg.Done(); a.reportHealth(runCtx, srv, reporter) }()

	spawn := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	if a.certs != nil {
		if err := a.serveSDS(runCtx, spawn); err != nil {
			return err
		}
	}
	if a.xds.proxy != nil {
		if err := a.serveXDS(runCtx, spawn); err != nil {
			return err
		}
	}

	supErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		supErr <- a.sup.Run(runCtx)
	}()

	certs := a.o.CertFiles
	watcher := certwatch.New(certs, a.o.CertCheckInterval, a.log)
	wg.Add(1)
	go func() {
		defer wg.Done()
		watcher.Run(runCtx, func(hash string) {
			if err := a.sup.Apply(runCtx, hash); err != nil && !errors.Is(err, context.Canceled) {
				a.log.Warn("config not applied", "err", err)
			}
		})
	}()

	select {
	case err := <-supErr:
		stopRun()
		if errors.Is(err, supervisor.ErrProxyExited) {
			a.log.Info("proxy exited; agent stopping")
			return nil
		}
		return err
	case <-ctx.Done():
		a.log.Info("termination requested")
	case <-quit:
		a.log.Info("quit requested")
	}

	a.draining.Store(true)
	// Out of every proxy's load balancing first, then drain: requests already routed here
	// finish, and no new ones are sent once discovery has pushed the change.
	reporter.Set(errors.New("pod is terminating"))
	flushCtx, stopFlush := context.WithTimeout(context.Background(), time.Second)
	if err := reporter.Flush(flushCtx); err != nil {
		a.log.Warn("could not report termination to discovery before draining", "err", err)
	}
	stopFlush()
	drainCtx, stopDrain := context.WithCancel(context.Background())
	var supResult error
	supGone := make(chan struct{})
	go func() {
		supResult = <-supErr
		close(supGone)
		stopDrain()
	}()
	drain.Run(drainCtx, a.admin, a.policy, a.log)
	stopDrain()
	if err := a.admin.Quit(context.Background()); err != nil {
		a.log.Warn("proxy quit failed; it will be killed", "err", err)
	}
	grace := time.NewTimer(a.o.QuitGrace)
	defer grace.Stop()
	select {
	case <-supGone:
	case <-grace.C:
		a.log.Warn("proxy did not exit after quitquitquit; killing it", "grace", a.o.QuitGrace)
	}
	stopRun()
	<-supGone
	a.admin.Close()
	if supResult != nil && !errors.Is(supResult, supervisor.ErrProxyExited) {
		return supResult
	}
	a.log.Info("agent stopped")
	return nil
}

// healthReporter reports to the discovery address the bootstrap uses, as the proxy's node.
func (a *Agent) healthReporter() (*healthreport.Reporter, error) {
	meta, err := structpb.NewStruct(a.params.Metadata)
	if err != nil {
		return nil, fmt.Errorf("node metadata for health reports: %w", err)
	}
	node := &corev3.Node{Id: a.params.NodeID, Cluster: a.params.Cluster, Metadata: meta}
	addr := net.JoinHostPort(a.params.DiscoveryHost, strconv.Itoa(a.params.DiscoveryPort))
	return healthreport.New(addr, node, a.log, a.xds.dial...), nil
}

// reportHealth checks the pod's health every HealthPeriod until ctx ends: ready (as
// /healthz/ready says) and every application port accepting connections on the pod's
// localhost, the way a tcpSocket readiness probe checks the application itself.
func (a *Agent) reportHealth(ctx context.Context, srv *status.Server, r *healthreport.Reporter) {
	t := time.NewTicker(a.o.HealthPeriod)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := srv.Ready(cctx)
		for _, p := range a.o.ApplicationPorts {
			if err != nil {
				break
			}
			var c net.Conn
			d := net.Dialer{Timeout: 500 * time.Millisecond}
			if c, err = d.DialContext(cctx, "tcp", net.JoinHostPort(a.params.Localhost, strconv.Itoa(p))); err == nil {
				c.Close()
			} else {
				err = fmt.Errorf("application port %d: %w", p, err)
			}
		}
		cancel()
		if ctx.Err() != nil || a.draining.Load() {
			return // termination reports for itself
		}
		r.Set(err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// baseID reads WASMESH_BASE_ID (docs/contracts.md): the local mesh runs many proxies on
// one host, and each needs its own hot-restart domain.
func baseID(env map[string]string) (*uint64, error) {
	v := env["WASMESH_BASE_ID"]
	if v == "" {
		return nil, nil
	}
	id, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("WASMESH_BASE_ID: %q is not a non-negative integer", v)
	}
	return &id, nil
}

func policy(env map[string]string, pc *meshconfig.ProxyConfig, poll time.Duration) (drain.Policy, error) {
	p := drain.DefaultPolicy()
	p.PollInterval = poll
	p.TerminationDrainDuration = proxyconfig.Duration(pc.GetTerminationDrainDuration(), p.TerminationDrainDuration)
	if v := env["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"]; v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return p, fmt.Errorf("EXIT_ON_ZERO_ACTIVE_CONNECTIONS: %q is not a boolean", v)
		}
		p.ExitOnZeroActiveConnections = b
	}
	if v := env["MINIMUM_DRAIN_DURATION"]; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return p, fmt.Errorf("MINIMUM_DRAIN_DURATION: %q is not a duration (e.g. 5s)", v)
		}
		p.MinimumDrainDuration = d
	}
	return p, nil
}

// appMetrics finds the application's metrics endpoint: ISTIO_PROMETHEUS_ANNOTATIONS (the
// injector's copy of the original annotations) or the prometheus.io/* annotations
// themselves, unless they point at the agent (the injector's rewrite).
func appMetrics(env, annotations map[string]string, host string, statusPort int) (*status.AppMetrics, error) {
	source := "annotation prometheus.io/"
	vals := map[string]string{
		"scrape": annotations["prometheus.io/scrape"],
		"port":   annotations["prometheus.io/port"],
		"path":   annotations["prometheus.io/path"],
	}
	if js := env["ISTIO_PROMETHEUS_ANNOTATIONS"]; js != "" {
		source = "ISTIO_PROMETHEUS_ANNOTATIONS "
		vals = map[string]string{}
		if err := json.Unmarshal([]byte(js), &vals); err != nil {
			return nil, fmt.Errorf("ISTIO_PROMETHEUS_ANNOTATIONS: %w", err)
		}
	}
	if vals["scrape"] == "" {
		return nil, nil
	}
	scrape, err := strconv.ParseBool(vals["scrape"])
	if err != nil {
		return nil, fmt.Errorf("%sscrape: %q is not a boolean", source, vals["scrape"])
	}
	if !scrape || vals["port"] == "" {
		return nil, nil
	}
	port, err := strconv.Atoi(vals["port"])
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("%sport: %q is not a port", source, vals["port"])
	}
	if port == statusPort {
		return nil, nil
	}
	path := vals["path"]
	if path == "" {
		path = "/metrics"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return &status.AppMetrics{Host: host, Port: port, Path: path}, nil
}

// DefaultCertFiles are the files pilot-agent watches in a sidecar.
func DefaultCertFiles(dir string) []string {
	return []string{filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "root-cert.pem")}
}
