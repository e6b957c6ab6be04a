package xds

import (
	"slices"
	"sort"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Scope is what one kind of proxy can reach, Istio's SidecarScope: the services and
// VirtualServices its Sidecar's egress listeners import (everything exported to its
// namespace without a Sidecar), the DestinationRule that applies to each service, and the
// outbound traffic policy. Proxies that share a Key share the Scope and everything generated
// from it.
type Scope struct {
	Key       string
	Namespace string
	Sidecar   *config.Config
	// Services the proxy can reach, sorted by host: the union of the egress listeners'.
	Services []*model.Service
	byHost   map[string]*model.Service
	// Egress listeners, port-specific ones first, the catch-all (no port) last.
	Egress []*egressListener
	// Ingress listeners of the Sidecar (empty: inbound ports come from the services that
	// select the proxy).
	Ingress               []*networking.IstioIngressListener
	InboundConnectionPool *networking.ConnectionPoolSettings
	// RegistryOnly blocks traffic to unknown destinations; EgressProxy (ALLOW_ANY only)
	// receives it instead of the passthrough cluster.
	RegistryOnly bool
	EgressProxy  *networking.Destination

	traffic *traffic
	labels  map[string]string
	drs     map[string]*destRule
}

// egressListener is one egress listener of a Sidecar with what it imports.
type egressListener struct {
	Port        *networking.SidecarPort // nil: every port of its services
	Bind        string
	CaptureNone bool
	hosts       []egressHost
	Services    []*model.Service // sorted by host
	byHost      map[string]*model.Service
	VS          []*virtualService
	vsByHost    map[string]*virtualService // service host → the VirtualService routing it
	// vsOnlyHosts are VirtualService hosts that name no service (external names routed on
	// port 80, Istio's rule).
	vsOnlyHosts map[*virtualService][]string
}

type egressHost struct {
	ns   string // "*" any; "~" none; else a namespace
	host string
}

func (e egressHost) matches(ns, host string) bool {
	if e.ns == "~" || (e.ns != "*" && e.ns != ns) {
		return false
	}
	return hostMatches(host, e.host)
}

func (e egressHost) overlaps(ns, host string) bool {
	if e.ns == "~" || (e.ns != "*" && e.ns != ns) {
		return false
	}
	return hostsOverlap(host, e.host)
}

// scopeKey names the scope of a proxy without building it.
func scopeKey(t *traffic, p *model.Proxy) string {
	var b strings.Builder
	b.WriteString(p.Namespace)
	if sc := t.sidecarFor(p.Namespace, p.Labels); sc != nil {
		b.WriteString("|" + sc.Namespace + "/" + sc.Name)
	}
	if t.labelsMatter {
		b.WriteString("|" + model.SortedLabels(p.Labels))
	}
	return b.String()
}

// scopeFor returns the shared scope of a proxy in the snapshot.
func scopeFor(snap *Snapshot, p *model.Proxy) *Scope {
	t := trafficOf(snap)
	key := scopeKey(t, p)
	return snap.full.scopes.Get(scopeMemoKey{key}, func() *Scope { return buildScope(snap, t, key, p) })
}

type scopeMemoKey struct{ key string }

func buildScope(snap *Snapshot, t *traffic, key string, p *model.Proxy) *Scope {
	s := &Scope{Key: key, Namespace: p.Namespace, traffic: t, byHost: map[string]*model.Service{}, drs: map[string]*destRule{}}
	if t.labelsMatter {
		s.labels = p.Labels
	}
	s.RegistryOnly = snap.Mesh.GetOutboundTrafficPolicy().GetMode() == meshconfig.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY
	var listeners []*networking.IstioEgressListener
	if sc := t.sidecarFor(p.Namespace, p.Labels); sc != nil {
		spec := sc.Spec.(*networking.Sidecar)
		s.Sidecar = sc
		listeners = spec.GetEgress()
		s.Ingress = spec.GetIngress()
		s.InboundConnectionPool = spec.GetInboundConnectionPool()
		if otp := spec.GetOutboundTrafficPolicy(); otp != nil {
			s.RegistryOnly = otp.GetMode() == networking.OutboundTrafficPolicy_REGISTRY_ONLY
			s.EgressProxy = otp.GetEgressProxy()
		}
	}
	if len(listeners) == 0 {
		listeners = []*networking.IstioEgressListener{{Hosts: []string{"*/*"}}}
	}
	// Port-specific listeners first: the catch-all takes only the ports they leave.
	sorted := append([]*networking.IstioEgressListener(nil), listeners...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].GetPort() != nil && sorted[j].GetPort() == nil })
	for _, l := range sorted {
		s.Egress = append(s.Egress, s.buildEgress(snap, t, l))
	}
	for _, e := range s.Egress {
		for _, svc := range e.Services {
			if s.byHost[svc.Hostname] == nil {
				s.byHost[svc.Hostname] = svc
				s.Services = append(s.Services, svc)
			}
		}
	}
	if ep := s.EgressProxy; ep != nil {
		// The egress proxy receives what the registry does not know: it needs its cluster.
		if svc := snap.Service(resolveHost(ep.GetHost(), s.Namespace)); svc != nil && s.byHost[svc.Hostname] == nil && serviceVisible(snap, svc, s.Namespace) {
			s.byHost[svc.Hostname] = svc
			s.Services = append(s.Services, svc)
		}
	}
	sortedServices(s.Services)
	for _, svc := range s.Services {
		if dr := t.destinationRule(svc.Hostname, svc.Namespace, s.Namespace, p.Labels); dr != nil {
			s.drs[svc.Hostname] = dr
		}
	}
	return s
}

