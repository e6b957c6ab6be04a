package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// runState is what Run sets up; its worker owns it.
type runState struct {
	host     string // the API server, for messages
	ctx      context.Context
	kubeInf  informers.SharedInformerFactory
	istioInf istioinformers.SharedInformerFactory
	listers  listers
	watched  map[config.Kind]*watchedKind
	missing  map[string]*istioKind // by CRD name: kinds not served yet
	shutdown []func()              // waits for informers' goroutines once ctx ends
	reg      *registry
}

type watchedKind struct {
	*istioKind
	informer cache.SharedIndexInformer
}

// serve waits for the API server, starts the informers, publishes the state they list, then
// every change.
func (s *Source) serve(ctx context.Context, sink source.Sink) error {
	served, missing, ok := s.discover(ctx)
	if !ok {
		return nil
	}
	s.ctx = ctx
	s.reg = newRegistry(s.opts.DomainSuffix, s.opts.ClusterID)
	s.watched, s.missing = map[config.Kind]*watchedKind{}, map[string]*istioKind{}
	s.kubeInf = informers.NewSharedInformerFactoryWithOptions(s.kube, 0, informers.WithTransform(stripManagedFields))
	s.istioInf = istioinformers.NewSharedInformerFactoryWithOptions(s.istio, 0, istioinformers.WithTransform(stripManagedFields))
	synced, err := s.watchKube()
	if err != nil {
		return err
	}
	for _, k := range served {
		c, err := s.watchKind(k)
		if err != nil {
			return err
		}
		synced = append(synced, c)
	}
	s.kubeInf.Start(ctx.Done())
	s.istioInf.Start(ctx.Done())
	s.shutdown = append(s.shutdown, s.kubeInf.Shutdown, s.istioInf.Shutdown)
	for _, k := range missing {
		s.log.Warn("Istio CRD not installed: its kind is not watched until it is", "kind", k.kind, "crd", k.crdName())
		s.missing[k.crdName()] = k
	}
	if len(missing) > 0 && s.meta != nil {
		s.watchCRDs(ctx, s.missing)
	}
	if !cache.WaitFor(ctx, "kubernetes informers", synced...) {
		return nil
	}
	s.process(sink, s.q.take())
	sink.Synced(s.Name())
	s.log.Info("synced with the Kubernetes API server", "server", s.host, "istioKinds", len(served), "skippedKinds", len(missing))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.q.wake:
			s.process(sink, s.q.take())
		}
	}
}

// discover finds which Istio kinds the API server serves, trying again (backing off up to
// 30 s) while it cannot be reached or refuses; false once ctx ends.
func (s *Source) discover(ctx context.Context) (served, missing []*istioKind, ok bool) {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 30 * time.Second}
	for attempt := 1; ; attempt++ {
		served, missing, err := servedKinds(s.kube.Discovery(), s.kinds)
		if err == nil {
			if attempt > 1 {
				s.log.Info("Kubernetes API server reached", "server", s.host, "attempts", attempt)
			}
			return served, missing, true
		}
		d := backoff.Step()
		s.log.Error("Kubernetes API server unavailable; retrying", "server", s.host, "attempt", attempt, "retryIn", d.String(), "error", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, false
		case <-t.C:
		}
	}
}

// watchKube registers the informers of the service registry and returns what says they
// have delivered their initial lists.
func (s *Source) watchKube() ([]cache.DoneChecker, error) {
	f := s.kubeInf
	type watch struct {
		inf      cache.SharedIndexInformer
		what     string
		indexers cache.Indexers
		handler  cache.ResourceEventHandler
	}
	watches := []watch{
		{f.Core().V1().Services().Informer(), "services", nil, s.handler(resService)},
		{f.Discovery().V1().EndpointSlices().Informer(), "endpointslices.discovery.k8s.io", sliceIndexers(), s.sliceHandler()},
		{f.Core().V1().Pods().Informer(), "pods", podIndexers(), s.handler(resPod)},
		{f.Core().V1().Nodes().Informer(), "nodes", nil, s.handler(resNode)},
		{f.Core().V1().Namespaces().Informer(), "namespaces", nil, s.handler(resNamespace)},
	}
	var synced []cache.DoneChecker
	for _, w := range watches {
		if w.indexers != nil {
			if err := w.inf.AddIndexers(w.indexers); err != nil {
				return nil, err
			}
		}
		_ = w.inf.SetWatchErrorHandlerWithContext(s.watchErrorHandler(w.what))
		reg, err := w.inf.AddEventHandler(w.handler)
		if err != nil {
			return nil, err
		}
		synced = append(synced, reg.HasSyncedChecker())
	}
	s.listers = listers{services: watches[0].inf.GetIndexer(), slices: watches[1].inf.GetIndexer(), pods: watches[2].inf.GetIndexer(),
		nodes: watches[3].inf.GetIndexer(), namespaces: watches[4].inf.GetIndexer()}
	return synced, nil
}

// watchKind registers the informer of an Istio kind (the factory starts it).
func (s *Source) watchKind(k *istioKind) (cache.DoneChecker, error) {
	inf := k.informer(s.istioInf)
	_ = inf.SetWatchErrorHandlerWithContext(s.watchErrorHandler(k.resource + "." + k.group))
	kind := k.kind
	reg, err := inf.AddEventHandler(s.handlerFunc(func(m metav1.Object) ref {
		return ref{res: resConfig, kind: kind, ns: m.GetNamespace(), name: m.GetName()}
	}))
	if err != nil {
		return nil, err
	}
	s.watched[k.kind] = &watchedKind{istioKind: k, informer: inf}
	return reg.HasSyncedChecker(), nil
}

