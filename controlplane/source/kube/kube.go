// Package kube is the Kubernetes source: Services, EndpointSlices, Pods, Nodes and
// Namespaces become the mesh's services, endpoints and workloads, as Istio's Kubernetes
// registry makes them, and Istio's custom resources its configs, through the directory's
// parser and validator. Informers feed it (no polling); it publishes only what changed.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// Name is the source's name in events, debug pages and logs.
const Name = "kubernetes"

// Options configure a Source.
type Options struct {
	// Config reaches the API server (RESTConfig makes one from a kubeconfig or in-cluster).
	Config *rest.Config
	// DomainSuffix ends every Service's host: <name>.<namespace>.svc.<DomainSuffix>.
	// Default "cluster.local".
	DomainSuffix string
	// ClusterID labels every endpoint (topology.istio.io/cluster). Default "Kubernetes".
	ClusterID string
	// Log is the logger; default slog.Default().
	Log *slog.Logger
	// IstioKinds are the Istio custom resources watched; nil: DefaultIstioKinds(). A kind
	// whose CRD is not installed is skipped with a warning, and watched once it is.
	IstioKinds []config.Kind
	// WriteStatus starts the status writer enabled (this replica writes objects' status);
	// StatusWriter().SetEnabled changes it later.
	WriteStatus bool
}

// Source is the Kubernetes source (source.Source).
type Source struct {
	opts   Options
	log    *slog.Logger
	kube   kubernetes.Interface
	istio  istioclient.Interface
	meta   metadata.Interface
	kinds  []*istioKind
	writer *StatusWriter
	q      *queue
	ran    atomic.Bool
	cfgs   *configs

	// Set up by Run and then owned by its worker.
	runState
}

var _ source.Source = (*Source)(nil)

// RESTConfig reaches the API server through the kubeconfig file given, else as the pod it
// runs in (in-cluster).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no kubeconfig given and not running in a cluster: %w", err)
	}
	return cfg, nil
}

// New returns a source for the API server opts.Config reaches. It does not connect: Run
// does, and keeps trying while the API server is away.
func New(opts Options) (*Source, error) {
	if opts.Config == nil {
		return nil, errors.New("kubernetes source: no API server configuration (Options.Config)")
	}
	cfg := rest.CopyConfig(opts.Config)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	cfg.Wrap(watchReachability(log.With("scope", "kube"), cfg.Host))
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	ic, err := istioclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("Istio client for %s: %w", cfg.Host, err)
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("metadata client for %s: %w", cfg.Host, err)
	}
	return newSource(opts, kc, ic, mc)
}

// newSource is New on clients made elsewhere (fakes, in tests).
func newSource(opts Options, kc kubernetes.Interface, ic istioclient.Interface, mc metadata.Interface) (*Source, error) {
	if opts.DomainSuffix == "" {
		opts.DomainSuffix = "cluster.local"
	}
	if opts.ClusterID == "" {
		opts.ClusterID = "Kubernetes"
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.IstioKinds == nil {
		opts.IstioKinds = DefaultIstioKinds()
	}
	s := &Source{opts: opts, log: opts.Log.With("scope", "kube"), kube: kc, istio: ic, meta: mc, q: newQueue()}
	if opts.Config != nil {
		s.host = opts.Config.Host
	}
	for _, k := range opts.IstioKinds {
		ik := findKind(k)
		if ik == nil {
			return nil, fmt.Errorf("kubernetes source: Istio kind %q is not one it can watch (%v)", k, DefaultIstioKinds())
		}
		s.kinds = append(s.kinds, ik)
	}
	s.cfgs = newConfigs(s.log)
	s.writer = newStatusWriter(s.log.With("component", "status"), ic, opts.WriteStatus)
	return s, nil
}

// Name implements source.Source.
func (s *Source) Name() string { return Name }

// Status lists the latest outcome of every Istio object the source sees (applied or
// rejected, and why), by kind, namespace and name.
func (s *Source) Status() []ObjectStatus { return s.cfgs.list() }

// StatusWriter is the component writing objects' outcomes back on them; enable it on the
// replica that leads.
func (s *Source) StatusWriter() *StatusWriter { return s.writer }

// Run implements source.Source: it publishes the cluster's state once every informer has
// listed (then Synced), and every change after, until ctx ends. An API server that is away,
// or refuses, is retried and logged; Run returns nil when ctx ends.
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	if s.ran.Swap(true) {
		return errors.New("kubernetes source: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		for _, stop := range s.shutdown {
			stop()
		}
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.writer.run(ctx)
	}()
	return s.serve(ctx, sink)
}
