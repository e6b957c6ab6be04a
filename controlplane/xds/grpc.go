package xds

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Proxyless gRPC: an application whose node metadata says GENERATOR "grpc" resolves
// "xds:///<host>:<port>" targets with gRPC's own xDS client, which asks for resources by name
// and accepts a narrower set of shapes than Envoy (Istio's grpcgen):
//
//   - LDS "<host>:<port>" (or "<host>", every port): an API listener whose connection
//     manager has the fault and router filters and takes its routes from RDS
//     "outbound|<port>||<host>"; a gRPC server asks for
//     "xds.istio.io/grpc/lds/inbound/<ip>:<port>" and gets a plaintext filter chain with a
//     non-forwarding route.
//   - RDS "outbound|<port>||<host>": the virtual hosts of the port as for a sidecar
//     (VirtualService routes, weights, subsets, retries, fault injection), with the timeout in
//     max_stream_duration and without CORS (gRPC has no CORS filter).
//   - CDS by name: EDS clusters, round robin or the DestinationRule's ring hash, and
//     ISTIO_MUTUAL as certificate-provider instances, which is all gRPC reads of a cluster.
//   - EDS as for proxies (every locality group carries a locality, which gRPC requires).

// GRPCInboundListenerPrefix names the listeners a gRPC xDS server asks for.
const GRPCInboundListenerPrefix = "xds.istio.io/grpc/lds/inbound/"

// grpcListeners answers a gRPC client's LDS request; names nil means every service in
// scope.
func grpcListeners(v *View, names []string) *Resources {
	var items []*Resource
	if names == nil {
		for _, svc := range v.Scope.Services {
			for _, p := range svc.Ports {
				items = append(items, grpcAPIListener(svc, p, net.JoinHostPort(svc.Hostname, strconv.Itoa(int(p.Port)))))
			}
		}
		return NewResources(items)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			continue
		}
		seen[name] = true
		if addr, ok := strings.CutPrefix(name, GRPCInboundListenerPrefix); ok {
			if r := grpcInboundListener(v, name, addr); r != nil {
				items = append(items, r)
			}
			continue
		}
		host, port := name, ""
		if h, p, err := net.SplitHostPort(name); err == nil {
			host, port = h, p
		}
		svc := v.Scope.Service(grpcFQDN(v.Proxy, host))
		if svc == nil {
			continue
		}
		for _, p := range svc.Ports {
			if port == "" || strconv.Itoa(int(p.Port)) == port {
				items = append(items, grpcAPIListener(svc, p, name))
			}
		}
	}
	return NewResources(items)
}

// grpcFQDN completes a short name the way Istio's gRPC generator does: "reviews" and
// "reviews.<ns>" and "reviews.<ns>.svc" in the client's DNS domain.
func grpcFQDN(p *model.Proxy, host string) string {
	if !strings.Contains(host, ".") {
		return host + "." + p.DNSDomain
	}
	for _, suffix := range []string{p.Namespace, p.Namespace + ".svc"} {
		if short, ok := strings.CutSuffix(host, "."+suffix); ok && strings.HasPrefix(p.DNSDomain, suffix) {
			return short + "." + p.DNSDomain
		}
	}
	return host
}

func grpcHTTPFilters() []*hcm.HttpFilter {
	return []*hcm.HttpFilter{
		{Name: FaultFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&fault.HTTPFault{})}},
		{Name: RouterFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}},
	}
}

func grpcAPIListener(svc *model.Service, p model.Port, name string) *Resource {
	addr := "0.0.0.0"
	for _, a := range svc.Addresses {
		if !strings.Contains(a, "/") {
			addr = a
			break
		}
	}
	l := &listener.Listener{
		Name:    name,
		Address: socketAddress(addr, p.Port),
		ApiListener: &listener.ApiListener{ApiListener: mustAny(&hcm.HttpConnectionManager{
			// gRPC ignores the stat prefix; Envoy's validation requires one.
			StatPrefix:  fmt.Sprintf("outbound_%d_grpc", p.Port),
			HttpFilters: grpcHTTPFilters(),
			RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
				ConfigSource:    &core.ConfigSource{ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}},
				RouteConfigName: OutboundClusterName(p.Port, "", svc.Hostname),
			}},
		})},
	}
	return NewResource(name, l)
}

// grpcInboundListener is the listener of a gRPC xDS server on one of the ports its services
// give it: plaintext, every request accepted by a non-forwarding route.
func grpcInboundListener(v *View, name, addr string) *Resource {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	port, err := strconv.ParseUint(portStr, 10, 32)
	if err != nil {
		return nil
	}
	served := false
	for _, in := range v.Inbounds {
		if in.Port == uint32(port) {
			served = true
		}
	}
	if !served {
		return nil
	}
	m := &hcm.HttpConnectionManager{
		StatPrefix: fmt.Sprintf("inbound_%d_grpc", port),
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*route.VirtualHost{{
				Name:    "inbound",
				Domains: []string{"*"},
				Routes: []*route.Route{{
					Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
					Action: &route.Route_NonForwardingAction{NonForwardingAction: &route.NonForwardingAction{}},
				}},
			}},
		}},
		HttpFilters: []*hcm.HttpFilter{{Name: RouterFilter, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}}},
	}
	l := &listener.Listener{
		Name:    name,
		Address: socketAddress(host, uint32(port)),
		FilterChains: []*listener.FilterChain{{
			Name:    "inbound-plaintext",
			Filters: []*listener.Filter{{Name: "inbound-hcmplaintext", ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(m)}}},
		}},
	}
	return NewResource(name, l)
}

