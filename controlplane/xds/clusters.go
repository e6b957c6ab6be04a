package xds

import (
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

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

func adsConfigSource() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// Clusters generates CDS for the proxy: every outbound service port, its inbound ports, and
// the passthrough and black-hole clusters.
func Clusters(v *View) *Resources {
	return v.cached(ClusterType, func() *Resources {
		shared := outboundClusters(v.Snapshot)
		items := make([]*Resource, 0, len(shared)+len(v.Inbounds)+3)
		items = append(items, shared...)
		for _, in := range v.Inbounds {
			items = append(items, inboundCluster(v, in))
		}
		items = append(items, staticCluster(v.Snapshot, BlackHoleCluster), passthroughCluster(v.Snapshot, PassthroughCluster))
		if v.Proxy.InterceptionMode == model.InterceptionRedirect {
			items = append(items, passthroughCluster(v.Snapshot, InboundPassthroughCluster))
		}
		return newResources(items)
	})
}

// outboundClusters does not depend on the proxy: built once per full snapshot. This is where
// a DestinationRule's traffic policy and subsets will be applied.
func outboundClusters(snap *push.Snapshot) []*Resource {
	return snap.Full.Get("cds/outbound", func() any {
		var out []*Resource
		for _, svc := range snap.Services {
			for _, p := range svc.Ports {
				c := buildOutboundCluster(snap, svc, p)
				out = append(out, newResource(c.Name, c))
			}
		}
		return out
	}).([]*Resource)
}

func connectTimeout(snap *push.Snapshot) *durationpb.Duration {
	if d := snap.Mesh.GetConnectTimeout(); d != nil {
		return d
	}
	return durationpb.New(10 * time.Second)
}

func buildOutboundCluster(snap *push.Snapshot, svc *model.Service, p model.Port) *cluster.Cluster {
	name := OutboundClusterName(p.Port, "", svc.Hostname)
	c := &cluster.Cluster{
		Name:           name,
		ConnectTimeout: connectTimeout(snap),
		LbPolicy:       cluster.Cluster_ROUND_ROBIN,
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{},
	}
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
		c.LoadAssignment = loadAssignment(name, snap.Endpoints(svc.Hostname), p.Port)
		if svc.Resolution == model.DNSRoundRobin && len(c.LoadAssignment.Endpoints) > 0 {
			// LOGICAL_DNS accepts exactly one endpoint.
			c.LoadAssignment.Endpoints = c.LoadAssignment.Endpoints[:1]
			c.LoadAssignment.Endpoints[0].LbEndpoints = c.LoadAssignment.Endpoints[0].LbEndpoints[:1]
		}
	case model.Passthrough:
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}
		c.LbPolicy = cluster.Cluster_CLUSTER_PROVIDED
	}
	if p.Protocol.IsHTTP2() {
		c.TypedExtensionProtocolOptions = http2Options()
	}
	return c
}

func http2Options() map[string]*anypb.Any {
	opts := &httpopts.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &core.Http2ProtocolOptions{},
				},
			},
		},
	}
	a, _ := anypb.New(opts)
	return map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": a}
}

// inboundCluster sends to the application: 127.0.0.1:<port> under iptables capture, the
// pod's own localhost in the local mesh.
func inboundCluster(v *View, in Inbound) *Resource {
	name := InboundClusterName(in.Port)
	addr := "127.0.0.1"
	if v.Proxy.InterceptionMode == model.InterceptionNone {
		addr = v.Proxy.Localhost
	}
	c := &cluster.Cluster{
		Name:                 name,
		ConnectTimeout:       connectTimeout(v.Snapshot),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		LoadAssignment: &endpoint.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpoint.LocalityLbEndpoints{{
				LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint(addr, in.Port, model.Healthy, 0)},
			}},
		},
	}
	if in.Protocol.IsHTTP2() {
		c.TypedExtensionProtocolOptions = http2Options()
	}
	return newResource(name, c)
}

func staticCluster(snap *push.Snapshot, name string) *Resource {
	return snap.Full.Get("cds/"+name, func() any {
		return newResource(name, &cluster.Cluster{
			Name:                 name,
			ConnectTimeout:       connectTimeout(snap),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
		})
	}).(*Resource)
}

func passthroughCluster(snap *push.Snapshot, name string) *Resource {
	return snap.Full.Get("cds/"+name, func() any {
		return newResource(name, &cluster.Cluster{
			Name:                 name,
			ConnectTimeout:       connectTimeout(snap),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
		})
	}).(*Resource)
}
