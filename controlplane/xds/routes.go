package xds

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Routes generates the outbound route configurations the proxy asked for, one per HTTP
// service port, named "<port>". Unknown names are left out.
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
	for _, op := range outboundPorts(v.Snapshot) {
		if op.HTTP {
			out = append(out, strconv.Itoa(int(op.Port)))
		}
	}
	return out
}

func routeResource(v *View, name string) *Resource {
	port, err := strconv.ParseUint(name, 10, 32)
	if err != nil {
		return nil
	}
	var op *outboundPort
	for _, o := range outboundPorts(v.Snapshot) {
		if o.Port == uint32(port) && o.HTTP {
			op = o
		}
	}
	if op == nil {
		return nil
	}
	// Short host names depend on the proxy's namespace, nothing else does (yet): cache per
	// namespace. Sidecar-scoped and VirtualService-shaped routes will extend this key.
	return v.Snapshot.Full.Get("rds/"+v.Proxy.Namespace+"/"+name, func() any {
		rc := &route.RouteConfiguration{
			Name:             name,
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts:     virtualHosts(v.Snapshot, v.Proxy.Namespace, op),
		}
		return newResource(name, rc)
	}).(*Resource)
}

// virtualHosts builds one virtual host per HTTP service on the port. A VirtualService for a
// host replaces that host's default route here.
func virtualHosts(snap *push.Snapshot, proxyNS string, op *outboundPort) []*route.VirtualHost {
	hosts := append([]string(nil), op.HTTPHost...)
	sort.Strings(hosts)
	seen := map[string]bool{}
	var out []*route.VirtualHost
	for _, h := range hosts {
		svc := snap.Service(h)
		var domains []string
		for _, d := range domainsFor(svc, proxyNS, op.Port) {
			// A short name can only belong to one virtual host; the first service keeps it.
			if !seen[d] {
				seen[d] = true
				domains = append(domains, d)
			}
		}
		cluster := OutboundClusterName(op.Port, "", h)
		out = append(out, &route.VirtualHost{
			Name:    fmt.Sprintf("%s:%d", h, op.Port),
			Domains: domains,
			Routes:  []*route.Route{defaultRoute(cluster, h, op.Port)},
		})
	}
	if snap.Mesh.GetOutboundTrafficPolicy().GetMode() == meshconfig.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY {
		out = append(out, &route.VirtualHost{
			Name: "block_all", Domains: []string{"*"},
			Routes: []*route.Route{{Name: "block_all", Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
				Action: &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{Status: 502}}}},
		})
	} else {
		out = append(out, &route.VirtualHost{
			Name: "allow_any", Domains: []string{"*"},
			Routes: []*route.Route{{Name: "allow_any", Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
				Action: &route.Route_Route{Route: &route.RouteAction{
					ClusterSpecifier: &route.RouteAction_Cluster{Cluster: PassthroughCluster}, Timeout: durationpb.New(0)}}}},
		})
	}
	return out
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

// defaultRoute sends every request to cluster, Istio's route for a service without a
// VirtualService.
func defaultRoute(cluster, host string, port uint32) *route.Route {
	return &route.Route{
		Name:  "default",
		Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{
			ClusterSpecifier: &route.RouteAction_Cluster{Cluster: cluster},
			// Istio disables Envoy's 15 s default; a VirtualService sets timeouts.
			Timeout: durationpb.New(0),
		}},
		Decorator: &route.Decorator{Operation: fmt.Sprintf("%s:%d/*", host, port)},
	}
}
