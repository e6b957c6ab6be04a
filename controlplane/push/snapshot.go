package push

import (
	"sync"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// Snapshot is everything one push generates from, built once per debounced change and
// shared read-only by every connection. An endpoints-only change derives a new snapshot
// that shares the services, configs and their generated resources with its parent.
type Snapshot struct {
	// Version identifies the snapshot; sent as the SotW version_info.
	Version string
	// FullVersion is the version of the last full build this snapshot descends from.
	FullVersion string
	Mesh        *meshconfig.MeshConfig
	Configs     *config.Index
	// Services are sorted by host.
	Services []*model.Service

	byHost    map[string]*model.Service
	selecting map[string][]*model.Service // services with a workload selector, by namespace
	endpoints map[string][]*model.Endpoint

	// Full caches results that depend on services, configs and mesh config (CDS, LDS, RDS,
	// per-proxy shapes); EDS caches results that depend on endpoints as well.
	Full *Memo
	EDS  *Memo
}

// Build reads the registry and configs into a new snapshot.
func Build(version string, mesh *meshconfig.MeshConfig, configs *config.Index, reg registry.Registry) *Snapshot {
	services := reg.Services()
	s := &Snapshot{
		Version: version, FullVersion: version, Mesh: mesh, Configs: configs, Services: services,
		byHost: make(map[string]*model.Service, len(services)), selecting: map[string][]*model.Service{},
		endpoints: make(map[string][]*model.Endpoint, len(services)), Full: &Memo{}, EDS: &Memo{},
	}
	for _, svc := range services {
		s.byHost[svc.Hostname] = svc
		if svc.WorkloadSelector != nil {
			s.selecting[svc.Namespace] = append(s.selecting[svc.Namespace], svc)
		}
		if eps := reg.Endpoints(svc.Hostname); len(eps) > 0 {
			s.endpoints[svc.Hostname] = eps
		}
	}
	return s
}

// WithEndpoints derives a snapshot in which the endpoints of hosts are read again from reg;
// everything else, including generated CDS/LDS/RDS and the EDS of other hosts, is shared.
// clustersOf names the memo keys that depend on a host's endpoints.
func (s *Snapshot) WithEndpoints(version string, reg registry.Registry, hosts map[string]struct{}) *Snapshot {
	n := *s
	n.Version = version
	n.endpoints = make(map[string][]*model.Endpoint, len(s.endpoints))
	for h, eps := range s.endpoints {
		n.endpoints[h] = eps
	}
	for h := range hosts {
		if _, known := s.byHost[h]; !known {
			continue
		}
		if eps := reg.Endpoints(h); len(eps) > 0 {
			n.endpoints[h] = eps
		} else {
			delete(n.endpoints, h)
		}
	}
	n.EDS = s.EDS.copyExcept(func(key any) bool {
		k, ok := key.(HostKey)
		if !ok {
			return true // keys that do not name a host depend on all endpoints
		}
		_, changed := hosts[k.Host]
		return changed
	})
	return &n
}

// Service returns the service for host.
func (s *Snapshot) Service(host string) *model.Service { return s.byHost[host] }

// Endpoints returns the endpoints of host (all ports).
func (s *Snapshot) Endpoints(host string) []*model.Endpoint { return s.endpoints[host] }

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

// HostKey is a memo key for a result that depends on one host's endpoints (an EDS
// resource): WithEndpoints drops exactly the keys of changed hosts.
type HostKey struct {
	Host string
	Name string
}

// Memo caches values built from a snapshot, each built once even when many connections ask
// at the same time.
type Memo struct {
	m sync.Map // key → *memoEntry
}

type memoEntry struct {
	once sync.Once
	val  any
}

// Get returns the value for key, building it with build on first use.
func (m *Memo) Get(key any, build func() any) any {
	e, _ := m.m.LoadOrStore(key, &memoEntry{})
	me := e.(*memoEntry)
	me.once.Do(func() { me.val = build() })
	return me.val
}

// Len counts cached entries (for tests and debug output).
func (m *Memo) Len() int {
	n := 0
	m.m.Range(func(any, any) bool { n++; return true })
	return n
}

func (m *Memo) copyExcept(drop func(key any) bool) *Memo {
	n := &Memo{}
	m.m.Range(func(k, v any) bool {
		if !drop(k) {
			n.m.Store(k, v)
		}
		return true
	})
	return n
}
