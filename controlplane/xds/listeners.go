package xds

import (
	"fmt"
	"sort"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	cors "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	originaldst "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/wasmplugin"
)

// Istio's virtual listener names and ports (REDIRECT mode).
const (
	VirtualOutboundListener = "virtualOutbound"
	VirtualInboundListener  = "virtualInbound"
	VirtualOutboundPort     = 15001
	VirtualInboundPort      = 15006
	// AdminPort is the proxy's admin API, on the pod's localhost (docs/contracts.md).
	AdminPort = 15000
)

// Direction is which way a listener's traffic flows; filters and telemetry key on it.
type Direction int

// Directions.
const (
	DirOutbound Direction = iota
	DirInbound
)

// Listeners generates LDS for the proxy, shaped by its interception mode (see
// docs/contracts.md): virtual listeners plus bind_to_port=false outbound listeners under
// REDIRECT, listeners bound on the pod's own addresses under NONE. Only the ports of the
// services in the proxy's scope get outbound listeners.
func Listeners(v *View) *Resources {
	return v.cached(ListenerType, func() *Resources {
		var items []*Resource
		if v.Proxy.InterceptionMode == model.InterceptionNone {
			// The pod's localhost also carries the application's own ports and the proxy's
			// admin port; an outbound listener there would fail to bind (and the proxy would
			// reject the whole LDS update), so those ports get none.
			taken := map[uint32]bool{AdminPort: true}
			for _, in := range v.Inbounds {
				taken[in.Port] = true
			}
			for _, op := range outboundPorts(v) {
				bind := v.Proxy.Localhost
				if op.egress.Bind != "" {
					bind = op.egress.Bind
				} else if taken[op.Port] {
					continue
				}
				items = append(items, NewResource(outboundListener(v, op, bind, true)))
			}
			for _, in := range v.Inbounds {
				items = append(items, NewResource(inboundListener(v, in)))
			}
		} else {
			items = append(items, redirectOutboundListeners(v)...)
			items = append(items, NewResource(virtualOutbound(v)), NewResource(virtualInbound(v)))
			for _, in := range v.Inbounds {
				// A Sidecar ingress listener with a bind address is a listener of its own
				// (bound when its capture mode is NONE), not a chain of virtualInbound.
				if in.Bind != "" {
					name, l := inboundListener(v, in)
					if !in.CaptureNone {
						l.(*listener.Listener).BindToPort = wrapperspb.Bool(false)
					}
					items = append(items, NewResource(name, l))
				}
			}
		}
		return NewResources(patchListeners(v, items))
	})
}

// outboundPort is one listener port with what listens on it: HTTP services share an RDS
// route configuration; TCP services get a tcp_proxy each, chosen by destination address
// when they have one.
type outboundPort struct {
	Port     uint32
	HTTP     bool
	TCP      []*model.Service // services with a TCP protocol on the port, sorted by host
	HTTPHost []string
	egress   *egressListener // the Sidecar egress listener the port belongs to
}

type portsKey struct{ scope string }

