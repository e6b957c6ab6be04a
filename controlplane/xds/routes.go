package xds

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Routes generates the outbound route configurations the proxy asked for, one per HTTP
// listener port, named "<port>". Unknown names are left out.
func Routes(v *View, names []string) []*Resource {
	out := make([]*Resource, 0, len(names))
	for _, n := range names {
		if r := routeResource(v, n); r != nil {
			out = append(out, r)
		}
	}
	return out
}

// RouteNames lists the route configurations the proxy's listeners reference, for delta and
// wildcard-less clients that need to know what exists.
func RouteNames(v *View) []string {
	var out []string
	for _, op := range outboundPorts(v) {
		if op.HTTP {
			out = append(out, strconv.Itoa(int(op.Port)))
		}
	}
	return out
}

type routeKey struct {
	scope string
	name  string
}

func routeResource(v *View, name string) *Resource {
	port, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return nil
	}
	op := findOutboundPort(v, uint32(port))
	if op == nil || !op.HTTP {
		return nil
	}
	// Routes depend on the proxy only through its scope (namespace, Sidecar, and labels when
	// a VirtualService or DestinationRule selects by them).
	return v.Snapshot.full.routes.Get(routeKey{v.RouteKey(), name}, func() *Resource {
		rc := &route.RouteConfiguration{
			Name:             name,
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts:     virtualHosts(v, op, false),
		}
		return NewResource(name, rc)
	})
}

// virtualHosts builds the virtual hosts of one listener port: a VirtualService's routes for
// the services it names, the default route for the others, and the catch-all for
// destinations outside the registry.
func virtualHosts(v *View, op *outboundPort, grpc bool) []*route.VirtualHost {
	s := v.Scope
	rc := &routeCtx{scope: s, mesh: v.Snapshot.Mesh, port: op.Port, grpc: grpc}
	e := op.egress
	var entries []vhostEntry
	routed := map[string]bool{}
	for _, vs := range e.VS {
		var hosts []string
		for _, h := range op.HTTPHost {
			if e.vsByHost[h] == vs {
				hosts = append(hosts, h)
			}
		}
		var external []string
		if op.Port == 80 {
			external = e.vsOnlyHosts[vs]
		}
		if len(hosts) == 0 && len(external) == 0 {
			continue
		}
		routes := rc.vsRoutes(vs)
		if len(routes) == 0 {
			continue // nothing applies on this port: the services keep their default route
		}
		for _, h := range hosts {
			routed[h] = true
			entries = append(entries, vhostEntry{name: h, domains: domainsFor(s.Service(h), s.Namespace, op.Port), routes: routes})
		}
		for _, h := range external {
			entries = append(entries, vhostEntry{name: h, domains: []string{h, fmt.Sprintf("%s:%d", h, op.Port)}, routes: routes})
		}
	}
	for _, h := range op.HTTPHost {
		if routed[h] {
			continue
		}
		// A service's default virtual host depends on the service, the client's namespace,
		// the port and the service's DestinationRule: kept by host, it outlives changes of
		// other services.
		key := push.HostKey{Host: h, Name: fmt.Sprintf("vhost\x00%d\x00%s\x00%s\x00%t", op.Port, s.Namespace, drVariant(s.DestinationRule(h)), grpc)}
		entries = append(entries, v.Snapshot.full.vhosts.Get(key, func() vhostEntry {
			return vhostEntry{name: h, domains: domainsFor(s.Service(h), s.Namespace, op.Port),
				routes: []*route.Route{defaultHTTPRoute(v.Snapshot.Mesh, OutboundClusterName(op.Port, "", h), h, op.Port, rc.serviceHash(h), grpc)}}
		}))
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	total := 0
	for _, en := range entries {
		total += len(en.domains)
	}
	seen := make(map[string]bool, total)
	out := make([]*route.VirtualHost, 0, len(entries)+1)
	for _, en := range entries {
		var domains []string
		for _, d := range en.domains {
			// A domain can only belong to one virtual host; the first keeps it.
			if !seen[d] {
				seen[d] = true
				domains = append(domains, d)
			}
		}
		if len(domains) == 0 {
			continue
		}
		out = append(out, &route.VirtualHost{
			Name:                       fmt.Sprintf("%s:%d", en.name, op.Port),
			Domains:                    domains,
			Routes:                     en.routes,
			IncludeRequestAttemptCount: true,
		})
	}
	if grpc {
		return out
	}
	if s.RegistryOnly {
		out = append(out, &route.VirtualHost{
			Name: "block_all", Domains: []string{"*"}, IncludeRequestAttemptCount: true,
			Routes: []*route.Route{{Name: "block_all", Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
				Action: &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{Status: 502}}}},
		})
	} else {
		out = append(out, &route.VirtualHost{
			Name: "allow_any", Domains: []string{"*"}, IncludeRequestAttemptCount: true,
			Routes: []*route.Route{{Name: "allow_any", Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
				Action: &route.Route_Route{Route: &route.RouteAction{
					ClusterSpecifier: &route.RouteAction_Cluster{Cluster: unknownDestinationCluster(s, op.Port)},
					Timeout:          durationpb.New(0),
					MaxGrpcTimeout:   durationpb.New(0), //nolint:staticcheck // as Istio
				}}}},
		})
	}
	return out
}

