// Package discovery assembles the control plane: the config directory and mesh config
// sources, the ServiceEntry registry with auto-registration, the xDS server and the debug
// HTTP server, wired so that every change flows through the debouncer into pushes.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/controlplane/logging"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/meshstate"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source"
	"github.com/wasmesh/wasmesh/controlplane/source/filedir"
	"github.com/wasmesh/wasmesh/controlplane/source/kube"
	"github.com/wasmesh/wasmesh/controlplane/wasmfetch"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

// Options configure a discovery server.
type Options struct {
	ConfigDir      string // Istio YAML; empty: no configs
	MeshConfigFile string // MeshConfig YAML; empty: defaults
	// GRPCAddr serves xDS in plaintext, unauthenticated: only on a loopback address (e.g.
	// "127.0.0.1:15010"); empty: none. Proxies elsewhere use the secure port (CA.SecureGRPCAddr).
	GRPCAddr string
	HTTPAddr string // debug and metrics, e.g. ":15014"; empty: none
	// Debounce merges changes before a push (PILOT_DEBOUNCE_*; unset: istiod's defaults);
	// Server tunes how pushes are sent.
	Debounce push.DebounceOptions
	Server   server.Options
	// MTLS generates mutual TLS between workloads (push.Options.MTLS; the command's --mtls,
	// on by default as istiod's auto mTLS; the library's zero value is off).
	MTLS bool
	// WorkloadGracePeriod keeps a disconnected auto-registered proxy registered
	// (PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).
	WorkloadGracePeriod time.Duration
	// ShutdownGrace bounds graceful shutdown of open streams.
	ShutdownGrace time.Duration
	// GRPCOptions are added to the xDS gRPC server's options (e.g. a stats handler).
	GRPCOptions []grpc.ServerOption
	// LogLevels, when set, is served on /debug/logging for run-time level changes.
	LogLevels *logging.Levels
	// WasmCacheDir is where WasmPlugin modules fetched over http(s) are kept, by sha256
	// (default: the user cache directory's wasmesh/wasm).
	WasmCacheDir string
	// Kube, when set, reaches the Kubernetes API server: its Services, EndpointSlices, Pods
	// and Istio objects are a source (after the directory: for one config key, the
	// directory's version wins; for one host, the Kubernetes Service wins over a
	// ServiceEntry). KubeStatus has this replica write the status of Istio objects (without
	// LeaderElection).
	Kube       *rest.Config
	KubeStatus bool
	// Namespace is discovery's own (POD_NAMESPACE): the Lease, the webhook's CA Secret and
	// Service are there. Identity names this replica in the Lease (default POD_NAME, else
	// the hostname).
	Namespace string
	Identity  string
	// LeaderElection, with Kube, elects one replica on a Lease to do what only one may:
	// write the status of Istio objects and patch the webhook's caBundle. LeaseDuration is
	// the Lease's (default leader.DefaultLeaseDuration).
	LeaderElection bool
	LeaseDuration  time.Duration
	// Webhook serves the admission webhooks (validation); zero: none.
	Webhook WebhookOptions
	// CA is the mesh's CA and Istio's certificate API on the secure port; zero: none.
	CA CAOptions
	// Sources are more config and service sources, after those in precedence.
	Sources []source.Source
}

// Discovery is an assembled control plane.
type Discovery struct {
	opts    Options
	log     *slog.Logger
	Metrics *metrics.Metrics
	Reg     *prometheus.Registry

	// Configs is the config directory (nil without one), Kube the Kubernetes API server
	// (nil without one): sources publishing to State.
	Configs *filedir.Source
	Kube    *kube.Source
	Mesh    *mesh.Watcher
	// State is what snapshots are built from, kept from the sources' events.
	State   *meshstate.State
	AutoReg *registry.AutoRegistration
	// Pusher decides what to send; Server sends it.
	Pusher *pusher.Pusher
	Server *server.Server
	// Modules fetches and caches WasmPlugin modules.
	Modules *wasmfetch.Fetcher
	// Webhook is the admission webhook server (nil without one); Leader elects the replica
	// doing the singleton work (nil without leader election).
	Webhook *webhook.Server
	Leader  *leader.Elector

	// Injector is the sidecar injection webhook (nil without one).
	Injector *inject.Webhook

	// CA is the mesh's CA (nil without one); its certificate service is on the secure port.
	CA *ca.Keeper

	webhookCerts webhook.Certs
	caBundles    []*webhook.CABundlePatcher
	rootCMs      *ca.RootPublisher
	secureCerts  *webhook.GeneratedCerts
	certService  *ca.Server // authenticates admin requests' bearer credentials (nil: none)
	secureGRPC   *grpc.Server
	secureLis    net.Listener

	grpcLis   net.Listener
	httpLis   net.Listener
	configDir string // absolute
}