func (s *Scope) buildEgress(snap *Snapshot, t *traffic, l *networking.IstioEgressListener) *egressListener {
	e := &egressListener{Port: l.GetPort(), Bind: l.GetBind(), CaptureNone: l.GetCaptureMode() == networking.CaptureMode_NONE,
		byHost: map[string]*model.Service{}, vsByHost: map[string]*virtualService{}, vsOnlyHosts: map[*virtualService][]string{}}
	for _, h := range l.GetHosts() {
		ns, host, _ := strings.Cut(h, "/")
		if ns == "." {
			ns = s.Namespace
		}
		e.hosts = append(e.hosts, egressHost{ns: ns, host: host})
	}
	imports := func(ns, host string, overlap bool) bool {
		for _, h := range e.hosts {
			if (overlap && h.overlaps(ns, host)) || (!overlap && h.matches(ns, host)) {
				return true
			}
		}
		return false
	}
	add := func(svc *model.Service) {
		if e.byHost[svc.Hostname] == nil {
			e.byHost[svc.Hostname] = svc
			e.Services = append(e.Services, svc)
		}
	}
	for _, svc := range e.candidates(snap) {
		if serviceVisible(snap, svc, s.Namespace) && imports(svc.Namespace, svc.Hostname, false) {
			add(svc)
		}
	}
	for _, vs := range t.vs {
		if !vs.exportTo.visibleTo(s.Namespace) {
			continue
		}
		selected := false
		for _, h := range vs.hosts {
			if imports(vs.cfg.Namespace, h, true) {
				selected = true
				break
			}
		}
		if !selected {
			continue
		}
		e.VS = append(e.VS, vs)
		// A VirtualService's destinations are reachable even when the egress hosts do not
		// name them (Istio infers them from the routes).
		for i, r := range vs.spec.GetHttp() {
			for _, d := range destinationsOf(r) {
				if svc := snap.Service(resolveHost(d.GetHost(), vs.routeNS[i])); svc != nil && serviceVisible(snap, svc, s.Namespace) {
					add(svc)
				}
			}
		}
	}
	sortedServices(e.Services)
	// Each service is routed by the first VirtualService naming it exactly, else by the most
	// specific wildcard.
	for _, svc := range e.Services {
		var best *virtualService
		bestLen := -1
		for _, vs := range e.VS {
			for _, h := range vs.hosts {
				switch {
				case h == svc.Hostname && bestLen < 1<<30:
					best, bestLen = vs, 1<<30
				case strings.HasPrefix(h, "*") && hostMatches(svc.Hostname, h) && len(h) > bestLen:
					best, bestLen = vs, len(h)
				}
			}
			if bestLen == 1<<30 {
				break
			}
		}
		if best != nil {
			e.vsByHost[svc.Hostname] = best
		}
	}
	for _, vs := range e.VS {
		for _, h := range vs.hosts {
			if strings.HasPrefix(h, "*") || snap.Service(h) != nil {
				continue
			}
			e.vsOnlyHosts[vs] = append(e.vsOnlyHosts[vs], h)
		}
	}
	return e
}

