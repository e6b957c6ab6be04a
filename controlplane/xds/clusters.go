package xds

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Istio's well-known cluster names.
const (
	BlackHoleCluster          = "BlackHoleCluster"
	PassthroughCluster        = "PassthroughCluster"
	InboundPassthroughCluster = "InboundPassthroughCluster"
)

// OutboundClusterName is Istio's "outbound|<port>|<subset>|<host>".
func OutboundClusterName(port uint32, subset, host string) string {
	return fmt.Sprintf("outbound|%d|%s|%s", port, subset, host)
}

// InboundClusterName is Istio's "inbound|<port>||" for a workload port.
func InboundClusterName(port uint32) string { return fmt.Sprintf("inbound|%d||", port) }

// adsConfigSource is where a proxy finds RDS routes and EDS endpoints: the ADS stream,
// waited for however long it takes (initial_fetch_timeout 0, as Istio sets it since
// istio/istio#31825): with Envoy's default of 15 s, a proxy whose control plane answers
// slowly would finish warming without its routes or endpoints and report ready with
// listeners that answer 404 and clusters with no hosts.
func adsConfigSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
		InitialFetchTimeout:   durationpb.New(0),
	}
}

// Clusters generates CDS for the proxy: the clusters of every service port in its scope
// (and of every subset its DestinationRules define), its inbound ports, and the passthrough
// and black-hole clusters.
func Clusters(v *View) *Resources {
	return v.cached(ClusterType, func() *Resources {
		shared := outboundClusters(v)
		items := make([]*Resource, 0, len(shared)+len(v.Inbounds)+3)
		items = append(items, shared...)
		for _, in := range v.Inbounds {
			items = append(items, inboundCluster(v, in))
		}
		items = append(items, staticCluster(v.Snapshot, BlackHoleCluster), passthroughCluster(v.Snapshot, PassthroughCluster))
		if v.Proxy.InterceptionMode == model.InterceptionRedirect {
			items = append(items, passthroughCluster(v.Snapshot, InboundPassthroughCluster))
		}
		return NewResources(patchClusters(v, items))
	})
}

type clustersKey struct {
	scope    string
	locality string
}

// outboundClusters depends on the proxy only through its scope (and its locality for DNS
// clusters with locality load balancing): built once per scope, each cluster once per
// snapshot and DestinationRule.
func outboundClusters(v *View) []*Resource {
	s := v.Scope
	key := clustersKey{scope: s.Key}
	if trafficOf(v.Snapshot).localityMatters {
		key.locality = localityString(v.Proxy)
	}
	return v.Snapshot.full.clusters.Get(key, func() []*Resource {
		var out []*Resource
		for _, svc := range s.Services {
			dr := s.DestinationRule(svc.Hostname)
			for _, p := range svc.Ports {
				out = append(out, clusterResource(v, svc, p, dr, nil))
				for _, sub := range dr.subsets() {
					out = append(out, clusterResource(v, svc, p, dr, sub))
				}
			}
		}
		return out
	})
}

func clusterResource(v *View, svc *model.Service, p model.Port, dr *destRule, sub *networking.Subset) *Resource {
	name := OutboundClusterName(p.Port, sub.GetName(), svc.Hostname)
	// A cluster depends on its service (the host), its DestinationRule and mesh config: kept
	// by host, it outlives changes of other services.
	variant := drVariant(dr)
	if svc.Resolution == model.DNSLB || svc.Resolution == model.DNSRoundRobin {
		// DNS clusters carry their endpoints, which locality balancing orders per client.
		variant += "|" + localityString(v.Proxy) + "|" + model.SortedLabels(v.Proxy.Labels)
	}
	return v.Snapshot.full.hostResources.Get(push.HostKey{Host: svc.Hostname, Name: name + "\x00" + variant}, func() *Resource {
		c := buildOutboundCluster(v, svc, p, dr, sub)
		return NewResource(c.Name, c)
	})
}

func connectTimeout(snap *Snapshot) *durationpb.Duration {
	if d := snap.Mesh.GetConnectTimeout(); d != nil {
		return d
	}
	return durationpb.New(10 * time.Second)
}

