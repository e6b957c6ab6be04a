// Package server assembles meshproxy: it loads the bootstrap, builds the stats store, the
// cluster and listener managers, the HTTP filter registry and the admin API, runs the ADS
// client that feeds them, tracks Envoy's server state (PRE_INITIALIZING, INITIALIZING,
// LIVE, DRAINING) and carries out drains, hot restart and shutdown.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	dcv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/downstream_connections/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/testenv/proxy/admin"
	"github.com/wasmesh/wasmesh/testenv/proxy/bootstrap"
	"github.com/wasmesh/wasmesh/testenv/proxy/drain"
	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/listener"
	"github.com/wasmesh/wasmesh/testenv/proxy/logging"
	"github.com/wasmesh/wasmesh/testenv/proxy/router"
	"github.com/wasmesh/wasmesh/testenv/proxy/sds"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/upstream"
	"github.com/wasmesh/wasmesh/testenv/proxy/xdsclient"
)

// Options are the command-line options (Envoy's).
type Options struct {
	ConfigPath         string
	ConfigYAML         string
	Mode               string // "serve" or "validate"
	RestartEpoch       int
	DrainTime          time.Duration
	ParentShutdownTime time.Duration
	DrainStrategy      string
	ServiceCluster     string
	ServiceNode        string
	BaseID             uint64
	LogLevel           string
	ComponentLogLevel  string
	Concurrency        int
	// ContentionProfiling turns on Go's block and mutex profiles (/debug/pprof/block, /mutex).
	ContentionProfiling   bool
	LocalAddressIPVersion string
	AdminAddressPath      string
	// Stdout receives access logs written to /dev/stdout; Stderr the proxy's logs.
	Stdout, Stderr io.Writer
	// Test are the test hooks (testhooks.go), from the environment; empty in production.
	Test TestHooks
}

// Server states, as Envoy names them.
const (
	StatePreInitializing = "PRE_INITIALIZING"
	StateInitializing    = "INITIALIZING"
	StateLive            = "LIVE"
	StateDraining        = "DRAINING"
)

// Server is one running proxy.
type Server struct {
	opts    Options
	boot    *bootstrapv3.Bootstrap
	loggers *logging.Loggers
	log     *slog.Logger
	store   *stats.Store

	clusters  *upstream.Manager
	secrets   *sds.Manager
	listeners *listener.Manager
	buffers   *hcm.BufferPool
	registry  *hcm.Registry
	// networkFilters are the non-terminal network filters by type URL (extensions add theirs).
	networkFilters map[string]listener.NetworkFilterFactory
	admin          *admin.Server
	adminLis       net.Listener
	xds            *xdsclient.Client

	serverDrain  *drain.Drainer
	inboundDrain *drain.Drainer

	mu       sync.Mutex
	routes   map[string]*hcm.RouteHandle
	filters  map[string]*hcm.FilterHandle
	dyn      map[string]map[string]resourceMeta // type URL → name → meta (RDS, ECDS, EDS)
	versions map[string]string                  // last accepted version per type

	state     atomic.Value // string
	hcFailed  atomic.Bool
	cdsInit   atomic.Bool
	ldsInit   atomic.Bool
	started   time.Time
	quit      chan struct{}
	quitOnce  sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	hotParent HotRestartParent
}

type resourceMeta struct {
	version string
	at      time.Time
	proto   any
}

// HotRestartParent is the link to the previous epoch, when there is one.
type HotRestartParent interface {
	listener.SocketSource
	// TakeAdmin returns the previous epoch's admin socket for addr.
	TakeAdmin(addr string) (net.Listener, bool)
	// DrainParent tells the previous epoch to stop accepting and drain.
	DrainParent()
	// Terminate tells the previous epoch to exit.
	Terminate()
}

// Extension adds filters or hooks to a server before it starts (Wasm, fault, CORS).
type Extension func(s *Server) error

// Registry is the HTTP filter registry, for extensions.
func (s *Server) Registry() *hcm.Registry { return s.registry }

// Store is the stats store.
func (s *Server) Store() *stats.Store { return s.store }

// ClusterManager is the cluster manager.
func (s *Server) ClusterManager() *upstream.Manager { return s.clusters }

// Bootstrap is the parsed bootstrap.
func (s *Server) Bootstrap() *bootstrapv3.Bootstrap { return s.boot }

// Logger returns a component logger.
func (s *Server) Logger(component string) *slog.Logger { return s.loggers.For(component) }

// Options returns the command-line options.
func (s *Server) Options() Options { return s.opts }