// grpcRoutes answers RDS "outbound|<port>||<host>": the virtual hosts of the port.
func grpcRoutes(v *View, names []string) []*Resource {
	var out []*Resource
	for _, name := range names {
		port, _, host, ok := ParseClusterName(name)
		if !ok || v.Scope.Service(host) == nil {
			continue
		}
		op := findOutboundPort(v, port)
		if op == nil || !op.HTTP {
			continue
		}
		out = append(out, v.Snapshot.full.routes.Get(routeKey{v.RouteKey(), name}, func() *Resource {
			return NewResource(name, &route.RouteConfiguration{Name: name, VirtualHosts: virtualHosts(v, op, true)})
		}))
	}
	return out
}

// grpcClusters answers CDS by name (nil: every cluster in scope).
func grpcClusters(v *View, names []string) *Resources {
	if names == nil {
		for _, svc := range v.Scope.Services {
			dr := v.Scope.DestinationRule(svc.Hostname)
			for _, p := range svc.Ports {
				names = append(names, OutboundClusterName(p.Port, "", svc.Hostname))
				for _, s := range dr.subsets() {
					names = append(names, OutboundClusterName(p.Port, s.GetName(), svc.Hostname))
				}
			}
		}
	}
	var items []*Resource
	for _, name := range names {
		port, subset, host, ok := ParseClusterName(name)
		if !ok {
			continue
		}
		svc := v.Scope.Service(host)
		if svc == nil {
			continue
		}
		if _, ok := svc.Port(port); !ok {
			continue
		}
		dr := v.Scope.DestinationRule(host)
		var sub *networking.Subset
		if subset != "" {
			if sub = dr.subset(subset); sub == nil {
				continue
			}
		}
		items = append(items, v.Snapshot.full.hostResources.Get(push.HostKey{Host: host, Name: "grpc\x00" + name + "\x00" + drVariant(dr)}, func() *Resource {
			return NewResource(name, grpcCluster(name, policyFor(dr, sub, port)))
		}))
	}
	return NewResources(items)
}

func grpcCluster(name string, tp *networking.TrafficPolicy) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig: &cluster.Cluster_EdsClusterConfig{ServiceName: name,
			EdsConfig: &core.ConfigSource{ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}},
		LbPolicy: cluster.Cluster_ROUND_ROBIN,
	}
	if ch := tp.GetLoadBalancer().GetConsistentHash(); ch != nil {
		c.LbPolicy = cluster.Cluster_RING_HASH
		if n := ch.GetRingHash().GetMinimumRingSize(); n != 0 {
			c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{MinimumRingSize: wrapperspb.UInt64(n)}}
		}
	}
	if tp.GetTls().GetMode() == networking.ClientTLSSettings_ISTIO_MUTUAL {
		// gRPC's xDS credentials take certificates from the bootstrap's certificate
		// providers, not from SDS.
		ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "default"},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: "ROOTCA"},
				MatchSubjectAltNames:          exactMatchers(tp.GetTls().GetSubjectAltNames()),
			}},
		}}
		c.TransportSocket = &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
	}
	return c
}

// generateGRPC is Generate for a gRPC client.
func generateGRPC(v *View, typeURL string, names []string) *Resources {
	switch typeURL {
	case ListenerType:
		return grpcListeners(v, names)
	case RouteType:
		return NewResources(grpcRoutes(v, names))
	case ClusterType:
		return grpcClusters(v, names)
	case EndpointType:
		return NewResources(Endpoints(v, names))
	}
	return NewResources(nil)
}

// grpcDump is Dump for a gRPC client: every API listener of its scope, their routes, the
// clusters those routes use, and their endpoints.
func grpcDump(v *View) map[string]*Resources {
	out := map[string]*Resources{}
	lds := grpcListeners(v, nil)
	out[ListenerType] = lds
	routeNames := map[string]bool{}
	for _, r := range lds.Items {
		var m hcm.HttpConnectionManager
		if err := r.Message.(*listener.Listener).GetApiListener().GetApiListener().UnmarshalTo(&m); err == nil {
			routeNames[m.GetRds().GetRouteConfigName()] = true
		}
	}
	rds := NewResources(grpcRoutes(v, sortedSet(routeNames)))
	out[RouteType] = rds
	clusters := map[string]bool{}
	for _, r := range rds.Items {
		for _, vh := range r.Message.(*route.RouteConfiguration).GetVirtualHosts() {
			for _, rt := range vh.GetRoutes() {
				if c := rt.GetRoute().GetCluster(); c != "" {
					clusters[c] = true
				}
				for _, wc := range rt.GetRoute().GetWeightedClusters().GetClusters() {
					clusters[wc.GetName()] = true
				}
			}
		}
	}
	cds := grpcClusters(v, sortedSet(clusters))
	out[ClusterType] = cds
	out[EndpointType] = NewResources(Endpoints(v, cds.Names()))
	out[ExtensionType] = NewResources(nil) // gRPC has no Wasm filters
	return out
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