// candidates are the services the listener's hosts may import: the service an exact host
// names, the services of the namespace a wildcard host names, every service for "*/*".
func (e *egressListener) candidates(snap *Snapshot) []*model.Service {
	var out []*model.Service
	var nss []string
	for _, h := range e.hosts {
		switch {
		case h.ns == "~":
		case !strings.HasPrefix(h.host, "*"):
			if svc := snap.Service(h.host); svc != nil {
				out = append(out, svc)
			}
		case h.ns == "*":
			return snap.Services
		case !slices.Contains(nss, h.ns):
			nss = append(nss, h.ns)
			out = append(out, snap.ServicesIn(h.ns)...)
		}
	}
	return out
}

func destinationsOf(r *networking.HTTPRoute) []*networking.Destination {
	var out []*networking.Destination
	for _, d := range r.GetRoute() {
		out = append(out, d.GetDestination())
	}
	if r.GetMirror() != nil {
		out = append(out, r.GetMirror())
	}
	for _, m := range r.GetMirrors() {
		out = append(out, m.GetDestination())
	}
	return out
}

// serviceVisible applies a service's exportTo (the mesh default when unset).
func serviceVisible(snap *Snapshot, svc *model.Service, ns string) bool {
	return newExportSet(svc.ExportTo, svc.Namespace, snap.Mesh.GetDefaultServiceExportTo()).visibleTo(ns)
}

// Service returns the reachable service for host, or nil.
func (s *Scope) Service(host string) *model.Service { return s.byHost[host] }

// RoutesHost reports whether one of the scope's VirtualServices names host (exactly or by a
// wildcard): its routes for that host depend on whether a service has it.
func (s *Scope) RoutesHost(host string) bool {
	for _, e := range s.Egress {
		for _, vs := range e.VS {
			for _, h := range vs.hosts {
				if hostMatches(host, h) {
					return true
				}
			}
		}
	}
	return false
}

// Reaches reports whether a proxy of this scope reaches host in snap, or routes it: snap
// may differ from the snapshot the scope was built on in its services (and their
// endpoints), not in the Sidecars, VirtualServices or mesh config. The egress hosts, the
// VirtualServices and the egress proxy are the scope's; the service, its namespace and
// its exportTo are snap's. It answers what a scope built on snap would, without building
// one: a push of services only asks it of every proxy shape.
func (s *Scope) Reaches(snap *Snapshot, host string) bool {
	if s.RoutesHost(host) {
		return true
	}
	svc := snap.Service(host)
	if svc == nil || !serviceVisible(snap, svc, s.Namespace) {
		return false
	}
	if ep := s.EgressProxy; ep != nil && resolveHost(ep.GetHost(), s.Namespace) == host {
		return true
	}
	for _, e := range s.Egress {
		for _, h := range e.hosts {
			if h.matches(svc.Namespace, host) {
				return true
			}
		}
		for _, vs := range e.VS {
			for i, r := range vs.spec.GetHttp() {
				for _, d := range destinationsOf(r) {
					if resolveHost(d.GetHost(), vs.routeNS[i]) == host {
						return true
					}
				}
			}
		}
	}
	return false
}

// DestinationRule returns the rule that applies to host for this scope's proxies, or nil.
func (s *Scope) DestinationRule(host string) *destRule { return s.drs[host] }
