package kube

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// endpointFacts looks up what endpoints read besides their slice: the facts of a pod (nil
// when the pod is not known yet), a node's locality and a namespace's network.
type endpointFacts struct {
	pod       func(namespace, name string) *podFacts
	node      func(name string) string
	nsNetwork string
}

// endpointsOf is a service's endpoints: for an ExternalName service its external name on
// each port; otherwise every address of its EndpointSlices on each slice port that names a
// service port, its port the slice's (a named targetPort already resolved per pod by the
// EndpointSlice controller). Labels, service account, locality and network come from the
// endpoint's pod; an endpoint whose pod is not known yet is left out until it is, as Istio
// does, so that a subset never sees it without labels. An address listed twice (slices
// being rebalanced) counts once, with its best health.
func endpointsOf(svc *corev1.Service, ms *model.Service, slices []*discoveryv1.EndpointSlice, look endpointFacts) []*model.Endpoint {
	if ms.Resolution == model.DNSLB {
		eps := make([]*model.Endpoint, 0, len(ms.Ports))
		for _, p := range ms.Ports {
			eps = append(eps, &model.Endpoint{Address: svc.Spec.ExternalName, Port: p.Port, ServicePort: p.Port, Health: model.Healthy,
				Workload: "Service " + svc.Namespace + "/" + svc.Name, Namespace: svc.Namespace})
		}
		return eps
	}
	byName := make(map[string]model.Port, len(ms.Ports))
	for _, p := range ms.Ports {
		byName[p.Name] = p
	}
	type addrPort struct {
		addr string
		port uint32
	}
	var eps []*model.Endpoint
	seen := map[addrPort]int{}
	for _, sl := range sortedSlices(slices) {
		if sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, e := range sl.Endpoints {
			base, ok := endpointBase(svc, sl, e, look)
			if !ok {
				continue
			}
			for _, sp := range sl.Ports {
				mp, ok := byName[deref(sp.Name)]
				if !ok || sp.Port == nil {
					continue
				}
				for _, addr := range e.Addresses {
					ep := *base
					ep.Address, ep.Port, ep.ServicePort = addr, uint32(*sp.Port), mp.Port
					k := addrPort{addr, mp.Port}
					if i, dup := seen[k]; dup {
						if healthRank(ep.Health) < healthRank(eps[i].Health) {
							eps[i] = &ep
						}
						continue
					}
					seen[k] = len(eps)
					eps = append(eps, &ep)
				}
			}
		}
	}
	model.SortEndpoints(eps)
	return eps
}

// endpointBase is what every address and port of slice endpoint e share; false when e's
// pod is not known yet.
func endpointBase(svc *corev1.Service, sl *discoveryv1.EndpointSlice, e discoveryv1.Endpoint, look endpointFacts) (*model.Endpoint, bool) {
	ep := &model.Endpoint{Health: endpointHealth(svc, e), Namespace: svc.Namespace, Network: look.nsNetwork,
		Workload: "EndpointSlice " + sl.Namespace + "/" + sl.Name}
	if r := e.TargetRef; r != nil && r.Kind == "Pod" {
		ns := r.Namespace
		if ns == "" {
			ns = sl.Namespace
		}
		f := look.pod(ns, r.Name)
		if f == nil {
			return nil, false
		}
		ep.Labels, ep.ServiceAccount, ep.Locality, ep.Network = f.labels, f.serviceAccount, f.locality, f.network
		ep.Workload = "Pod " + ns + "/" + r.Name
		return ep, true
	}
	if e.NodeName != nil {
		ep.Locality = look.node(*e.NodeName)
	}
	return ep, true
}

// endpointHealth is Istio's reading of an endpoint's conditions: ready (or unknown) is
// healthy; not ready is unhealthy, except that a terminating endpoint still serving is
// draining for a service with the persistent-session label (its sessions finish there).
func endpointHealth(svc *corev1.Service, e discoveryv1.Endpoint) model.Health {
	c := e.Conditions
	if c.Ready == nil || *c.Ready {
		return model.Healthy
	}
	if svc.Labels[labelPersistentSession] != "" && (c.Serving == nil || *c.Serving) && (c.Terminating == nil || *c.Terminating) {
		return model.Draining
	}
	return model.Unhealthy
}

func healthRank(h model.Health) int {
	switch h {
	case model.Healthy:
		return 0
	case model.Draining:
		return 1
	}
	return 2
}

func sortedSlices(in []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