// Context is the server's lifetime.
func (s *Server) Context() context.Context { return s.ctx }

// LoadBootstrap reads the bootstrap named by the options.
func LoadBootstrap(o Options) (*bootstrapv3.Bootstrap, error) {
	ov := bootstrap.Overrides{ServiceNode: o.ServiceNode, ServiceCluster: o.ServiceCluster}
	if o.ConfigPath == "" && o.ConfigYAML == "" {
		return nil, errors.New("no bootstrap: pass -c/--config-path or --config-yaml")
	}
	var b *bootstrapv3.Bootstrap
	var err error
	if o.ConfigPath != "" {
		b, err = bootstrap.Load(o.ConfigPath, ov)
	} else {
		b, err = bootstrap.Parse([]byte(o.ConfigYAML), true)
		if err == nil {
			bootstrap.Apply(b, ov)
		}
	}
	return b, err
}

// New builds a server from the options without starting anything.
func New(parent context.Context, o Options, exts ...Extension) (*Server, error) {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Concurrency <= 0 {
		o.Concurrency = runtime.NumCPU()
	}
	switch o.LocalAddressIPVersion {
	case "", "v4", "v6":
	default:
		return nil, fmt.Errorf("--local-address-ip-version %q: want v4 or v6", o.LocalAddressIPVersion)
	}
	level, err := logging.ParseLevel(orDefault(o.LogLevel, "info"))
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	loggers := logging.New(o.Stderr, level)
	if err := loggers.SetComponents(o.ComponentLogLevel); err != nil {
		return nil, fmt.Errorf("--component-log-level: %w", err)
	}
	b, err := LoadBootstrap(o)
	if err != nil {
		return nil, err
	}
	tags, err := stats.NewTagExtractor(b.GetStatsConfig())
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	matcher, err := stats.NewMatcher(b.GetStatsConfig().GetStatsMatcher())
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	strategy := drain.Gradual
	switch o.DrainStrategy {
	case "", "gradual":
	case "immediate":
		strategy = drain.Immediate
	default:
		return nil, fmt.Errorf("--drain-strategy %q: want gradual or immediate", o.DrainStrategy)
	}
	ctx, cancel := context.WithCancel(parent)
	s := &Server{opts: o, boot: b, loggers: loggers, log: loggers.For("main"), buffers: hcm.NewBufferPool(1024),
		store:          stats.NewStore(tags, matcher),
		registry:       hcm.NewRegistry(),
		networkFilters: map[string]listener.NetworkFilterFactory{},
		serverDrain:    drain.New(strategy, o.DrainTime), inboundDrain: drain.New(strategy, o.DrainTime),
		routes: map[string]*hcm.RouteHandle{}, filters: map[string]*hcm.FilterHandle{},
		dyn: map[string]map[string]resourceMeta{}, versions: map[string]string{},
		started: time.Now(), quit: make(chan struct{}), ctx: ctx, cancel: cancel}
	s.state.Store(StatePreInitializing)
	s.registry.Register(router.TypeURL, router.Factory)
	s.clusters = upstream.NewManager(ctx, s.store, loggers.For("upstream"))
	if err := s.newSecrets(); err != nil {
		cancel()
		return nil, err
	}
	s.serverStats()
	if err := s.applyTestHooks(); err != nil {
		cancel()
		return nil, err
	}
	for _, e := range exts {
		if err := e(s); err != nil {
			cancel()
			return nil, err
		}
	}
	return s, nil
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func (s *Server) serverStats() {
	sc := s.store.Scope("server")
	sc.Gauge("concurrency").Set(int64(s.opts.Concurrency))
	sc.Gauge("hot_restart_epoch").Set(int64(s.opts.RestartEpoch))
	sc.Gauge("live").Set(0)
	sc.Gauge("state").Set(2)
}

// maxConnections reads the overload manager's global downstream connection limit (the
// downstream_connections resource monitor, or the older runtime key).
func maxConnections(b *bootstrapv3.Bootstrap) int64 {
	for _, rm := range b.GetOverloadManager().GetResourceMonitors() {
		cfg := &dcv3.DownstreamConnectionsConfig{}
		if rm.GetTypedConfig().MessageIs(cfg) && rm.GetTypedConfig().UnmarshalTo(cfg) == nil {
			return cfg.GetMaxActiveDownstreamConnections()
		}
	}
	for _, l := range b.GetLayeredRuntime().GetLayers() {
		if f := l.GetStaticLayer().GetFields()["overload.global_downstream_max_connections"]; f != nil {
			return int64(f.GetNumberValue())
		}
	}
	return 0
}

// Validate builds every static resource of the bootstrap without binding anything
// (--mode validate).
func Validate(o Options) error {
	o.Stderr = io.Discard
	s, err := New(context.Background(), o, DefaultExtensions()...)
	if err != nil {
		return err
	}
	defer s.cancel()
	for _, c := range s.boot.GetStaticResources().GetClusters() {
		if err := s.clusters.Validate(c); err != nil {
			return err
		}
	}
	s.listeners = listener.NewManager(s.ctx, s.listenerDeps())
	for _, l := range s.boot.GetStaticResources().GetListeners() {
		if err := s.listeners.Validate(l); err != nil {
			return err
		}
	}
	return nil
}

func (s *Server) listenerDeps() listener.Deps {
	d := listener.Deps{Store: s.store, Log: s.loggers.For("conn_handler"), Server: s.serverDrain, Inbound: s.inboundDrain,
		MaxConns: maxConnections(s.boot), DrainTime: s.opts.DrainTime, Secrets: s.secrets,
		NetworkFilters: s.networkFilters,
		HCM: func(li hcm.ListenerInfo, drainers drain.Any) *hcm.Context {
			return &hcm.Context{Store: s.store, Clusters: s.clusters, Log: s.loggers.For("http"), Registry: s.registry,
				Providers: s, Listener: li, Drain: drainers, AccessLog: s.opts.Stdout, Buffers: s.buffers}
		}}
	if s.hotParent != nil {
		d.Sockets = s.hotParent
	}
	return d
}

// SetHotRestartParent links the server to the previous epoch (before Start).
func (s *Server) SetHotRestartParent(p HotRestartParent) { s.hotParent = p }

// Routes implements hcm.Providers.
func (s *Server) Routes(name string) *hcm.RouteHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.routes[name]
	if h == nil {
		h = &hcm.RouteHandle{Name: name}
		s.routes[name] = h
	}
	return h
}