// outboundPorts groups the ports of the scope's services by number: a Sidecar egress listener
// with a port takes that port (with its protocol, when it declares one) for the services it
// imports; the catch-all listener takes every other port of its services. Cached per scope.
func outboundPorts(v *View) []*outboundPort {
	s := v.Scope
	return v.Snapshot.full.ports.Get(portsKey{s.Key}, func() []*outboundPort {
		byPort := map[uint32]*outboundPort{}
		claimed := map[uint32]bool{}
		for _, e := range s.Egress {
			if e.Port != nil {
				claimed[e.Port.GetNumber()] = true
			}
		}
		for _, e := range s.Egress {
			for _, svc := range e.Services {
				for _, p := range svc.Ports {
					if e.Port != nil && p.Port != e.Port.GetNumber() || e.Port == nil && claimed[p.Port] {
						continue
					}
					op := byPort[p.Port]
					if op == nil {
						op = &outboundPort{Port: p.Port, egress: e}
						byPort[p.Port] = op
					}
					proto := p.Protocol
					if e.Port != nil && e.Port.GetProtocol() != "" {
						proto = model.ParseProtocol(e.Port.GetProtocol(), "")
					}
					if proto.IsHTTP() {
						op.HTTP = true
						op.HTTPHost = append(op.HTTPHost, svc.Hostname)
					} else {
						op.TCP = append(op.TCP, svc)
					}
				}
			}
		}
		// A port-specific egress listener exists even when no imported service has its port
		// (traffic on it goes to the catch-all destination).
		for _, e := range s.Egress {
			if e.Port != nil && byPort[e.Port.GetNumber()] == nil {
				proto := model.ParseProtocol(e.Port.GetProtocol(), e.Port.GetName())
				byPort[e.Port.GetNumber()] = &outboundPort{Port: e.Port.GetNumber(), egress: e, HTTP: proto.IsHTTP()}
			}
		}
		out := make([]*outboundPort, 0, len(byPort))
		for _, op := range byPort {
			out = append(out, op)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
		return out
	})
}

func findOutboundPort(v *View, port uint32) *outboundPort {
	ops := outboundPorts(v)
	i := sort.Search(len(ops), func(i int) bool { return ops[i].Port >= port })
	if i < len(ops) && ops[i].Port == port {
		return ops[i]
	}
	return nil
}

type redirectKey struct{ filters string }

// redirectOutboundListeners depend on the proxy only through its scope and HTTP filters:
// built once per such kind of proxy.
func redirectOutboundListeners(v *View) []*Resource {
	return v.Snapshot.full.redirect.Get(redirectKey{v.FilterKey()}, func() []*Resource {
		var out []*Resource
		for _, op := range outboundPorts(v) {
			bind, bindToPort := "0.0.0.0", false
			if op.egress.Bind != "" {
				bind, bindToPort = op.egress.Bind, op.egress.CaptureNone
			}
			out = append(out, NewResource(outboundListener(v, op, bind, bindToPort)))
		}
		return out
	})
}

func outboundListener(v *View, op *outboundPort, bind string, bindToPort bool) (string, proto.Message) {
	name := fmt.Sprintf("%s_%d", bind, op.Port)
	l := &listener.Listener{
		Name:             name,
		Address:          socketAddress(bind, op.Port),
		TrafficDirection: core.TrafficDirection_OUTBOUND,
	}
	if !bindToPort {
		l.BindToPort = wrapperspb.Bool(false)
	}
	statPrefix := fmt.Sprintf("outbound_0.0.0.0_%d", op.Port)
	if op.HTTP {
		// HTTP wins a port that also has TCP services, Istio's conflict rule; the TCP
		// services stay reachable through their own addresses only under REDIRECT.
		l.FilterChains = []*listener.FilterChain{{
			Filters: []*listener.Filter{httpConnectionManager(v, statPrefix, DirOutbound, op.Port, &hcm.HttpConnectionManager_Rds{
				Rds: &hcm.Rds{ConfigSource: adsConfigSource(), RouteConfigName: strconv.Itoa(int(op.Port))},
			})},
		}}
		return name, l
	}
	var fallback *model.Service
	for _, svc := range op.TCP {
		cluster := OutboundClusterName(op.Port, "", svc.Hostname)
		var ranges []*core.CidrRange
		for _, a := range svc.Addresses {
			ranges = append(ranges, cidr(a))
		}
		// A bound listener sees the pod's localhost as destination, never a VIP, so only the
		// first service (by host) can own the port there, as can a service without addresses.
		if bindToPort || len(ranges) == 0 {
			if fallback == nil {
				fallback = svc
			}
			continue
		}
		l.FilterChains = append(l.FilterChains, &listener.FilterChain{
			FilterChainMatch: &listener.FilterChainMatch{PrefixRanges: ranges},
			Filters:          []*listener.Filter{outboundTCPProxy(v, statPrefix, cluster, svc.Hostname, op.Port)},
		})
	}
	if fallback != nil {
		l.FilterChains = append(l.FilterChains, &listener.FilterChain{
			Filters: []*listener.Filter{outboundTCPProxy(v, statPrefix, OutboundClusterName(op.Port, "", fallback.Hostname), fallback.Hostname, op.Port)},
		})
	} else {
		l.DefaultFilterChain = &listener.FilterChain{Name: PassthroughCluster, Filters: []*listener.Filter{tcpProxy(PassthroughCluster, passthroughOrBlackhole(v, op.Port))}}
	}
	return name, l
}

// passthroughOrBlackhole is where TCP traffic to an unknown destination goes: nowhere under
// REGISTRY_ONLY, else the Sidecar's egress proxy or the original destination.
func passthroughOrBlackhole(v *View, port uint32) string {
	if v.Scope.RegistryOnly {
		return BlackHoleCluster
	}
	return unknownDestinationCluster(v.Scope, port)
}

func cidr(a string) *core.CidrRange {
	ip, bits := a, uint32(32)
	for i := 0; i < len(a); i++ {
		if a[i] == '/' {
			ip = a[:i]
			n, _ := strconv.Atoi(a[i+1:])
			bits = uint32(n)
			break
		}
		if a[i] == ':' {
			bits = 128
		}
	}
	return &core.CidrRange{AddressPrefix: ip, PrefixLen: wrapperspb.UInt32(bits)}
}

func virtualOutbound(v *View) (string, proto.Message) {
	target := passthroughOrBlackhole(v, 0)
	return VirtualOutboundListener, &listener.Listener{
		Name:             VirtualOutboundListener,
		Address:          socketAddress("0.0.0.0", VirtualOutboundPort),
		UseOriginalDst:   wrapperspb.Bool(true),
		TrafficDirection: core.TrafficDirection_OUTBOUND,
		FilterChains: []*listener.FilterChain{{
			Name:    target,
			Filters: []*listener.Filter{tcpProxy(target, target)},
		}},
	}
}

func virtualInbound(v *View) (string, proto.Message) {
	l := &listener.Listener{
		Name:             VirtualInboundListener,
		Address:          socketAddress("0.0.0.0", VirtualInboundPort),
		TrafficDirection: core.TrafficDirection_INBOUND,
		ListenerFilters: []*listener.ListenerFilter{{
			Name:       wellknown.OriginalDestination,
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&originaldst.OriginalDst{})},
		}},
	}
	for _, in := range v.Inbounds {
		if in.Bind != "" {
			continue // its own listener
		}
		l.FilterChains = append(l.FilterChains, inboundFilterChains(v, in, wrapperspb.UInt32(in.Port))...)
	}
	l.FilterChains = append(l.FilterChains, inboundPassthroughChains(v)...)
	if mtlsOn(v) {
		l.ListenerFilters = append(l.ListenerFilters, tlsInspector())
	}
	return VirtualInboundListener, l
}

