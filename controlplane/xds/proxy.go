package xds

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Inbound is one port a proxy serves for the services that select it, or for an ingress
// listener of its Sidecar.
type Inbound struct {
	Port        uint32 // the workload port (service targetPort or named pod port)
	Protocol    model.Protocol
	ServicePort uint32
	Hosts       []string // services served on this port
	// From a Sidecar ingress listener: the address to bind (empty: the proxy's), where the
	// application listens (empty: the proxy's localhost on Port), and connection limits.
	Bind         string
	CaptureNone  bool
	EndpointAddr string
	EndpointPort uint32
	Pool         *networking.ConnectionPoolSettings
}

// View is a proxy as seen through one snapshot: what the generators need to know about it.
type View struct {
	Proxy    *model.Proxy
	Snapshot *Snapshot
	Inbounds []Inbound // sorted by port
	// Scope is what the proxy can reach (its Sidecar, exportTo), shared by every proxy with
	// the same scope key.
	Scope *Scope
	// EDSKey holds the proxy properties its endpoints depend on beyond the cluster name: the
	// scope (which DestinationRule defines a subset) and, when a rule balances by locality,
	// the proxy's locality.
	EDSKey string
	// Key holds exactly the proxy properties the generated LDS/CDS/RDS depend on; proxies with
	// equal keys receive identical resources, so results are cached under it.
	Key string
	// ext is what the proxy's WasmPlugins, EnvoyFilters and Telemetry add (extensionsOf).
	ext *proxyExtensions
	// perAddress: an inbound forwards to the pod's own address (a Sidecar ingress
	// defaultEndpoint 0.0.0.0), which the shape leaves out.
	perAddress bool
}

// Shape renders every proxy property NewView reads but the pod's address where only a
// Sidecar ingress forwarding to 0.0.0.0 reads it (such views are kept per address, see
// sharedView); proxies with the same shape get the same view, so connections compute it once
// per snapshot (see CachedView).
func Shape(p *model.Proxy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s|%s|%s|%s", p.Type, p.InterceptionMode, p.Namespace, model.SortedLabels(p.Labels), p.Localhost,
		p.Generator, localityString(p))
	if p.InterceptionMode == model.InterceptionNone {
		b.WriteString("|" + p.IP())
	}
	for _, pp := range p.PodPorts {
		fmt.Fprintf(&b, "|%s=%d", pp.Name, pp.ContainerPort)
	}
	return b.String()
}

type viewKey struct{ shape string }

// CachedView is NewView with the computed part shared by every proxy of the same shape
// (Shape(p) == shape) within a snapshot and the endpoints-only snapshots built on it. The
// shared part may have been computed through an earlier of those snapshots: the view
// returned always reads snap (its endpoints), never that one.
func CachedView(snap *Snapshot, p *model.Proxy, shape string) *View {
	shared := sharedView(snap, p, shape)
	if shared.Proxy == p && shared.Snapshot == snap {
		return shared
	}
	v := *shared
	v.Proxy, v.Snapshot = p, snap
	return &v
}

// CachedScope is the proxy's Scope, as CachedView's, without a view of its own.
func CachedScope(snap *Snapshot, p *model.Proxy, shape string) *Scope {
	return sharedView(snap, p, shape).Scope
}

func sharedView(snap *Snapshot, p *model.Proxy, shape string) *View {
	// EnvoyFilter proxy matches may read the proxy's version and metadata: those in use
	// extend the shape (usually nothing).
	key := viewKey{shape + proxyMatchKey(snap, p)}
	v := snap.full.views.Get(key, func() *View { return NewView(snap, p) })
	if v.perAddress {
		// Views of this shape depend on the pod's address too.
		key.shape += "|" + p.IP()
		v = snap.full.views.Get(key, func() *View { return NewView(snap, p) })
	}
	return v
}