// Filter implements hcm.Providers.
func (s *Server) Filter(name string) *hcm.FilterHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.filters[name]
	if h == nil {
		h = &hcm.FilterHandle{Name: name}
		s.filters[name] = h
	}
	return h
}

// Start installs the static resources, binds the admin API and the listeners, and
// starts the xDS client.
func (s *Server) Start() error {
	s.state.Store(StateInitializing)
	for _, c := range s.boot.GetStaticResources().GetClusters() {
		if err := s.clusters.AddOrUpdate(c, "", true); err != nil {
			return fmt.Errorf("static_resources: %w", err)
		}
	}
	s.listeners = listener.NewManager(s.ctx, s.listenerDeps())
	for _, l := range s.boot.GetStaticResources().GetListeners() {
		if err := s.listeners.AddOrUpdate(l, "", true); err != nil {
			return fmt.Errorf("static_resources: %w", err)
		}
	}
	if err := s.startAdmin(); err != nil {
		return err
	}
	s.clusters.OnChange(s.changed)
	s.listeners.OnChange(s.changed)
	if err := s.startXDS(); err != nil {
		return err
	}
	go s.initWatch()
	s.changed()
	return nil
}

func (s *Server) startAdmin() error {
	addr := s.boot.GetAdmin().GetAddress()
	if addr == nil {
		return nil
	}
	a, err := listener.SocketAddress(addr)
	if err != nil {
		return fmt.Errorf("admin.address: %w", err)
	}
	var lis net.Listener
	if s.hotParent != nil {
		lis, _ = s.hotParent.TakeAdmin(a)
	}
	if lis == nil {
		lis, err = net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("admin: cannot bind %s: %w", a, err)
		}
	}
	s.adminLis = lis
	s.admin = admin.New(s, s.store, s.loggers)
	if err := s.recordAdminPosts(); err != nil {
		return err
	}
	go s.admin.Serve(s.ctx, lis)
	s.log.Info("admin address", "address", lis.Addr().String())
	if p := s.opts.AdminAddressPath; p != "" {
		if err := os.WriteFile(p, []byte(lis.Addr().String()), 0o644); err != nil {
			return fmt.Errorf("--admin-address-path: %w", err)
		}
	}
	return nil
}

// AdminAddress is the bound admin address ("" without admin).
func (s *Server) AdminAddress() string {
	if s.adminLis == nil {
		return ""
	}
	return s.adminLis.Addr().String()
}

// AdminListener is the admin socket (for the hot-restart handover).
func (s *Server) AdminListener() net.Listener { return s.adminLis }