func inboundListener(v *View, in Inbound) (string, proto.Message) {
	bind := v.Proxy.IP()
	if in.Bind != "" {
		bind = in.Bind
	}
	name := fmt.Sprintf("%s_%d", bind, in.Port)
	l := &listener.Listener{
		Name:             name,
		Address:          socketAddress(bind, in.Port),
		TrafficDirection: core.TrafficDirection_INBOUND,
		FilterChains:     inboundFilterChains(v, in, nil),
	}
	if mtlsOn(v) {
		l.ListenerFilters = []*listener.ListenerFilter{tlsInspector()}
	}
	return name, l
}

func inboundFilters(v *View, in Inbound) []*listener.Filter {
	cluster := InboundClusterName(in.Port)
	statPrefix := fmt.Sprintf("inbound_0.0.0.0_%d", in.Port)
	if !in.Protocol.IsHTTP() {
		return append(authzNetworkFilters(v), tcpProxy(cluster, cluster))
	}
	rc := &route.RouteConfiguration{
		Name:             cluster,
		ValidateClusters: wrapperspb.Bool(false),
		VirtualHosts: []*route.VirtualHost{{
			Name:    fmt.Sprintf("inbound|http|%d", in.Port),
			Domains: []string{"*"},
			Routes:  []*route.Route{inboundRoute(cluster, firstHost(in.Hosts), in.ServicePort)},
		}},
	}
	return []*listener.Filter{httpConnectionManager(v, statPrefix, DirInbound, in.Port, &hcm.HttpConnectionManager_RouteConfig{RouteConfig: rc})}
}