// New builds the control plane and binds its listeners (so tests can ask for port 0 and
// read the address), reading the config directory and mesh config once. A config directory
// that cannot be read or a mesh config that does not parse is an error; bad documents are not.
func New(opts Options, log *slog.Logger) (*Discovery, error) {
	if opts.Debounce == (push.DebounceOptions{}) {
		opts.Debounce = push.DefaultDebounce()
	}
	d := &Discovery{opts: opts, log: log, Reg: prometheus.NewRegistry()}
	d.Reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	d.Metrics = metrics.New(d.Reg)
	mw, err := mesh.NewWatcher(opts.MeshConfigFile, log)
	if err != nil {
		return nil, err
	}
	d.Mesh = mw
	// The directory's configs win over another source's for one key; proxies' workloads come
	// last.
	if opts.Kube != nil {
		// With leader election, statuses are written once this replica leads.
		writeStatus := opts.KubeStatus && !opts.LeaderElection
		if d.Kube, err = kube.New(kube.Options{Config: opts.Kube, Log: log, WriteStatus: writeStatus}); err != nil {
			return nil, err
		}
		opts.Sources = append([]source.Source{d.Kube}, opts.Sources...)
		d.opts.Sources = opts.Sources
	}
	order := []string{filedir.Name}
	for _, src := range opts.Sources {
		order = append(order, src.Name())
	}
	d.State = meshstate.New(log, registry.NewServiceEntries(log, d.Metrics), func(r *push.Request) { d.Pusher.ConfigUpdate(r) },
		append(order, registry.ProxiesSource)...)
	grace := opts.WorkloadGracePeriod
	if grace <= 0 {
		grace = registry.DefaultGracePeriod
	}
	d.AutoReg = registry.NewAutoRegistration(d.State, grace, log, d.Metrics)
	if opts.ConfigDir != "" {
		if d.configDir, err = checkConfigDir(opts.ConfigDir); err != nil {
			return nil, err
		}
		d.Configs = filedir.New(opts.ConfigDir, log, d.Metrics)
		if err := d.Configs.Sync(); err != nil {
			return nil, err // it names the directory
		}
	} else {
		d.State.Synced(filedir.Name) // nothing to wait for
	}
	d.logSources()
	store, err := d.extensions(d.State)
	if err != nil {
		return nil, err
	}
	d.Pusher = pusher.New(log, d.Metrics, opts.Debounce, pusher.Deps{
		Registry: d.State.Registry, Configs: store, Mesh: d.Mesh.Mesh, OnSnapshot: d.onSnapshot,
		Options: push.Options{MTLS: opts.MTLS},
	})
	d.Server = server.New(log, d.Metrics, opts.Server, server.Deps{Generator: server.Pushes(d.Pusher), AutoRegistration: d.AutoReg})
	d.Mesh.AddHandler(func() { d.Pusher.ConfigUpdate(push.NewFull(push.ReasonMesh)) })

	if opts.GRPCAddr != "" {
		if err := checkLoopback(opts.GRPCAddr); err != nil {
			return nil, err
		}
		if d.grpcLis, err = net.Listen("tcp", opts.GRPCAddr); err != nil {
			return nil, fmt.Errorf("grpcAddr: %w", err)
		}
	}
	if opts.HTTPAddr != "" {
		if d.httpLis, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
			if d.grpcLis != nil {
				d.grpcLis.Close()
			}
			return nil, fmt.Errorf("httpAddr: %w", err)
		}
	}
	if err := d.singletons(); err != nil {
		for _, l := range []net.Listener{d.grpcLis, d.httpLis, d.secureLis} {
			if l != nil {
				l.Close()
			}
		}
		return nil, err
	}
	return d, nil
}

// checkLoopback refuses a plaintext xDS address that is not an explicit loopback one: anyone
// who reaches it could claim any proxy's identity (Istio's 15010 has the same hole).
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("grpcAddr %q: %w", addr, err)
	}
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
		return nil
	}
	return fmt.Errorf("grpcAddr %q: plaintext xDS is unauthenticated and served only on an explicit loopback address "+
		"(127.0.0.1:15010, [::1]:15010, localhost:15010); proxies on other hosts connect over TLS to secureGRPCAddr", addr)
}