// CloseAdmin stops serving the admin API (the parent hands the socket over).
func (s *Server) CloseAdmin() {
	if s.admin != nil {
		s.admin.Close()
	}
}

// ListenerManager is the listener manager.
func (s *Server) ListenerManager() *listener.Manager { return s.listeners }

// xdsBackoff reads the ADS stream's reconnect back-off (envoy_grpc.retry_policy
// .retry_back_off), Envoy's defaults when unset. An unset max is ten times the base, as
// Envoy documents.
func xdsBackoff(g *corev3.GrpcService_EnvoyGrpc) (base, max time.Duration, err error) {
	bo := g.GetRetryPolicy().GetRetryBackOff()
	if bo == nil {
		return xdsclient.DefaultBackoffBase, xdsclient.DefaultBackoffMax, nil
	}
	base, max = bo.GetBaseInterval().AsDuration(), bo.GetMaxInterval().AsDuration()
	if max == 0 {
		max = 10 * base
	}
	if base <= 0 || max < base {
		return 0, 0, fmt.Errorf("dynamic_resources.ads_config: envoy_grpc.retry_policy.retry_back_off: base_interval %s must be positive and at most max_interval %s", base, max)
	}
	return base, max, nil
}

func (s *Server) startXDS() error {
	dr := s.boot.GetDynamicResources()
	ads := dr.GetAdsConfig()
	if ads == nil {
		s.cdsInit.Store(true)
		s.ldsInit.Store(true)
		return nil
	}
	if dr.GetCdsConfig() == nil {
		s.cdsInit.Store(true)
	}
	if dr.GetLdsConfig() == nil {
		s.ldsInit.Store(true)
	}
	var delta bool
	switch ads.GetApiType() {
	case corev3.ApiConfigSource_GRPC, corev3.ApiConfigSource_AGGREGATED_GRPC:
	case corev3.ApiConfigSource_DELTA_GRPC, corev3.ApiConfigSource_AGGREGATED_DELTA_GRPC:
		delta = true
	default:
		return fmt.Errorf("dynamic_resources.ads_config.api_type %s is not supported", ads.GetApiType())
	}
	if len(ads.GetGrpcServices()) == 0 || ads.GetGrpcServices()[0].GetEnvoyGrpc() == nil {
		return errors.New("dynamic_resources.ads_config: want one grpc_services entry with envoy_grpc")
	}
	clusterName := ads.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName()
	backoffBase, backoffMax, err := xdsBackoff(ads.GetGrpcServices()[0].GetEnvoyGrpc())
	if err != nil {
		return err
	}
	cl := s.clusters.Get(clusterName)
	if cl == nil {
		return fmt.Errorf("dynamic_resources.ads_config: cluster %q is not a static cluster", clusterName)
	}
	conn, err := grpc.NewClient("passthrough:///"+clusterName,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Envoy opens a new connection for each stream attempt; gRPC's channel would
		// otherwise redial on its own back-off (up to 120 s) and fail the attempts fast.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: backoffBase, Multiplier: 2, Jitter: 0.2, MaxDelay: backoffMax}}),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			h := cl.Choose(&upstream.LBContext{})
			if h == nil {
				return nil, fmt.Errorf("xds cluster %s has no hosts", clusterName)
			}
			var d net.Dialer
			return d.DialContext(ctx, h.DialNetwork(), h.Address)
		}))
	if err != nil {
		return fmt.Errorf("ads: %w", err)
	}
	go func() {
		<-s.ctx.Done()
		_ = conn.Close()
	}()
	sc := s.store.Scope("cluster." + clusterName)
	connected := s.store.Gauge("control_plane.connected_state")
	s.xds = xdsclient.New(xdsclient.Config{Conn: conn, Node: s.boot.GetNode(), Delta: delta, Log: s.loggers.For("config"),
		BackoffBase: backoffBase, BackoffMax: backoffMax,
		OnEvent: func(e, t string) {
			switch e {
			case "connected":
				connected.Set(1)
			case "disconnected":
				connected.Set(0)
				sc.Counter("upstream_cx_destroy").Inc()
			case "ack":
				s.store.Counter(typeStatPrefix(t) + ".update_success").Inc()
			case "nack":
				s.store.Counter(typeStatPrefix(t) + ".update_rejected").Inc()
			}
		}}, s)
	go s.xds.Run(s.ctx)
	go s.initialFetchTimeout(dr)
	return nil
}

