package xds

import (
	"sort"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Endpoints generates the ClusterLoadAssignments the proxy asked for. Names that are not EDS
// clusters of the proxy's scope are left out (Envoy keeps waiting for them, as with Istio).
// Each assignment is built once per snapshot, endpoint state and DestinationRule (and client
// locality, when the rule balances by locality) and shared.
func Endpoints(v *View, names []string) []*Resource {
	out := make([]*Resource, 0, len(names))
	for _, n := range names {
		if r := EndpointResource(v, n); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// EndpointResource returns the assignment for one cluster, or nil when no such EDS cluster
// exists for the proxy.
func EndpointResource(v *View, name string) *Resource {
	port, subset, host, ok := ParseClusterName(name)
	if !ok {
		return nil
	}
	svc := v.Scope.Service(host)
	if svc == nil || svc.Resolution != model.ClientSideLB {
		return nil
	}
	p, ok := svc.Port(port)
	if !ok {
		return nil
	}
	dr := v.Scope.DestinationRule(host)
	var sub *networking.Subset
	if subset != "" {
		if sub = dr.subset(subset); sub == nil {
			return nil
		}
	}
	tp := policyFor(dr, sub, p.Port)
	ll := localitySetting(v.Snapshot.Mesh, tp.GetLoadBalancer())
	failover := tp.GetOutlierDetection() != nil
	variant := drVariant(dr)
	if dr != nil {
		if ll != nil && (failover || len(ll.GetDistribute()) > 0) {
			variant += "|" + localityString(v.Proxy)
			if failover && len(ll.GetFailoverPriority()) > 0 {
				variant += "|" + model.SortedLabels(v.Proxy.Labels)
			}
		}
	}
	return v.Snapshot.eds.assignments.Get(push.HostKey{Host: host, Name: name + "\x00" + variant}, func() *Resource {
		cla, eps := loadAssignment(name, subsetEndpoints(v.Snapshot.Endpoints(host), sub), port)
		if mtlsOn(v) {
			markTLSMode(eps)
		}
		if dr != nil && ll != nil {
			applyLocality(cla, eps, v.Proxy.Locality, v.Proxy.Labels, ll, failover)
		}
		return NewResource(name, cla)
	})
}

// drVariant names a DestinationRule in memo keys that outlive a snapshot (HostKey): within
// the snapshots that inherit such entries, configs other than ServiceEntry and WorkloadEntry
// do not change, so the rule's config names it.
func drVariant(dr *destRule) string {
	if dr == nil {
		return ""
	}
	return dr.cfg.Namespace + "/" + dr.cfg.Name
}

// EDSClusterNames lists every EDS cluster of host a proxy may watch (the service's ports and
// the subsets any DestinationRule defines for it), for pushing an endpoints-only change.
func EDSClusterNames(snap *Snapshot, host string) []string {
	svc := snap.Service(host)
	if svc == nil || svc.Resolution != model.ClientSideLB {
		return nil
	}
	var subsets []string
	seen := map[string]bool{}
	for _, dr := range trafficOf(snap).drs {
		if !hostMatches(host, dr.host) {
			continue
		}
		for _, s := range dr.spec.GetSubsets() {
			if !seen[s.GetName()] {
				seen[s.GetName()] = true
				subsets = append(subsets, s.GetName())
			}
		}
	}
	out := make([]string, 0, len(svc.Ports)*(1+len(subsets)))
	for _, p := range svc.Ports {
		out = append(out, OutboundClusterName(p.Port, "", host))
		for _, s := range subsets {
			out = append(out, OutboundClusterName(p.Port, s, host))
		}
	}
	return out
}

// loadAssignment groups the endpoints of one service port by locality, and returns which
// endpoint each LbEndpoint came from (for label-based failover).
func loadAssignment(name string, eps []*model.Endpoint, servicePort uint32) (*endpoint.ClusterLoadAssignment, map[*endpoint.LbEndpoint]*model.Endpoint) {
	byLocality := map[string]*endpoint.LocalityLbEndpoints{}
	origin := map[*endpoint.LbEndpoint]*model.Endpoint{}
	var localities []string
	for _, ep := range eps {
		// Unhealthy endpoints are left out, as Istio does by default
		// (PILOT_SEND_UNHEALTHY_ENDPOINTS=false): sent as UNHEALTHY, a proxy in panic mode
		// (too few healthy hosts) would still use them, and it keeps its pooled connections
		// to them, which holds a draining pod's connection count above zero.
		if ep.ServicePort != servicePort || ep.Health == model.Unhealthy {
			continue
		}
		l := byLocality[ep.Locality]
		if l == nil {
			l = &endpoint.LocalityLbEndpoints{Locality: parseLocality(ep.Locality)}
			byLocality[ep.Locality] = l
			localities = append(localities, ep.Locality)
		}
		lb := lbEndpoint(ep.Address, ep.Port, ep.Health, ep.Weight)
		origin[lb] = ep
		l.LbEndpoints = append(l.LbEndpoints, lb)
	}
	sort.Strings(localities)
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{}}
	for _, loc := range localities {
		l := byLocality[loc]
		// Locality weight is the sum of its endpoints' weights (Istio's rule), needed once
		// locality-weighted balancing is enabled.
		var w uint32
		for _, e := range l.LbEndpoints {
			w += e.GetLoadBalancingWeight().GetValue()
		}
		if w > 0 {
			l.LoadBalancingWeight = wrapperspb.UInt32(w)
		}
		cla.Endpoints = append(cla.Endpoints, l)
	}
	return cla, origin
}

// parseLocality reads "region/zone/subzone"; every group of endpoints carries a locality,
// empty when unknown, as Istio sends it (gRPC's xDS client rejects groups without one).
func parseLocality(s string) *core.Locality {
	if s == "" {
		return &core.Locality{}
	}
	parts := strings.SplitN(s, "/", 3)
	l := &core.Locality{Region: parts[0]}
	if len(parts) > 1 {
		l.Zone = parts[1]
	}
	if len(parts) > 2 {
		l.SubZone = parts[2]
	}
	return l
}

func lbEndpoint(addr string, port uint32, h model.Health, weight uint32) *endpoint.LbEndpoint {
	if weight == 0 {
		weight = 1
	}
	status := core.HealthStatus_HEALTHY
	switch h {
	case model.Unhealthy:
		status = core.HealthStatus_UNHEALTHY
	case model.Draining:
		status = core.HealthStatus_DRAINING
	}
	return &endpoint.LbEndpoint{
		HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: socketAddress(addr, port),
		}},
		HealthStatus:        status,
		LoadBalancingWeight: wrapperspb.UInt32(weight),
	}
}

func socketAddress(addr string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol: core.SocketAddress_TCP, Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}
