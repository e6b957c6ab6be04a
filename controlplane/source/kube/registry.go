package kube

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// Indexes the informers keep besides namespace.
const (
	indexByService = "service" // EndpointSlices by namespace/service (kubernetes.io/service-name)
	indexByPod     = "pod"     // EndpointSlices by namespace/pod of each endpoint's targetRef
	indexByNode    = "node"    // Pods by node name
)

// registry is what the source has published of the service registry, and what it last saw
// of the objects endpoints depend on, so that a change publishes only what differs. It is
// owned by the worker.
type registry struct {
	domain, clusterID string
	services          map[nsName]*model.Service    // published, by Service
	endpoints         map[string][]*model.Endpoint // published, by host
	workloads         map[nsName]*model.Workload   // published, by Pod
	facts             map[nsName]*podFacts         // of every pod seen
	nodeLocality      map[string]string
	nsNetwork         map[string]string
}

type nsName struct{ ns, name string }

func newRegistry(domain, clusterID string) *registry {
	return &registry{domain: domain, clusterID: clusterID, services: map[nsName]*model.Service{}, endpoints: map[string][]*model.Endpoint{},
		workloads: map[nsName]*model.Workload{}, facts: map[nsName]*podFacts{}, nodeLocality: map[string]string{}, nsNetwork: map[string]string{}}
}

// listers are the informers' caches the registry reads.
type listers struct {
	services, slices, pods, nodes, namespaces cache.Indexer
}

// batch is what one pass of the worker publishes.
type batch struct {
	configs   source.ConfigEvent
	services  source.ServiceEvent
	endpoints []source.EndpointEvent
	workloads source.WorkloadEvent
}

func (b *batch) publish(from string, sink source.Sink) {
	if len(b.configs.Updated)+len(b.configs.Deleted) > 0 {
		sink.Configs(from, b.configs)
	}
	if len(b.services.Updated)+len(b.services.Deleted) > 0 {
		slices.SortFunc(b.services.Updated, model.CompareHosts)
		slices.Sort(b.services.Deleted)
		sink.Services(from, b.services)
	}
	slices.SortFunc(b.endpoints, func(a, b source.EndpointEvent) int { return strings.Compare(a.Host, b.Host) })
	for _, ev := range b.endpoints {
		sink.Endpoints(from, ev)
	}
	if len(b.workloads.Updated)+len(b.workloads.Deleted) > 0 {
		slices.SortFunc(b.workloads.Updated, func(a, b *model.Workload) int { return strings.Compare(a.Key(), b.Key()) })
		slices.Sort(b.workloads.Deleted)
		sink.Workloads(from, b.workloads)
	}
}

// update brings the published registry up to date with the refs queued: namespaces and
// nodes first (a changed network or locality reaches their pods), then pods (a changed
// pod reaches the services whose slices list it), then services.
func (r *registry) update(l listers, refs []ref, b *batch) {
	pods := map[nsName]struct{}{}
	svcs := map[nsName]struct{}{}
	for _, rf := range refs {
		switch rf.res {
		case resNamespace:
			r.namespaceChanged(l, rf.name, pods, svcs)
		case resNode:
			r.nodeChanged(l, rf.name, pods)
		case resPod:
			pods[nsName{rf.ns, rf.name}] = struct{}{}
		case resService:
			svcs[nsName{rf.ns, rf.name}] = struct{}{}
		}
	}
	for p := range pods {
		if r.podChanged(l, p, b) {
			for _, o := range byIndex(l.slices, indexByPod, p.ns+"/"+p.name) {
				sl := o.(*discoveryv1.EndpointSlice)
				if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
					svcs[nsName{sl.Namespace, svc}] = struct{}{}
				}
			}
		}
	}
	for s := range svcs {
		r.serviceChanged(l, s, b)
	}
}

func (r *registry) namespaceChanged(l listers, ns string, pods, svcs map[nsName]struct{}) {
	network := ""
	if o, ok, _ := l.namespaces.GetByKey(ns); ok {
		network = o.(*corev1.Namespace).Labels[labelNetwork]
	}
	if network == r.nsNetwork[ns] {
		return
	}
	if network == "" {
		delete(r.nsNetwork, ns)
	} else {
		r.nsNetwork[ns] = network
	}
	for _, o := range byIndex(l.pods, cache.NamespaceIndex, ns) {
		p := o.(*corev1.Pod)
		pods[nsName{p.Namespace, p.Name}] = struct{}{}
	}
	for _, o := range byIndex(l.services, cache.NamespaceIndex, ns) {
		s := o.(*corev1.Service)
		svcs[nsName{s.Namespace, s.Name}] = struct{}{}
	}
}