func typeStatPrefix(t string) string {
	switch t {
	case xdsclient.CDS:
		return "cluster_manager.cds"
	case xdsclient.LDS:
		return "listener_manager.lds"
	case xdsclient.EDS:
		return "cluster.xds.eds"
	case xdsclient.RDS:
		return "http.rds"
	}
	return "extension_config_discovery"
}

// initialFetchTimeout lets initialization finish without the control plane after
// Envoy's initial_fetch_timeout (15 s by default).
func (s *Server) initialFetchTimeout(dr *bootstrapv3.Bootstrap_DynamicResources) {
	timeout := 15 * time.Second
	if t := dr.GetCdsConfig().GetInitialFetchTimeout(); t != nil {
		timeout = t.AsDuration()
	}
	if timeout <= 0 {
		return
	}
	select {
	case <-s.ctx.Done():
		return
	case <-time.After(timeout):
	}
	s.cdsInit.Store(true)
	s.ldsInit.Store(true)
	s.changed()
}

// changed re-evaluates warming listeners, subscriptions and the server state.
func (s *Server) changed() {
	if s.listeners != nil {
		_ = s.listeners.Recheck()
	}
	if s.xds != nil {
		s.xds.Resubscribe()
	}
	s.evaluateState()
}

func (s *Server) initWatch() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for s.State() != StateLive && s.ctx.Err() == nil {
		select {
		case <-t.C:
			s.evaluateState()
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *Server) evaluateState() {
	cur, _ := s.state.Load().(string)
	if cur != StateInitializing {
		return
	}
	if !s.cdsInit.Load() || !s.ldsInit.Load() || len(s.clusters.Warming()) > 0 || len(s.listeners.Warming()) > 0 {
		return
	}
	if s.state.CompareAndSwap(StateInitializing, StateLive) {
		s.store.Gauge("server.live").Set(1)
		s.store.Gauge("server.state").Set(0)
		s.log.Info("all dependencies initialized. starting workers")
		s.listeners.StartWorkers()
		if s.hotParent != nil {
			go s.finishHotRestart()
		}
	}
}

// State implements admin.Backend: DRAINING once draining started or the health check
// was failed, as Envoy reports.
func (s *Server) State() string {
	st, _ := s.state.Load().(string)
	if s.hcFailed.Load() || s.serverDrain.Draining() {
		return StateDraining
	}
	return st
}

// Done is closed when the server was asked to quit.
func (s *Server) Done() <-chan struct{} { return s.quit }

// Quit implements admin.Backend.
func (s *Server) Quit() { s.quitOnce.Do(func() { close(s.quit) }) }

// SetHealthCheckFailed implements admin.Backend.
func (s *Server) SetHealthCheckFailed(v bool) {
	s.hcFailed.Store(v)
	if v {
		s.store.Gauge("server.state").Set(1)
	} else if s.State() == StateLive {
		s.store.Gauge("server.state").Set(0)
	}
}

// DrainListeners implements admin.Backend. Graceful drains (Connection: close and
// GOAWAY, per the drain strategy) while still accepting for the drain time, then stops
// the listeners; otherwise the listeners stop at once and their connections close after
// their current response.
func (s *Server) DrainListeners(inboundOnly, graceful bool) {
	d := s.serverDrain
	if inboundOnly {
		d = s.inboundDrain
	}
	d.Start()
	wait := time.Duration(0)
	if graceful {
		wait = s.opts.DrainTime
	}
	go func() {
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
			return
		}
		for _, l := range s.listeners.Active() {
			if inboundOnly && l.Direction != int(corev3.TrafficDirection_INBOUND) {
				continue
			}
			s.listeners.StopListener(l)
		}
	}()
}

// Shutdown stops the server: listeners stop accepting, connections get until ctx ends to
// finish (outbound listeners last, see listener.Manager.Shutdown), then everything closes.
func (s *Server) Shutdown(ctx context.Context) {
	s.state.Store(StateDraining)
	s.serverDrain.Start()
	if s.listeners != nil {
		s.listeners.Shutdown(ctx)
	}
	s.clusters.Close()
	s.cancel()
}

// Cancel ends the server's context at once.
func (s *Server) Cancel() { s.cancel() }

// Uptime is the time since the server started.
func (s *Server) Uptime() time.Duration { return time.Since(s.started) }

// finishHotRestart tells the previous epoch to drain once this one is live, and to exit
// after the parent shutdown time, as Envoy's child does.
func (s *Server) finishHotRestart() {
	s.hotParent.DrainParent()
	select {
	case <-time.After(s.opts.ParentShutdownTime):
		s.hotParent.Terminate()
	case <-s.ctx.Done():
	}
}