// checkConfigDir returns the absolute path of the config directory, or why it is not one:
// a mesh served from a file or a missing path would be empty without a word.
func checkConfigDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("configDir %s: %w", dir, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is named once, below
		}
		return "", fmt.Errorf("configDir %s: %w", abs, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("configDir %s: not a directory (give the directory that holds the Istio YAML files)", abs)
	}
	return abs, nil
}

// logSources says what the mesh is served from: the config directory and how much of it
// was read, and the mesh config.
func (d *Discovery) logSources() {
	meshConfig := "Istio defaults"
	if d.opts.MeshConfigFile != "" {
		meshConfig, _ = filepath.Abs(d.opts.MeshConfigFile)
	}
	if d.Configs == nil {
		d.log.Warn("no configDir: serving no Istio config, so the mesh has no services; proxies that connect "+
			"are registered as workloads, but without ServiceEntries (read from configDir) they are endpoints of nothing",
			"meshConfig", meshConfig)
		return
	}
	rejected := 0
	for _, st := range d.Configs.Status() {
		if strings.HasPrefix(st.Status, "rejected") {
			rejected++
		}
	}
	d.log.Info("serving config", "configDir", d.configDir, "configs", d.Configs.InForce(),
		"documentsRejected", rejected, "meshConfig", meshConfig)
}

// documents is the directory's documents and their status, none without a directory.
func (d *Discovery) documents() []filedir.DocStatus {
	if d.Configs == nil {
		return nil
	}
	return d.Configs.Status()
}

// Settled reports whether every change handed in so far has reached every proxy it
// concerns: none waits in the pusher, and the server has no push queued or under way. Tests
// check with it that nothing else followed a change.
func (d *Discovery) Settled() bool {
	// In this order: a push is queued before its changes stop counting as unsettled.
	return d.Pusher.Settled() && d.Server.Idle()
}

// objects is the Kubernetes Istio objects and their status, none without Kubernetes.
func (d *Discovery) objects() []kube.ObjectStatus {
	if d.Kube == nil {
		return nil
	}
	return d.Kube.Status()
}

// GRPCAddr is the bound plaintext xDS address ("" without one).
func (d *Discovery) GRPCAddr() string {
	if d.grpcLis == nil {
		return ""
	}
	return d.grpcLis.Addr().String()
}

// HTTPAddr is the bound debug address ("" without one).
func (d *Discovery) HTTPAddr() string {
	if d.httpLis == nil {
		return ""
	}
	return d.httpLis.Addr().String()
}

// Run serves until ctx ends, then shuts down gracefully.
func (d *Discovery) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer d.AutoReg.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	if d.Configs != nil {
		goRun("configDir", func() error { return d.Configs.Run(ctx, d.State) })
	}
	for _, src := range d.opts.Sources {
		goRun(src.Name(), func() error { return src.Run(ctx, d.State) })
	}
	// The first snapshot is built once every source has published what it holds.
	goRun("push", func() error {
		if d.State.WaitReady(ctx) == nil {
			d.Pusher.Run(ctx)
		}
		return nil
	})
	goRun("send", func() error { d.Server.Run(ctx); return nil })
	goRun("meshConfig", func() error { return d.Mesh.Run(ctx) })
	goRun("wasmModules", func() error { return d.Modules.Run(ctx) })
	grace := d.opts.ShutdownGrace
	if grace <= 0 {
		grace = 5 * time.Second
	}
	if d.grpcLis != nil {
		goRun("grpc", func() error { return server.Serve(ctx, d.Server.GRPCServer(d.opts.GRPCOptions...), d.grpcLis, grace) })
	}
	d.runCA(ctx, goRun, grace)
	d.runSingletons(ctx, goRun, grace)
	if d.httpLis != nil {
		h := &http.Server{Handler: d.adminMux(), ReadHeaderTimeout: 10 * time.Second}
		goRun("http", func() error {
			errc := make(chan error, 1)
			go func() { errc <- h.Serve(d.httpLis) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, scancel := context.WithTimeout(context.Background(), grace)
			defer scancel()
			_ = h.Shutdown(sctx)
			if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	d.log.Info("discovery serving", "grpc", d.GRPCAddr(), "secureGRPC", d.SecureGRPCAddr(), "http", d.HTTPAddr(), "webhook", d.WebhookAddr(),
		"configDir", d.configDir)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}