func firstHost(hosts []string) string {
	if len(hosts) == 0 {
		return ""
	}
	return hosts[0]
}

// httpFilters is the HTTP filter chain of a listener. The proxy's WasmPlugins that select the listener (port: the service port outbound, the
// workload port inbound) come first, by phase and priority, each configured through ECDS;
// inbound, the RBAC filters of AuthorizationPolicies go before the STATS phase's (authz.go);
// then fault and CORS, which routes configure per route (typed_per_filter_config) and which
// do nothing on routes that do not; then the router: Istio's order. EnvoyFilter patches apply
// to the finished listener.
func httpFilters(v *View, dir Direction, port uint32) []*hcm.HttpFilter {
	e := extensionsOf(v)
	inbound := dir == DirInbound
	return append(authzHTTPFilters(v, inbound, port, wasmplugin.Filters(e.plugins, inbound, port, e.filterName(inbound))),
		&hcm.HttpFilter{Name: FaultFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&fault.HTTPFault{})}},
		&hcm.HttpFilter{Name: CorsFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&cors.Cors{})}},
		&hcm.HttpFilter{Name: wellknown.Router, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}},
	)
}

func httpConnectionManager(v *View, statPrefix string, dir Direction, port uint32, routes any) *listener.Filter {
	m := &hcm.HttpConnectionManager{
		StatPrefix:  statPrefix,
		CodecType:   hcm.HttpConnectionManager_AUTO,
		HttpFilters: httpFilters(v, dir, port),
		// Istio keeps the client's headers and adds its own request id.
		UseRemoteAddress: wrapperspb.Bool(false),
	}
	if dir == DirInbound && mtlsOn(v) {
		forwardClientCert(m)
	}
	switch r := routes.(type) {
	case *hcm.HttpConnectionManager_Rds:
		m.RouteSpecifier = r
	case *hcm.HttpConnectionManager_RouteConfig:
		m.RouteSpecifier = r
	}
	return &listener.Filter{Name: wellknown.HTTPConnectionManager, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(m)}}
}

func tcpProxy(statPrefix, cluster string) *listener.Filter {
	return &listener.Filter{Name: wellknown.TCPProxy, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
		StatPrefix:       statPrefix,
		ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: cluster},
	})}}
}

// outboundTCPProxy is tcp_proxy to a service's cluster, with the idle timeout and maximum
// connection duration of its DestinationRule's TCP connection pool.
func outboundTCPProxy(v *View, statPrefix, cluster, host string, port uint32) *listener.Filter {
	tcp := policyFor(v.Scope.DestinationRule(host), nil, port).GetConnectionPool().GetTcp()
	if tcp.GetIdleTimeout() == nil && tcp.GetMaxConnectionDuration() == nil {
		return tcpProxy(statPrefix, cluster)
	}
	return &listener.Filter{Name: wellknown.TCPProxy, ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
		StatPrefix:                      statPrefix,
		ClusterSpecifier:                &tcpproxy.TcpProxy_Cluster{Cluster: cluster},
		IdleTimeout:                     tcp.GetIdleTimeout(),
		MaxDownstreamConnectionDuration: tcp.GetMaxConnectionDuration(),
	})}}
}

func mustAny(m proto.Message) *anypb.Any {
	b, err := marshal.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", m, err)) // generated messages always marshal
	}
	return &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName()), Value: b}
}