func (r *registry) nodeChanged(l listers, node string, pods map[nsName]struct{}) {
	loc := ""
	if o, ok, _ := l.nodes.GetByKey(node); ok {
		loc = nodeLocality(o.(*corev1.Node))
	}
	if loc == r.nodeLocality[node] {
		return
	}
	if loc == "" {
		delete(r.nodeLocality, node)
	} else {
		r.nodeLocality[node] = loc
	}
	for _, o := range byIndex(l.pods, indexByNode, node) {
		p := o.(*corev1.Pod)
		pods[nsName{p.Namespace, p.Name}] = struct{}{}
	}
}

// podChanged publishes the pod's workload if it changed, and reports whether what its
// endpoints read of it changed.
func (r *registry) podChanged(l listers, key nsName, b *batch) bool {
	var w *model.Workload
	var f *podFacts
	if o, ok, _ := l.pods.GetByKey(key.ns + "/" + key.name); ok {
		pod := o.(*corev1.Pod)
		f = factsOf(pod, r.nodeLocality[pod.Spec.NodeName], r.nsNetwork[pod.Namespace], r.clusterID)
		w = workloadOf(pod, f)
	}
	old := r.workloads[key]
	switch {
	case w != nil && (old == nil || !old.Equal(w)):
		r.workloads[key] = w
		b.workloads.Updated = append(b.workloads.Updated, w)
	case w == nil && old != nil:
		delete(r.workloads, key)
		b.workloads.Deleted = append(b.workloads.Deleted, key.ns+"/"+key.name)
	}
	oldFacts := r.facts[key]
	if f == nil {
		delete(r.facts, key)
		return oldFacts != nil
	}
	if oldFacts != nil && oldFacts.equal(f) {
		return false
	}
	r.facts[key] = f
	return true
}

// serviceChanged publishes the service and its endpoints where they changed.
func (r *registry) serviceChanged(l listers, key nsName, b *batch) {
	var ms *model.Service
	var eps []*model.Endpoint
	if o, ok, _ := l.services.GetByKey(key.ns + "/" + key.name); ok {
		svc := o.(*corev1.Service)
		ms = serviceOf(svc, r.domain)
		var sls []*discoveryv1.EndpointSlice
		for _, o := range byIndex(l.slices, indexByService, key.ns+"/"+key.name) {
			sls = append(sls, o.(*discoveryv1.EndpointSlice))
		}
		eps = endpointsOf(svc, ms, sls, endpointFacts{
			pod:  func(ns, name string) *podFacts { return r.facts[nsName{ns, name}] },
			node: func(name string) string { return r.nodeLocality[name] }, nsNetwork: r.nsNetwork[key.ns],
		})
	}
	old := r.services[key]
	host := Hostname(key.name, key.ns, r.domain)
	switch {
	case ms != nil && !model.ServiceEqual(old, ms):
		r.services[key] = ms
		b.services.Updated = append(b.services.Updated, ms)
	case ms == nil && old != nil:
		delete(r.services, key)
		b.services.Deleted = append(b.services.Deleted, host)
	}
	if !model.EndpointsEqual(r.endpoints[host], eps) {
		if len(eps) == 0 {
			delete(r.endpoints, host)
		} else {
			r.endpoints[host] = eps
		}
		b.endpoints = append(b.endpoints, source.EndpointEvent{Host: host, Endpoints: eps})
	}
}

func byIndex(ix cache.Indexer, index, value string) []any {
	out, _ := ix.ByIndex(index, value)
	return out
}

// registryIndexers are the indexes update reads.
func sliceIndexers() cache.Indexers {
	return cache.Indexers{
		indexByService: func(o any) ([]string, error) {
			sl := o.(*discoveryv1.EndpointSlice)
			if svc := sl.Labels[discoveryv1.LabelServiceName]; svc != "" {
				return []string{sl.Namespace + "/" + svc}, nil
			}
			return nil, nil
		},
		indexByPod: func(o any) ([]string, error) {
			sl := o.(*discoveryv1.EndpointSlice)
			var out []string
			for _, e := range sl.Endpoints {
				if r := e.TargetRef; r != nil && r.Kind == "Pod" {
					ns := r.Namespace
					if ns == "" {
						ns = sl.Namespace
					}
					out = append(out, ns+"/"+r.Name)
				}
			}
			return out, nil
		},
	}
}

func podIndexers() cache.Indexers {
	return cache.Indexers{indexByNode: func(o any) ([]string, error) {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}, nil
		}
		return nil, nil
	}}
}