// vhostEntry is a virtual host before domains claimed by an earlier one are dropped. Its
// slices are shared (memoized) and not modified.
type vhostEntry struct {
	name    string
	domains []string
	routes  []*route.Route
}

// serviceHash is the consistent-hash key of a service's DestinationRule for the port (a
// port-level setting wins), used on the service's default route.
func (rc *routeCtx) serviceHash(host string) *networking.LoadBalancerSettings_ConsistentHashLB {
	dr := rc.scope.DestinationRule(host)
	if dr == nil {
		return nil
	}
	tp := dr.spec.GetTrafficPolicy()
	hash := tp.GetLoadBalancer().GetConsistentHash()
	for _, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == rc.port {
			if h := pl.GetLoadBalancer().GetConsistentHash(); h != nil {
				hash = h
			}
			break
		}
	}
	return hash
}

// unknownDestinationCluster receives traffic for hosts outside the registry: the Sidecar's
// egress proxy, else the passthrough cluster.
func unknownDestinationCluster(s *Scope, port uint32) string {
	if ep := s.EgressProxy; ep != nil {
		return OutboundClusterName(ep.GetPort().GetNumber(), ep.GetSubset(), resolveHost(ep.GetHost(), s.Namespace))
	}
	return PassthroughCluster
}

// domainsFor lists the names a client may use for a service: the host, the short forms of a
// "<name>.<ns>.svc.<domain>" host (all of them within the namespace, "<name>.<ns>" and
// "<name>.<ns>.svc" from elsewhere), and the service addresses; each with and without the port.
func domainsFor(svc *model.Service, proxyNS string, port uint32) []string {
	names := []string{svc.Hostname}
	parts := strings.Split(svc.Hostname, ".")
	if len(parts) >= 4 && parts[2] == "svc" {
		if parts[1] == proxyNS {
			names = append(names, parts[0])
		}
		names = append(names, parts[0]+"."+parts[1], parts[0]+"."+parts[1]+".svc")
	}
	for _, a := range svc.Addresses {
		if !strings.Contains(a, "/") {
			names = append(names, a)
		}
	}
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		out = append(out, n, fmt.Sprintf("%s:%d", n, port))
	}
	return out
}

// inboundRoute sends every request to the inbound cluster, without timeout.
func inboundRoute(cluster, host string, port uint32) *route.Route {
	return &route.Route{
		Name:  "default",
		Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(0),
			MaxStreamDuration: &route.RouteAction_MaxStreamDuration{
				MaxStreamDuration:    durationpb.New(0),
				GrpcTimeoutHeaderMax: durationpb.New(0),
			},
		}},
		Decorator: &route.Decorator{Operation: fmt.Sprintf("%s:%d/*", host, port)},
	}
}