// NewView computes the proxy's inbound ports and cache key for a snapshot.
func NewView(snap *Snapshot, p *model.Proxy) *View {
	v := &View{Proxy: p, Snapshot: snap, Scope: scopeFor(snap, p)}
	v.EDSKey = v.Scope.Key
	if trafficOf(snap).localityMatters {
		v.EDSKey += "|" + localityString(p)
	}
	named := map[string]uint32{}
	for _, pp := range p.PodPorts {
		if pp.Name != "" {
			named[pp.Name] = pp.ContainerPort
		}
	}
	byPort := map[uint32]*Inbound{}
	for _, svc := range snap.ServicesSelecting(p.Namespace, p.Labels) {
		for _, sp := range svc.Ports {
			port := sp.Port
			if sp.TargetPort != 0 {
				port = sp.TargetPort
			}
			if sp.TargetPortName != "" {
				// A Kubernetes Service's named targetPort: the pod's container port of that name.
				if n := named[sp.TargetPortName]; n != 0 {
					port = n
				}
			} else if n := named[sp.Name]; n != 0 {
				port = n
			}
			in := byPort[port]
			if in == nil {
				in = &Inbound{Port: port, Protocol: sp.Protocol, ServicePort: sp.Port}
				byPort[port] = in
			} else if in.Protocol != sp.Protocol && !(in.Protocol.IsHTTP() && sp.Protocol.IsHTTP()) {
				// Two services disagree on a workload port's protocol: TCP is the safe common
				// denominator, as in Istio's conflict handling.
				in.Protocol = model.TCP
			}
			in.Hosts = append(in.Hosts, svc.Hostname)
		}
	}
	if len(v.Scope.Ingress) > 0 {
		// A Sidecar's ingress listeners replace the ports the services imply.
		services := byPort
		byPort = map[uint32]*Inbound{}
		for _, il := range v.Scope.Ingress {
			port := il.GetPort().GetNumber()
			in := &Inbound{Port: port, ServicePort: port, Protocol: model.ParseProtocol(il.GetPort().GetProtocol(), il.GetPort().GetName()),
				Bind: il.GetBind(), CaptureNone: il.GetCaptureMode() == networking.CaptureMode_NONE, Pool: il.GetConnectionPool()}
			if svc := services[port]; svc != nil {
				in.ServicePort, in.Hosts = svc.ServicePort, svc.Hosts
			}
			if ep := il.GetDefaultEndpoint(); ep != "" {
				ap := netip.MustParseAddrPort(ep) // validated
				in.EndpointAddr, in.EndpointPort = ap.Addr().String(), uint32(ap.Port())
				if ap.Addr().IsUnspecified() {
					in.EndpointAddr, v.perAddress = p.IP(), true
				}
			}
			byPort[port] = in
		}
	}
	for _, in := range byPort {
		if in.Pool == nil {
			in.Pool = v.Scope.InboundConnectionPool
		}
		v.Inbounds = append(v.Inbounds, *in)
	}
	sort.Slice(v.Inbounds, func(i, j int) bool { return v.Inbounds[i].Port < v.Inbounds[j].Port })

	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s|%s|%s", p.Type, p.InterceptionMode, p.Namespace, model.SortedLabels(p.Labels), p.Generator, v.Scope.Key)
	if trafficOf(snap).localityMatters {
		// DNS clusters carry endpoints ordered for the client's locality.
		b.WriteString("|" + localityString(p))
	}
	if p.InterceptionMode == model.InterceptionNone {
		// Listeners bind the proxy's own addresses only without interception.
		fmt.Fprintf(&b, "|%s|%s", p.Localhost, p.IP())
	}
	for _, in := range v.Inbounds {
		fmt.Fprintf(&b, "|%d/%s/%s/%t/%s:%d", in.Port, in.Protocol, in.Bind, in.CaptureNone, in.EndpointAddr, in.EndpointPort)
	}
	b.WriteString(proxyMatchKey(snap, p))
	v.Key = b.String()
	v.ext = extensionsOf(v)
	return v
}

// RouteKey names what the proxy's route configurations depend on (its scope, and the kind
// of client).
func (v *View) RouteKey() string {
	return v.Scope.Key + "|" + v.Proxy.Generator + routePatchKey(v)
}

// FilterKey names what the HTTP filters of the proxy's listeners depend on, for caches of
// listeners shared beyond one view. Translators whose filters select proxies (by labels)
// must extend it.
func (v *View) FilterKey() string { return v.Scope.Key + "|" + extensionsOf(v).wasmKey }

// IsGRPC reports whether the client is a proxyless gRPC application (node metadata
// GENERATOR "grpc"), which gets the resource shapes gRPC's xDS client accepts.
func (v *View) IsGRPC() bool { return v.Proxy.Generator == "grpc" }

func localityString(p *model.Proxy) string {
	l := p.Locality
	if l == nil {
		return ""
	}
	return l.GetRegion() + "/" + l.GetZone() + "/" + l.GetSubZone()
}

type cacheKey struct {
	typeURL string
	key     string
}

// cached memoizes a per-view result in the snapshot's full cache.
func (v *View) cached(typeURL string, build func() *Resources) *Resources {
	return v.Snapshot.full.typeSets.Get(cacheKey{typeURL, v.Key}, build)
}
