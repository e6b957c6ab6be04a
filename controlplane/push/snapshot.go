package push

import (
	"maps"
	"slices"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// Snapshot is everything one push generates from, built once per debounced change and
// shared read-only by every connection. An endpoints-only change derives a new snapshot
// that shares the services and configs with its parent (what is generated from them is
// cached beside it: xds.Snapshot).
type Snapshot struct {
	// Version identifies the snapshot; sent as the SotW version_info.
	Version string
	// FullVersion is the version of the last full build this snapshot descends from.
	FullVersion string
	Mesh        *meshconfig.MeshConfig
	// Options are the generators' switches, set by whoever builds the snapshot (the pusher,
	// from discovery's flags) and kept by every snapshot derived from it.
	Options Options
	Configs *config.Index
	// Services are sorted by host.
	Services []*model.Service

	byHost    map[string]*model.Service
	byNS      map[string][]*model.Service // services by namespace, sorted by host
	selecting map[string][]*model.Service // services with a workload selector, by namespace
	endpoints *epLayer
}

// Options switch generated behaviour that is not mesh config.
type Options struct {
	// MTLS generates mutual TLS from PeerAuthentication, DestinationRule TLS and auto mTLS
	// (issue 27). Off, the generated config has no workload TLS beyond what a
	// DestinationRule's tls sets explicitly.
	MTLS bool `json:"mtls"`
}

// Build reads the registry and configs into a new snapshot.
func Build(version string, mesh *meshconfig.MeshConfig, configs *config.Index, reg registry.Registry) *Snapshot {
	services := reg.Services()
	s := &Snapshot{
		Version: version, FullVersion: version, Mesh: mesh, Configs: configs, Services: services,
		byHost: make(map[string]*model.Service, len(services)), byNS: map[string][]*model.Service{},
		selecting: map[string][]*model.Service{},
		endpoints: &epLayer{m: make(map[string][]*model.Endpoint, len(services))},
	}
	for _, svc := range services {
		s.byHost[svc.Hostname] = svc
		s.byNS[svc.Namespace] = append(s.byNS[svc.Namespace], svc)
		if svc.WorkloadSelector != nil {
			s.selecting[svc.Namespace] = append(s.selecting[svc.Namespace], svc)
		}
		if eps := reg.Endpoints(svc.Hostname); len(eps) > 0 {
			s.endpoints.m[svc.Hostname] = eps
		}
	}
	return s
}

// Derivable reports whether a change of the services of hosts is small enough to derive
// its snapshot (WithServices) rather than build it anew: a change of many hosts builds anew.
func (s *Snapshot) Derivable(hosts map[string]struct{}) bool { return len(hosts) <= len(s.Services)/16 }

// WithServices derives the snapshot of a change that touched nothing but the services of
// hosts and their endpoints (and the ServiceEntry and WorkloadEntry configs behind them,
// hence configs): the services of other hosts, the indexes of unchanged namespaces and the
// endpoints of unchanged hosts are shared, so such a change costs what changed, not the
// size of the mesh (see Derivable). What was generated for one host that did not change is
// inherited beside it (xds.Snapshot); everything else is generated again for the proxies the
// push concerns.
func (s *Snapshot) WithServices(version string, configs *config.Index, reg registry.Registry, hosts map[string]struct{}) *Snapshot {
	current := reg.Services()
	n := &Snapshot{
		Version: version, FullVersion: version, Mesh: s.Mesh, Options: s.Options, Configs: configs, Services: slices.Clone(s.Services),
		byHost: maps.Clone(s.byHost), byNS: maps.Clone(s.byNS), selecting: maps.Clone(s.selecting),
		endpoints: s.endpoints.with(reg, hosts),
	}
	namespaces := map[string]bool{} // whose services changed
	for h := range hosts {
		if old := s.byHost[h]; old != nil {
			namespaces[old.Namespace] = true
		}
		svc := model.FindService(current, h)
		n.Services = model.PatchServices(n.Services, h, svc)
		if svc == nil {
			delete(n.byHost, h)
			continue
		}
		n.byHost[h] = svc
		namespaces[svc.Namespace] = true
	}
	for ns := range namespaces {
		// The namespace's services as they are now: the unchanged ones and the changed ones.
		var list, selecting []*model.Service
		for _, svc := range s.byNS[ns] {
			if _, changed := hosts[svc.Hostname]; !changed {
				list = append(list, svc)
			}
		}
		for h := range hosts {
			if svc := n.byHost[h]; svc != nil && svc.Namespace == ns {
				list = append(list, svc)
			}
		}
		slices.SortFunc(list, model.CompareHosts)
		for _, svc := range list {
			if svc.WorkloadSelector != nil {
				selecting = append(selecting, svc)
			}
		}
		setOrDelete(n.byNS, ns, list)
		setOrDelete(n.selecting, ns, selecting)
	}
	return n
}

func setOrDelete(m map[string][]*model.Service, k string, v []*model.Service) {
	if len(v) == 0 {
		delete(m, k)
	} else {
		m[k] = v
	}
}

// WithEndpoints derives a snapshot in which the endpoints of hosts are read again from reg;
// everything else is shared.
func (s *Snapshot) WithEndpoints(version string, reg registry.Registry, hosts map[string]struct{}) *Snapshot {
	n := *s
	n.Version = version
	known := make(map[string]struct{}, len(hosts))
	for h := range hosts {
		if _, ok := s.byHost[h]; ok {
			known[h] = struct{}{}
		}
	}
	n.endpoints = s.endpoints.with(reg, known)
	return &n
}

// maxLayers bounds the chains of layered changes (epLayer, hostLayer): a lookup walks at
// most this many layers, and every maxLayers-th change flattens. A flatten copies every
// entry of the chain (thousands of generated clusters and assignments in a mesh of 1000
// services) while a layer costs a lookup one map read: flattening rarely is cheaper.
const maxLayers = 16

// epLayer holds endpoints by host. A layer with a parent holds only the hosts whose
// endpoints changed since it (a nil slice: none left), so a change costs what changed, not
// the size of the mesh. Layers do not hold snapshots: an old snapshot's generated
// resources are not kept alive by its successors.
type epLayer struct {
	m      map[string][]*model.Endpoint
	parent *epLayer
	depth  int
}

// with returns a layer over l with the endpoints of hosts read again from reg, flattened
// every maxLayers-th time.
func (l *epLayer) with(reg registry.Registry, hosts map[string]struct{}) *epLayer {
	n := &epLayer{m: make(map[string][]*model.Endpoint, len(hosts)), parent: l, depth: l.depth + 1}
	for h := range hosts {
		n.m[h] = reg.Endpoints(h)
	}
	if n.depth <= maxLayers {
		return n
	}
	var chain []*epLayer
	for cur := n; cur != nil; cur = cur.parent {
		chain = append(chain, cur)
	}
	flat := &epLayer{m: make(map[string][]*model.Endpoint, len(chain[len(chain)-1].m))}
	for i := len(chain) - 1; i >= 0; i-- { // oldest first, so newer changes win
		for h, eps := range chain[i].m {
			if len(eps) > 0 {
				flat.m[h] = eps
			} else {
				delete(flat.m, h)
			}
		}
	}
	return flat
}

// get returns the endpoints of host.
func (l *epLayer) get(host string) []*model.Endpoint {
	for cur := l; ; cur = cur.parent {
		if eps, ok := cur.m[host]; ok || cur.parent == nil {
			return eps
		}
	}
}

// Service returns the service for host.
func (s *Snapshot) Service(host string) *model.Service { return s.byHost[host] }

// ServicesIn returns the services of namespace ns, sorted by host.
func (s *Snapshot) ServicesIn(ns string) []*model.Service { return s.byNS[ns] }

// Endpoints returns the endpoints of host (all ports).
func (s *Snapshot) Endpoints(host string) []*model.Endpoint { return s.endpoints.get(host) }

// ServicesSelecting returns the services in namespace ns whose workload selector matches
// labels: the services a proxy with those labels serves.
func (s *Snapshot) ServicesSelecting(ns string, labels map[string]string) []*model.Service {
	var out []*model.Service
	for _, svc := range s.selecting[ns] {
		if config.SelectorMatches(svc.WorkloadSelector, labels) {
			out = append(out, svc)
		}
	}
	return out
}
