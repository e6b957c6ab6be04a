package server

import (
	"errors"
	"fmt"
	"sort"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
	"github.com/wasmesh/wasmesh/testenv/proxy/xdsclient"
)

// Apply implements xdsclient.Handler: every resource is validated and built on its own;
// the ones that fail are reported (and NACKed) while their previous version keeps serving.
func (s *Server) Apply(u xdsclient.Update) []xdsclient.ResourceError {
	var errs []xdsclient.ResourceError
	fail := func(name string, err error) { errs = append(errs, xdsclient.ResourceError{Name: name, Err: err}) }
	names := make([]string, 0, len(u.Resources))
	for n := range u.Resources {
		names = append(names, n)
	}
	sort.Strings(names)
	switch u.TypeURL {
	case xdsclient.CDS:
		for _, n := range names {
			c := &clusterv3.Cluster{}
			if err := unmarshal(u.Resources[n], c); err != nil {
				fail(n, err)
				continue
			}
			if err := s.clusters.AddOrUpdate(c, u.Version, false); err != nil {
				fail(n, err)
			}
		}
		removed := u.Removed
		if u.FullState {
			removed = missing(s.clusters.DynamicNames(), u.Resources)
		}
		for _, n := range removed {
			s.clusters.Remove(n)
		}
		s.cdsInit.Store(true)
	case xdsclient.EDS:
		for _, n := range names {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := unmarshal(u.Resources[n], cla); err != nil {
				fail(n, err)
				continue
			}
			if err := cla.ValidateAll(); err != nil {
				fail(n, err)
				continue
			}
			if err := s.clusters.UpdateEndpoints(cla); err != nil {
				fail(n, err)
				continue
			}
			s.remember(u.TypeURL, n, u.Version, cla)
		}
		for _, n := range u.Removed {
			s.clusters.RemoveEndpoints(n)
			s.forget(u.TypeURL, n)
		}
	case xdsclient.LDS:
		for _, n := range names {
			l := &listenerv3.Listener{}
			if err := unmarshal(u.Resources[n], l); err != nil {
				fail(n, err)
				continue
			}
			if err := s.listeners.AddOrUpdate(l, u.Version, false); err != nil {
				fail(n, err)
			}
		}
		removed := u.Removed
		if u.FullState {
			removed = missing(s.listeners.DynamicNames(), u.Resources)
		}
		for _, n := range removed {
			s.listeners.Remove(n)
		}
		s.ldsInit.Store(true)
	case xdsclient.RDS:
		for _, n := range names {
			rc := &routev3.RouteConfiguration{}
			if err := unmarshal(u.Resources[n], rc); err != nil {
				fail(n, err)
				continue
			}
			c, err := route.Compile(rc)
			if err != nil {
				fail(n, err)
				continue
			}
			s.Routes(n).Store(c)
			s.remember(u.TypeURL, n, u.Version, rc)
		}
		// A delta removal of a route configuration is ignored, as Envoy's RDS subscription
		// does: the connection managers keep serving the last configuration they got.
	case xdsclient.ECDS:
		for _, n := range names {
			tec := &corev3.TypedExtensionConfig{}
			if err := unmarshal(u.Resources[n], tec); err != nil {
				fail(n, err)
				continue
			}
			if tec.GetTypedConfig() == nil {
				fail(n, errors.New("typed_config is missing"))
				continue
			}
			fc, err := s.registry.Build(s.filterContext(), n, tec.GetTypedConfig())
			if err != nil {
				fail(n, err)
				continue
			}
			s.Filter(n).Store(fc)
			s.remember(u.TypeURL, n, u.Version, tec)
		}
		for _, n := range u.Removed {
			// Envoy's onConfigRemoved: back to the default config, or none (NFCF).
			s.Filter(n).Clear()
			s.forget(u.TypeURL, n)
		}
	default:
		for _, n := range names {
			fail(n, fmt.Errorf("type %s is not supported", u.TypeURL))
		}
	}
	if len(errs) == 0 {
		s.mu.Lock()
		s.versions[u.TypeURL] = u.Version
		s.mu.Unlock()
	}
	s.changed()
	return errs
}

func unmarshal(a *anypb.Any, m proto.Message) error {
	if err := a.UnmarshalTo(m); err != nil {
		return fmt.Errorf("decode %s: %w", a.GetTypeUrl(), err)
	}
	return nil
}

func missing(have []string, want map[string]*anypb.Any) []string {
	var out []string
	for _, n := range have {
		if _, ok := want[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

func (s *Server) remember(t, name, version string, p any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.dyn[t]
	if m == nil {
		m = map[string]resourceMeta{}
		s.dyn[t] = m
	}
	m[name] = resourceMeta{version: version, at: time.Now(), proto: p}
}

func (s *Server) forget(t, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.dyn[t], name)
}

// Names implements xdsclient.Handler: the EDS service names of the clusters, the RDS
// names and ECDS names of the listeners (active and warming).
func (s *Server) Names(t string) []string {
	set := map[string]bool{}
	switch t {
	case xdsclient.EDS:
		for _, n := range s.clusters.EDSServiceNames() {
			set[n] = true
		}
	case xdsclient.RDS, xdsclient.ECDS:
		if s.listeners == nil {
			return nil
		}
		for _, l := range append(s.listeners.Active(), s.listeners.Warming()...) {
			for _, m := range l.HTTPManagers() {
				if t == xdsclient.RDS {
					if n := m.RouteName(); n != "" {
						set[n] = true
					}
				} else {
					for _, n := range m.ECDSNames() {
						set[n] = true
					}
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// filterContext is the context ECDS filter configs are built with: shared by every
// listener that names the filter.
func (s *Server) filterContext() *hcm.Context {
	return &hcm.Context{Store: s.store, Clusters: s.clusters, Log: s.loggers.For("http"), Registry: s.registry,
		Providers: s, AccessLog: s.opts.Stdout, Buffers: s.buffers}
}