func (s *Source) handler(res resource) cache.ResourceEventHandler {
	return s.handlerFunc(func(m metav1.Object) ref { return ref{res: res, ns: m.GetNamespace(), name: m.GetName()} })
}

// handlerFunc queues the ref of each object added, changed or deleted; an update that
// leaves the object's resourceVersion as it was (a relist) queues nothing.
func (s *Source) handlerFunc(refOf func(metav1.Object) ref) cache.ResourceEventHandler {
	queue := func(o any) {
		if m, err := metaOf(o); err == nil {
			s.q.add(refOf(m))
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { queue(o) },
		UpdateFunc: func(old, o any) {
			if sameVersion(old, o) {
				return
			}
			queue(o)
		},
		DeleteFunc: queue,
	}
}

// sliceHandler queues the Service of each EndpointSlice changed (both, should its
// service-name label change).
func (s *Source) sliceHandler() cache.ResourceEventHandler {
	queue := func(o any) {
		if m, err := metaOf(o); err == nil {
			if svc := m.GetLabels()[discoveryv1.LabelServiceName]; svc != "" {
				s.q.add(ref{res: resService, ns: m.GetNamespace(), name: svc})
			}
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { queue(o) },
		UpdateFunc: func(old, o any) {
			if sameVersion(old, o) {
				return
			}
			queue(old)
			queue(o)
		},
		DeleteFunc: queue,
	}
}

func sameVersion(a, b any) bool {
	ma, err1 := metaOf(a)
	mb, err2 := metaOf(b)
	return err1 == nil && err2 == nil && ma.GetResourceVersion() != "" && ma.GetResourceVersion() == mb.GetResourceVersion()
}

func metaOf(o any) (metav1.Object, error) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	return meta.Accessor(o)
}

// stripManagedFields drops what the source never reads and costs most memory.
func stripManagedFields(o any) (any, error) {
	if m, err := meta.Accessor(o); err == nil {
		m.SetManagedFields(nil)
	}
	return o, nil
}

// watchErrorHandler logs why an informer cannot list or watch (the informer retries,
// backing off): a refusal names the verb and resource, anything else the server. The same
// error again is logged at debug level.
func (s *Source) watchErrorHandler(resource string) cache.WatchErrorHandlerWithContext {
	var mu sync.Mutex
	last := ""
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || apierrors.IsNotFound(err) {
			// A watch closing, or a CRD not served yet (crdChanged): the informer lists again.
			s.log.Debug("cannot list or watch "+resource+"; retrying", "resource", resource, "error", err)
			return
		}
		mu.Lock()
		repeated := err.Error() == last
		last = err.Error()
		mu.Unlock()
		level := slog.LevelWarn
		if repeated {
			level = slog.LevelDebug
		}
		if apierrors.IsForbidden(err) {
			s.log.Log(ctx, level, "forbidden to list and watch "+resource+"; the source needs both verbs on it (RBAC)",
				"resource", resource, "verbs", "list,watch", "server", s.host, "error", err)
			return
		}
		s.log.Log(ctx, level, "cannot list or watch "+resource+"; retrying", "resource", resource, "server", s.host, "error", err)
	}
}

// process brings what the source published up to date with the refs queued, and
// publishes what changed, in one batch.
func (s *Source) process(sink source.Sink, refs []ref) {
	var b batch
	for _, r := range refs {
		if r.res == resCRD {
			s.crdChanged(r.name)
		}
	}
	s.reg.update(s.listers, refs, &b)
	for _, r := range refs {
		if r.res == resConfig {
			s.configChanged(r, &b)
		}
	}
	b.publish(s.Name(), sink)
}

func (s *Source) configChanged(r ref, b *batch) {
	w := s.watched[r.kind]
	if w == nil {
		return
	}
	key := config.Key{Kind: r.kind, Namespace: r.ns, Name: r.name}
	obj, exists, _ := w.informer.GetIndexer().GetByKey(r.ns + "/" + r.name)
	if !exists {
		s.cfgs.update(w.istioKind, key, nil, b)
		s.writer.report(key, statusReport{}, true)
		return
	}
	cerr := s.cfgs.update(w.istioKind, key, obj, b)
	m, _, st := w.object(obj)
	rep := statusReport{kind: w.istioKind, generation: m.GetGeneration(), resourceVersion: m.GetResourceVersion(), current: st}
	if cerr != nil {
		rep.err = cerr.Error()
	}
	s.writer.report(key, rep, false)
}

// crdChanged starts watching the kind of a CRD that was not served. Discovery may lag
// behind the CRD becoming established, and nothing else changes then to queue it again:
// the informer starts at once, and its lists are retried (quietly, while the API server
// answers that the resource is not there) until they succeed.
func (s *Source) crdChanged(name string) {
	k := s.missing[name]
	if k == nil {
		return
	}
	if _, err := s.watchKind(k); err != nil {
		s.log.Error("cannot watch Istio kind", "kind", k.kind, "error", err)
		return
	}
	delete(s.missing, name)
	s.istioInf.Start(s.ctx.Done())
	s.log.Info("Istio CRD installed: its kind is watched from now on", "kind", k.kind, "crd", name)
}