// buildOutboundCluster is the cluster of one service port (or subset) with the traffic
// policy of its DestinationRule applied as Istio applies it.
func buildOutboundCluster(v *View, svc *model.Service, p model.Port, dr *destRule, sub *networking.Subset) *cluster.Cluster {
	snap := v.Snapshot
	name := OutboundClusterName(p.Port, sub.GetName(), svc.Hostname)
	c := &cluster.Cluster{
		Name:           name,
		ConnectTimeout: connectTimeout(snap),
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{},
		Metadata:       clusterMetadata(svc, dr, sub),
	}
	var eps map[*endpoint.LbEndpoint]*model.Endpoint
	switch svc.Resolution {
	case model.ClientSideLB:
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_EDS}
		c.EdsClusterConfig = &cluster.Cluster_EdsClusterConfig{EdsConfig: adsConfigSource(), ServiceName: name}
	case model.DNSLB, model.DNSRoundRobin:
		t := cluster.Cluster_STRICT_DNS
		if svc.Resolution == model.DNSRoundRobin {
			t = cluster.Cluster_LOGICAL_DNS
		}
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: t}
		c.DnsLookupFamily = cluster.Cluster_V4_ONLY
		c.LoadAssignment, eps = loadAssignment(name, subsetEndpoints(snap.Endpoints(svc.Hostname), sub), p.Port)
		if mtlsOn(v) {
			markTLSMode(eps)
		}
		if svc.Resolution == model.DNSRoundRobin && len(c.LoadAssignment.Endpoints) > 0 {
			// LOGICAL_DNS accepts exactly one endpoint.
			c.LoadAssignment.Endpoints = c.LoadAssignment.Endpoints[:1]
			c.LoadAssignment.Endpoints[0].LbEndpoints = c.LoadAssignment.Endpoints[0].LbEndpoints[:1]
		}
	case model.Passthrough:
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}
	}
	tp := policyFor(dr, sub, p.Port)
	opts := &clusterOptions{}
	applyConnectionPool(c, opts, tp.GetConnectionPool(), tp.GetRetryBudget())
	if p.Protocol.IsHTTP() || tp.GetConnectionPool().GetHttp().GetH2UpgradePolicy() == networking.ConnectionPoolSettings_HTTPSettings_UPGRADE {
		applyHTTPProtocol(opts, p, tp.GetConnectionPool(), snap.Mesh)
	}
	applyOutlierDetection(c, tp.GetOutlierDetection())
	ll := localitySetting(snap.Mesh, tp.GetLoadBalancer())
	failover := c.OutlierDetection != nil
	applyLoadBalancer(c, tp.GetLoadBalancer(), ll, failover)
	if c.LoadAssignment != nil {
		applyLocality(c.LoadAssignment, eps, v.Proxy.Locality, v.Proxy.Labels, ll, failover)
	}
	applyUpstreamTLS(v, c, opts, svc, p, sub, tp)
	upstreamProxyProtocol(c, tp.GetProxyProtocol())
	opts.apply(c)
	return c
}

// clusterMetadata is Istio's: the service the cluster belongs to, and the DestinationRule
// and subset that shaped it.
func clusterMetadata(svc *model.Service, dr *destRule, sub *networking.Subset) *core.Metadata {
	fields := map[string]*structpb.Value{
		"services": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"host":      structpb.NewStringValue(svc.Hostname),
			"name":      structpb.NewStringValue(serviceName(svc)),
			"namespace": structpb.NewStringValue(svc.Namespace),
		}})}}),
	}
	if dr != nil {
		fields["config"] = structpb.NewStringValue(dr.meta)
	}
	if sub != nil {
		fields["subset"] = structpb.NewStringValue(sub.GetName())
	}
	return &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": {Fields: fields}}}
}

// serviceName is the Kubernetes service name of a host ("reviews" of
// "reviews.shop.svc.cluster.local"), else the host, as Istio names ServiceEntry hosts.
func serviceName(svc *model.Service) string {
	if parts := strings.Split(svc.Hostname, "."); len(parts) >= 4 && parts[2] == "svc" {
		return parts[0]
	}
	return svc.Hostname
}

// subsetEndpoints keeps the endpoints whose labels match the subset's.
func subsetEndpoints(eps []*model.Endpoint, sub *networking.Subset) []*model.Endpoint {
	if len(sub.GetLabels()) == 0 {
		return eps
	}
	out := make([]*model.Endpoint, 0, len(eps))
	for _, ep := range eps {
		if config.SelectorMatches(sub.GetLabels(), ep.Labels) {
			out = append(out, ep)
		}
	}
	return out
}

// inboundCluster sends to the application: 127.0.0.1:<port> under iptables capture, the
// pod's own localhost in the local mesh.
func inboundCluster(v *View, in Inbound) *Resource {
	name := InboundClusterName(in.Port)
	addr, port := "127.0.0.1", in.Port
	if v.Proxy.InterceptionMode == model.InterceptionNone {
		addr = v.Proxy.Localhost
	}
	if in.EndpointAddr != "" {
		// A Sidecar ingress defaultEndpoint: loopback means the pod's own localhost.
		addr, port = in.EndpointAddr, in.EndpointPort
		if ip, err := netip.ParseAddr(addr); err == nil && ip.IsLoopback() && v.Proxy.InterceptionMode == model.InterceptionNone {
			addr = v.Proxy.Localhost
		}
	}
	c := &cluster.Cluster{
		Name:                 name,
		ConnectTimeout:       connectTimeout(v.Snapshot),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		LoadAssignment: &endpoint.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpoint.LocalityLbEndpoints{{
				LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint(addr, port, model.Healthy, 0)},
			}},
		},
	}
	opts := &clusterOptions{}
	if in.Pool != nil {
		// The Sidecar's inbound connection pool limits what reaches the application.
		applyConnectionPool(c, opts, in.Pool, nil)
	}
	if in.Protocol.IsHTTP2() {
		opts.setHTTP2()
	}
	opts.apply(c)
	return NewResource(name, c)
}

func staticCluster(snap *Snapshot, name string) *Resource {
	return snap.full.static.Get("cds/"+name, func() *Resource {
		return NewResource(name, &cluster.Cluster{
			Name:                 name,
			ConnectTimeout:       connectTimeout(snap),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		})
	})
}

func passthroughCluster(snap *Snapshot, name string) *Resource {
	return snap.full.static.Get("cds/"+name, func() *Resource {
		return NewResource(name, &cluster.Cluster{
			Name:                 name,
			ConnectTimeout:       connectTimeout(snap),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
		})
	})
}
