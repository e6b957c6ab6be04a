package xds

import (
	"sort"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Endpoints generates the ClusterLoadAssignments the proxy asked for. Names that are not EDS
// clusters of this snapshot are left out (Envoy keeps waiting for them, as with Istio).
// Each assignment is built once per snapshot and endpoint state and shared.
func Endpoints(snap *push.Snapshot, names []string) []*Resource {
	out := make([]*Resource, 0, len(names))
	for _, n := range names {
		if r := EndpointResource(snap, n); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// EndpointResource returns the assignment for one cluster, or nil when no such EDS cluster
// exists.
func EndpointResource(snap *push.Snapshot, name string) *Resource {
	port, host, ok := parseOutbound(name)
	if !ok {
		return nil
	}
	svc := snap.Service(host)
	if svc == nil || svc.Resolution != model.ClientSideLB {
		return nil
	}
	if _, ok := svc.Port(port); !ok {
		return nil
	}
	return snap.EDS.Get(push.HostKey{Host: host, Name: name}, func() any {
		return newResource(name, loadAssignment(name, snap.Endpoints(host), port))
	}).(*Resource)
}

// EDSClusterNames lists the EDS clusters of host, for pushing an endpoints-only change.
func EDSClusterNames(snap *push.Snapshot, host string) []string {
	svc := snap.Service(host)
	if svc == nil || svc.Resolution != model.ClientSideLB {
		return nil
	}
	out := make([]string, 0, len(svc.Ports))
	for _, p := range svc.Ports {
		out = append(out, OutboundClusterName(p.Port, "", host))
	}
	return out
}

// parseOutbound splits "outbound|<port>|<subset>|<host>"; subsets come with DestinationRules.
func parseOutbound(name string) (uint32, string, bool) {
	parts := strings.SplitN(name, "|", 4)
	if len(parts) != 4 || parts[0] != "outbound" || parts[2] != "" {
		return 0, "", false
	}
	p, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return 0, "", false
	}
	return uint32(p), parts[3], true
}

// loadAssignment groups the endpoints of one service port by locality.
func loadAssignment(name string, eps []*model.Endpoint, servicePort uint32) *endpoint.ClusterLoadAssignment {
	byLocality := map[string]*endpoint.LocalityLbEndpoints{}
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
		l.LbEndpoints = append(l.LbEndpoints, lbEndpoint(ep.Address, ep.Port, ep.Health, ep.Weight))
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
	return cla
}

func parseLocality(s string) *core.Locality {
	if s == "" {
		return nil
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
