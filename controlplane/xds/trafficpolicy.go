package xds

import (
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	proxyprotocol "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/proxy_protocol/v3"
	rawbuffer "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// mergeTrafficPolicy is Istio's merge of a subset's (or a rule's) policy over its parent for
// one port: the subset's components replace the parent's, and a port-level setting for the
// port replaces load balancer, connection pool, outlier detection and TLS wholesale (unset
// ones fall back to the defaults, not to the parent).
func mergeTrafficPolicy(parent, child *networking.TrafficPolicy, port uint32) *networking.TrafficPolicy {
	if child == nil {
		return parent
	}
	if parent != nil && len(parent.GetPortLevelSettings()) > 0 {
		parent = mergeTrafficPolicy(nil, parent, port)
	}
	out := &networking.TrafficPolicy{}
	if parent != nil {
		out.ConnectionPool, out.LoadBalancer, out.OutlierDetection, out.Tls = parent.ConnectionPool, parent.LoadBalancer, parent.OutlierDetection, parent.Tls
		out.ProxyProtocol, out.RetryBudget = parent.ProxyProtocol, parent.RetryBudget
	}
	if child.ConnectionPool != nil {
		out.ConnectionPool = child.ConnectionPool
	}
	if child.LoadBalancer != nil {
		out.LoadBalancer = child.LoadBalancer
	}
	if child.OutlierDetection != nil {
		out.OutlierDetection = child.OutlierDetection
	}
	if child.Tls != nil {
		out.Tls = child.Tls
	}
	if child.ProxyProtocol != nil {
		out.ProxyProtocol = child.ProxyProtocol
	}
	if child.RetryBudget != nil {
		out.RetryBudget = child.RetryBudget
	}
	for _, pl := range child.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			out.ConnectionPool, out.OutlierDetection, out.LoadBalancer, out.Tls = pl.ConnectionPool, pl.OutlierDetection, pl.LoadBalancer, pl.Tls
			break
		}
	}
	return out
}

// policyFor is the traffic policy of one cluster: the rule's, merged for the port, with the
// subset's merged over it.
func policyFor(dr *destRule, subset *networking.Subset, port uint32) *networking.TrafficPolicy {
	if dr == nil {
		return nil
	}
	tp := mergeTrafficPolicy(nil, dr.spec.GetTrafficPolicy(), port)
	if subset != nil {
		tp = mergeTrafficPolicy(tp, subset.GetTrafficPolicy(), port)
	}
	return tp
}

// clusterOptions collects the HTTP protocol options a cluster's policy sets; they are
// written into typed_extension_protocol_options once complete.
type clusterOptions struct {
	opts *httpopts.HttpProtocolOptions
}

func (o *clusterOptions) get() *httpopts.HttpProtocolOptions {
	if o.opts == nil {
		o.opts = &httpopts.HttpProtocolOptions{}
	}
	return o.opts
}

func (o *clusterOptions) common() *core.HttpProtocolOptions {
	p := o.get()
	if p.CommonHttpProtocolOptions == nil {
		p.CommonHttpProtocolOptions = &core.HttpProtocolOptions{}
	}
	return p.CommonHttpProtocolOptions
}

func (o *clusterOptions) setHTTP2() *core.Http2ProtocolOptions {
	h2 := &core.Http2ProtocolOptions{}
	o.get().UpstreamProtocolOptions = &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
		ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: h2},
	}}
	return h2
}

func (o *clusterOptions) http2() *core.Http2ProtocolOptions {
	if o.opts == nil {
		return nil
	}
	switch p := o.opts.GetUpstreamProtocolOptions().(type) {
	case *httpopts.HttpProtocolOptions_ExplicitHttpConfig_:
		return p.ExplicitHttpConfig.GetHttp2ProtocolOptions()
	case *httpopts.HttpProtocolOptions_UseDownstreamProtocolConfig:
		return p.UseDownstreamProtocolConfig.GetHttp2ProtocolOptions()
	}
	return nil
}

func (o *clusterOptions) apply(c *cluster.Cluster) {
	if o.opts == nil {
		return
	}
	if o.opts.UpstreamProtocolOptions == nil {
		// Envoy requires a protocol choice once the options exist: HTTP/1.1, as without them.
		o.opts.UpstreamProtocolOptions = &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &core.Http1ProtocolOptions{}},
		}}
	}
	a, _ := anypb.New(o.opts)
	c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": a}
}

// defaultThresholds are Istio's circuit breakers for every cluster: effectively unlimited,
// so only what a DestinationRule sets limits traffic (Envoy's own defaults, such as 3
// concurrent retries, trip during rolling updates).
func defaultThresholds() *cluster.CircuitBreakers_Thresholds {
	return &cluster.CircuitBreakers_Thresholds{
		MaxConnections:     wrapperspb.UInt32(math.MaxUint32),
		MaxPendingRequests: wrapperspb.UInt32(math.MaxUint32),
		MaxRequests:        wrapperspb.UInt32(math.MaxUint32),
		MaxRetries:         wrapperspb.UInt32(math.MaxUint32),
		TrackRemaining:     true,
	}
}

// applyConnectionPool sets circuit breakers, connect timeout, keepalive and the HTTP
// connection limits of a pool (nil: Istio's defaults).
func applyConnectionPool(c *cluster.Cluster, o *clusterOptions, pool *networking.ConnectionPoolSettings, budget *networking.TrafficPolicy_RetryBudget) {
	t := defaultThresholds()
	var idle *durationpb.Duration
	if h := pool.GetHttp(); h != nil {
		if h.GetHttp2MaxRequests() > 0 {
			t.MaxRequests = wrapperspb.UInt32(uint32(h.GetHttp2MaxRequests()))
		}
		if h.GetHttp1MaxPendingRequests() > 0 {
			t.MaxPendingRequests = wrapperspb.UInt32(uint32(h.GetHttp1MaxPendingRequests()))
		}
		if h.GetMaxRetries() > 0 {
			t.MaxRetries = wrapperspb.UInt32(uint32(h.GetMaxRetries()))
		}
		idle = h.GetIdleTimeout()
		if n := h.GetMaxRequestsPerConnection(); n > 0 {
			o.common().MaxRequestsPerConnection = wrapperspb.UInt32(uint32(n))
		}
	}
	if tcp := pool.GetTcp(); tcp != nil {
		if tcp.GetConnectTimeout() != nil {
			c.ConnectTimeout = tcp.GetConnectTimeout()
		}
		if tcp.GetMaxConnections() > 0 {
			t.MaxConnections = wrapperspb.UInt32(uint32(tcp.GetMaxConnections()))
		}
		if tcp.GetMaxConnectionDuration() != nil {
			o.common().MaxConnectionDuration = tcp.GetMaxConnectionDuration()
		}
		if idle == nil {
			idle = tcp.GetIdleTimeout()
		}
		if ka := tcp.GetTcpKeepalive(); ka != nil {
			k := &core.TcpKeepalive{}
			if ka.GetProbes() > 0 {
				k.KeepaliveProbes = wrapperspb.UInt32(ka.GetProbes())
			}
			if ka.GetTime() != nil {
				k.KeepaliveTime = wrapperspb.UInt32(uint32(ka.GetTime().AsDuration() / time.Second))
			}
			if ka.GetInterval() != nil {
				k.KeepaliveInterval = wrapperspb.UInt32(uint32(ka.GetInterval().AsDuration() / time.Second))
			}
			c.UpstreamConnectionOptions = &cluster.UpstreamConnectionOptions{TcpKeepalive: k}
		}
	}
	if idle != nil {
		o.common().IdleTimeout = idle
	}
	if budget != nil {
		rb := &cluster.CircuitBreakers_Thresholds_RetryBudget{BudgetPercent: &typev3.Percent{Value: 20}, MinRetryConcurrency: wrapperspb.UInt32(3)}
		if budget.GetPercent() != nil {
			rb.BudgetPercent = &typev3.Percent{Value: budget.GetPercent().GetValue()}
		}
		if budget.GetMinRetryConcurrency() > 0 {
			rb.MinRetryConcurrency = wrapperspb.UInt32(budget.GetMinRetryConcurrency())
		}
		t.RetryBudget = rb
	}
	c.CircuitBreakers = &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{t}}
}

// applyHTTPProtocol chooses the upstream protocol: HTTP/2 for HTTP2 and GRPC ports and when
// the pool (or the mesh) upgrades HTTP ports, the client's protocol with useClientProtocol;
// then the HTTP/2 limits.
func applyHTTPProtocol(o *clusterOptions, p model.Port, pool *networking.ConnectionPoolSettings, mesh *meshconfig.MeshConfig) {
	h := pool.GetHttp()
	switch {
	case h.GetUseClientProtocol():
		o.get().UpstreamProtocolOptions = &httpopts.HttpProtocolOptions_UseDownstreamProtocolConfig{UseDownstreamProtocolConfig: &httpopts.HttpProtocolOptions_UseDownstreamHttpConfig{
			HttpProtocolOptions: &core.Http1ProtocolOptions{}, Http2ProtocolOptions: &core.Http2ProtocolOptions{},
		}}
	case p.Protocol.IsHTTP2():
		o.setHTTP2()
	case h.GetH2UpgradePolicy() == networking.ConnectionPoolSettings_HTTPSettings_UPGRADE:
		o.setHTTP2()
	case h.GetH2UpgradePolicy() == networking.ConnectionPoolSettings_HTTPSettings_DO_NOT_UPGRADE:
	case p.Protocol.IsHTTP() && mesh.GetH2UpgradePolicy() == meshconfig.MeshConfig_UPGRADE:
		o.setHTTP2()
	}
	if h2 := o.http2(); h2 != nil {
		if n := h.GetMaxConcurrentStreams(); n > 0 {
			h2.MaxConcurrentStreams = wrapperspb.UInt32(uint32(n))
		}
		if ka := h.GetHttp2KeepAlive(); ka != nil {
			h2.ConnectionKeepalive = &core.KeepaliveSettings{Interval: ka.GetInterval(), Timeout: ka.GetTimeout()}
			if h2.ConnectionKeepalive.Timeout == nil {
				h2.ConnectionKeepalive.Timeout = durationpb.New(20 * time.Second) // Envoy's documented default
			}
		}
	}
}

// applyOutlierDetection is Istio's translation: consecutive 5xx and gateway errors enforced
// at 100%, success-rate ejection off, and the panic threshold set from minHealthPercent (0
// by default: Envoy never balances over ejected hosts).
func applyOutlierDetection(c *cluster.Cluster, od *networking.OutlierDetection) {
	if od == nil {
		return
	}
	out := &cluster.OutlierDetection{EnforcingSuccessRate: wrapperspb.UInt32(0)}
	enforce := func(v uint32) *wrapperspb.UInt32Value {
		if v > 0 {
			v = 100
		}
		return wrapperspb.UInt32(v)
	}
	if e := od.GetConsecutive_5XxErrors(); e != nil {
		out.Consecutive_5Xx, out.EnforcingConsecutive_5Xx = wrapperspb.UInt32(e.GetValue()), enforce(e.GetValue())
	}
	if e := od.GetConsecutiveGatewayErrors(); e != nil {
		out.ConsecutiveGatewayFailure, out.EnforcingConsecutiveGatewayFailure = wrapperspb.UInt32(e.GetValue()), enforce(e.GetValue())
	}
	out.Interval = od.GetInterval()
	out.BaseEjectionTime = od.GetBaseEjectionTime()
	if od.GetMaxEjectionPercent() > 0 {
		out.MaxEjectionPercent = wrapperspb.UInt32(uint32(od.GetMaxEjectionPercent()))
	}
	if od.GetSplitExternalLocalOriginErrors() {
		out.SplitExternalLocalOriginErrors = true
		if n := od.GetConsecutiveLocalOriginFailures().GetValue(); n > 0 {
			out.ConsecutiveLocalOriginFailure = wrapperspb.UInt32(n)
			out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(100)
		}
		out.EnforcingLocalOriginSuccessRate = wrapperspb.UInt32(0)
	}
	c.OutlierDetection = out
	c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: float64(od.GetMinHealthPercent())}
}

// localitySetting is the locality load balancing in force for a policy: the rule's unless it
// is disabled, else the mesh's unless disabled.
func localitySetting(mesh *meshconfig.MeshConfig, lb *networking.LoadBalancerSettings) *networking.LocalityLoadBalancerSetting {
	if l := lb.GetLocalityLbSetting(); l != nil {
		if l.GetEnabled() != nil && !l.GetEnabled().GetValue() {
			return nil
		}
		return l
	}
	l := mesh.GetLocalityLbSetting()
	if l.GetEnabled() != nil && !l.GetEnabled().GetValue() {
		return nil
	}
	return l
}

// applyLoadBalancer sets the algorithm (Istio's default is LEAST_REQUEST), slow start,
// consistent hashing and the cluster side of locality load balancing.
func applyLoadBalancer(c *cluster.Cluster, lb *networking.LoadBalancerSettings, ll *networking.LocalityLoadBalancerSetting, failover bool) {
	if failover && (len(ll.GetFailover()) > 0 || len(ll.GetFailoverPriority()) > 0) || len(ll.GetDistribute()) > 0 {
		c.CommonLbConfig.LocalityConfigSpecifier = &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}
	}
	if c.GetType() == cluster.Cluster_ORIGINAL_DST {
		c.LbPolicy = cluster.Cluster_CLUSTER_PROVIDED
		return
	}
	slow := slowStart(lb)
	switch lb.GetSimple() {
	case networking.LoadBalancerSettings_RANDOM:
		c.LbPolicy = cluster.Cluster_RANDOM
	case networking.LoadBalancerSettings_ROUND_ROBIN:
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
		if slow != nil {
			c.LbConfig = &cluster.Cluster_RoundRobinLbConfig_{RoundRobinLbConfig: &cluster.Cluster_RoundRobinLbConfig{SlowStartConfig: slow}}
		}
	case networking.LoadBalancerSettings_PASSTHROUGH:
		c.LbPolicy = cluster.Cluster_CLUSTER_PROVIDED
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}
		c.EdsClusterConfig, c.LoadAssignment, c.DnsLookupFamily = nil, nil, cluster.Cluster_AUTO
	default: // LEAST_REQUEST, the deprecated LEAST_CONN, and unset
		c.LbPolicy = cluster.Cluster_LEAST_REQUEST
		if slow != nil {
			c.LbConfig = &cluster.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &cluster.Cluster_LeastRequestLbConfig{SlowStartConfig: slow}}
		}
	}
	ch := lb.GetConsistentHash()
	if ch == nil {
		return
	}
	c.LbConfig = nil
	switch {
	case ch.GetMaglev() != nil:
		c.LbPolicy = cluster.Cluster_MAGLEV
		if n := ch.GetMaglev().GetTableSize(); n != 0 {
			c.LbConfig = &cluster.Cluster_MaglevLbConfig_{MaglevLbConfig: &cluster.Cluster_MaglevLbConfig{TableSize: wrapperspb.UInt64(n)}}
		}
	case ch.GetRingHash() != nil:
		c.LbPolicy = cluster.Cluster_RING_HASH
		if n := ch.GetRingHash().GetMinimumRingSize(); n != 0 {
			c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{MinimumRingSize: wrapperspb.UInt64(n)}}
		}
	default:
		size := uint64(1024)                      // Envoy's default, which Istio writes out
		if n := ch.GetMinimumRingSize(); n != 0 { //nolint:staticcheck // the deprecated field still works
			size = n
		}
		c.LbPolicy = cluster.Cluster_RING_HASH
		c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{MinimumRingSize: wrapperspb.UInt64(size)}}
	}
}

func slowStart(lb *networking.LoadBalancerSettings) *cluster.Cluster_SlowStartConfig {
	if w := lb.GetWarmup(); w != nil {
		s := &cluster.Cluster_SlowStartConfig{SlowStartWindow: w.GetDuration()}
		if a := w.GetAggression(); a != nil {
			s.Aggression = &core.RuntimeDouble{DefaultValue: a.GetValue(), RuntimeKey: "upstream.slow_start.aggression"}
		}
		if m := w.GetMinimumPercent(); m != nil {
			s.MinWeightPercent = &typev3.Percent{Value: m.GetValue()}
		}
		return s
	}
	if d := lb.GetWarmupDurationSecs(); d != nil {
		return &cluster.Cluster_SlowStartConfig{SlowStartWindow: d}
	}
	return nil
}

// SDS names Istio's agent serves the workload certificate and the mesh root under, on the
// bootstrap's sds-grpc cluster.
const (
	SDSDefaultResource = "default"
	SDSRootResource    = "ROOTCA"
	SDSCluster         = "sds-grpc"
)

func sdsSecret(name string, initialFetchNone bool) *tlsv3.SdsSecretConfig {
	src := &core.ConfigSource{
		ResourceApiVersion: core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_ApiConfigSource{ApiConfigSource: &core.ApiConfigSource{
			ApiType:                   core.ApiConfigSource_GRPC,
			SetNodeOnFirstMessageOnly: true,
			TransportApiVersion:       core.ApiVersion_V3,
			GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: SDSCluster}}}},
		}},
	}
	if initialFetchNone {
		src.InitialFetchTimeout = durationpb.New(0)
	}
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: src}
}

// ALPN Istio advertises to in-mesh (ISTIO_MUTUAL) peers; "istio-peer-exchange" enables TCP
// metadata exchange.
var (
	alpnInMesh   = []string{"istio-peer-exchange", "istio"}
	alpnInMeshH2 = []string{"istio-peer-exchange", "istio", "h2"}
)

func exactMatchers(names []string) []*matcher.StringMatcher {
	var out []*matcher.StringMatcher
	for _, n := range names {
		out = append(out, &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: n}})
	}
	return out
}

// upstreamTLS builds the TLS transport socket of a policy the way Istio does: ISTIO_MUTUAL
// uses the workload certificate and mesh root from SDS with the cluster name as SNI; SIMPLE
// and MUTUAL read files through the agent's SDS ("file-root:", "file-cert:") with SNI and SAN
// validation from the request when none are configured; DISABLE has none.
func upstreamTLS(c *cluster.Cluster, o *clusterOptions, t *networking.ClientTLSSettings, http2 bool) {
	if t == nil || t.GetMode() == networking.ClientTLSSettings_DISABLE {
		return
	}
	ctx := &tlsv3.UpstreamTlsContext{
		CommonTlsContext: &tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
			TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
			TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
		}},
		Sni: t.GetSni(),
	}
	common := ctx.CommonTlsContext
	switch t.GetMode() {
	case networking.ClientTLSSettings_ISTIO_MUTUAL:
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret(SDSDefaultResource, true)}
		common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchSubjectAltNames: exactMatchers(t.GetSubjectAltNames())},
			ValidationContextSdsSecretConfig: sdsSecret(SDSRootResource, true),
		}}
		if ctx.Sni == "" {
			ctx.Sni = c.GetName()
		}
		common.AlpnProtocols = alpnInMesh
		if http2 {
			common.AlpnProtocols = alpnInMeshH2
		}
	case networking.ClientTLSSettings_SIMPLE, networking.ClientTLSSettings_MUTUAL:
		if t.GetSni() == "" || len(t.GetSubjectAltNames()) == 0 {
			up := o.get()
			if up.UpstreamHttpProtocolOptions == nil {
				up.UpstreamHttpProtocolOptions = &core.UpstreamHttpProtocolOptions{}
			}
			if t.GetSni() == "" {
				up.UpstreamHttpProtocolOptions.AutoSni = true
			}
			if t.GetSni() == "" && len(t.GetSubjectAltNames()) == 0 && !t.GetInsecureSkipVerify().GetValue() {
				up.UpstreamHttpProtocolOptions.AutoSanValidation = true
			}
		}
		if t.GetMode() == networking.ClientTLSSettings_MUTUAL {
			common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret("file-cert:"+t.GetClientCertificate()+"~"+t.GetPrivateKey(), false)}
		}
		ca := t.GetCaCertificates()
		if ca == "" {
			ca = "system"
		}
		if t.GetInsecureSkipVerify().GetValue() {
			common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{}
		} else {
			vc := &tlsv3.CertificateValidationContext{MatchSubjectAltNames: exactMatchers(t.GetSubjectAltNames())}
			if t.GetCaCrl() != "" {
				vc.Crl = &core.DataSource{Specifier: &core.DataSource_Filename{Filename: t.GetCaCrl()}}
			}
			common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         vc,
				ValidationContextSdsSecretConfig: sdsSecret("file-root:"+ca, false),
			}}
		}
		if http2 {
			common.AlpnProtocols = []string{"h2"}
		}
	}
	c.TransportSocket = &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
}

// upstreamProxyProtocol wraps the cluster's transport (TLS or plain) in a PROXY protocol
// header.
func upstreamProxyProtocol(c *cluster.Cluster, pp *networking.TrafficPolicy_ProxyProtocol) {
	if pp == nil {
		return
	}
	inner := c.TransportSocket
	if inner == nil {
		inner = &core.TransportSocket{Name: "envoy.transport_sockets.raw_buffer", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbuffer.RawBuffer{})}}
	}
	c.TransportSocket = &core.TransportSocket{
		Name: "envoy.transport_sockets.upstream_proxy_protocol",
		ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&proxyprotocol.ProxyProtocolUpstreamTransport{
			Config:          &core.ProxyProtocolConfig{Version: core.ProxyProtocolConfig_Version(pp.GetVersion())},
			TransportSocket: inner,
		})},
	}
}

// ---- locality ----

func parseLocalityString(s string) (region, zone, subzone string) {
	parts := strings.SplitN(s, "/", 3)
	region = parts[0]
	if len(parts) > 1 {
		zone = parts[1]
	}
	if len(parts) > 2 {
		subzone = parts[2]
	}
	return
}

// localityMatches reports whether an endpoint locality is covered by a pattern such as
// "us-east/*" or "us-east/zone1/*".
func localityMatches(l *core.Locality, pattern string) bool {
	if pattern == "*" {
		return true
	}
	r, z, sz := parseLocalityString(pattern)
	if r != "*" && r != l.GetRegion() {
		return false
	}
	if z == "" || z == "*" {
		return true
	}
	if z != l.GetZone() {
		return false
	}
	return sz == "" || sz == "*" || sz == l.GetSubZone()
}

// lbPriority ranks an endpoint locality against the client's: 0 same subzone, 1 same zone, 2
// same region, 3 elsewhere.
func lbPriority(proxy, ep *core.Locality) int {
	switch {
	case proxy.GetRegion() == ep.GetRegion() && proxy.GetZone() == ep.GetZone() && proxy.GetSubZone() == ep.GetSubZone():
		return 0
	case proxy.GetRegion() == ep.GetRegion() && proxy.GetZone() == ep.GetZone():
		return 1
	case proxy.GetRegion() == ep.GetRegion():
		return 2
	}
	return 3
}

// applyLocality weighs or prioritises a cluster's endpoints for a client in locality:
// distribute sets locality weights (localities not listed for the client's get no traffic);
// otherwise, when failover is on (outlier detection is configured), endpoints get
// priorities by proximity, failoverPriority labels first, then the failover regions.
func applyLocality(cla *endpoint.ClusterLoadAssignment, eps map[*endpoint.LbEndpoint]*model.Endpoint, locality *core.Locality, proxyLabels map[string]string, ll *networking.LocalityLoadBalancerSetting, failover bool) {
	if ll == nil {
		return
	}
	if len(ll.GetDistribute()) > 0 {
		applyLocalityWeights(cla, locality, ll.GetDistribute())
		return
	}
	if !failover {
		return
	}
	if len(ll.GetFailoverPriority()) > 0 {
		applyFailoverPriorities(cla, eps, proxyLabels, locality, ll.GetFailoverPriority())
		if len(ll.GetFailover()) == 0 {
			return
		}
	}
	applyLocalityFailover(cla, locality, ll.GetFailover())
}

func applyLocalityWeights(cla *endpoint.ClusterLoadAssignment, locality *core.Locality, distribute []*networking.LocalityLoadBalancerSetting_Distribute) {
	for _, d := range distribute {
		if !localityMatches(locality, d.GetFrom()) {
			continue
		}
		unmatched := map[int]bool{}
		for i := range cla.Endpoints {
			unmatched[i] = true
		}
		for _, to := range slices.Sorted(maps.Keys(d.GetTo())) {
			weight := d.GetTo()[to]
			orig := map[int]uint32{}
			var total uint32
			for i, le := range cla.Endpoints {
				if unmatched[i] && localityMatches(le.GetLocality(), to) {
					delete(unmatched, i)
					w := le.GetLoadBalancingWeight().GetValue()
					if w == 0 {
						w = 1
					}
					orig[i] = w
					total += w
				}
			}
			// A pattern covering several localities shares its weight in proportion.
			for i, w := range orig {
				if share := float64(w*weight) / float64(total); share > 0 {
					cla.Endpoints[i].LoadBalancingWeight = wrapperspb.UInt32(uint32(math.Ceil(share)))
				}
			}
		}
		for i := range unmatched {
			cla.Endpoints[i].LbEndpoints = nil
		}
		return
	}
}

func applyLocalityFailover(cla *endpoint.ClusterLoadAssignment, locality *core.Locality, failover []*networking.LocalityLoadBalancerSetting_Failover) {
	byPriority := map[int][]int{}
	for i, le := range cla.Endpoints {
		p := lbPriority(locality, le.GetLocality())
		if p == 3 {
			for _, f := range failover {
				if f.GetFrom() == locality.GetRegion() {
					if le.GetLocality().GetRegion() != f.GetTo() {
						p = 4
					}
					break
				}
			}
		}
		p += int(le.Priority) * 5 // keep priorities failoverPriority assigned
		le.Priority = uint32(p)
		byPriority[p] = append(byPriority[p], i)
	}
	renumber(cla, byPriority)
}

// renumber makes priorities consecutive from 0, as Envoy requires.
func renumber(cla *endpoint.ClusterLoadAssignment, byPriority map[int][]int) {
	ps := make([]int, 0, len(byPriority))
	for p := range byPriority {
		ps = append(ps, p)
	}
	sort.Ints(ps)
	for i, p := range ps {
		for _, idx := range byPriority[p] {
			cla.Endpoints[idx].Priority = uint32(i)
		}
	}
}

// applyFailoverPriorities splits each locality's endpoints by how many of the labels (in
// order) they share with the client: all of them is priority 0.
func applyFailoverPriorities(cla *endpoint.ClusterLoadAssignment, eps map[*endpoint.LbEndpoint]*model.Endpoint, proxyLabels map[string]string, proxyLocality *core.Locality, labels []string) {
	names := make([]string, len(labels))
	override := map[string]string{}
	for i, l := range labels {
		name, value, ok := strings.Cut(l, "=")
		names[i] = name
		if ok {
			override[name] = value
		}
	}
	var out []*endpoint.LocalityLbEndpoints
	for _, le := range cla.Endpoints {
		groups := map[int][]*endpoint.LbEndpoint{}
		for _, lb := range le.LbEndpoints {
			p := 0
			ep := eps[lb]
			for j, name := range names {
				want, ok := override[name]
				if !ok {
					want = topologyLabel(proxyLabels, proxyLocality, name)
				}
				if ep == nil || topologyLabel(ep.Labels, le.GetLocality(), name) != want {
					p = len(names) - j
					break
				}
			}
			groups[p] = append(groups[p], lb)
		}
		for _, p := range sortedIntKeys(groups) {
			n := &endpoint.LocalityLbEndpoints{Locality: le.Locality, Priority: uint32(p), LbEndpoints: groups[p]}
			var w uint32
			for _, lb := range groups[p] {
				w += lb.GetLoadBalancingWeight().GetValue()
			}
			n.LoadBalancingWeight = wrapperspb.UInt32(w)
			out = append(out, n)
		}
	}
	cla.Endpoints = out
	byPriority := map[int][]int{}
	for i, le := range out {
		byPriority[int(le.Priority)] = append(byPriority[int(le.Priority)], i)
	}
	renumber(cla, byPriority)
}

// Topology labels Istio adds to workloads from their locality, so failoverPriority can name
// them whether or not the workload carries them.
const (
	labelRegion  = "topology.kubernetes.io/region"
	labelZone    = "topology.kubernetes.io/zone"
	labelSubzone = "topology.istio.io/subzone"
)

func topologyLabel(labels map[string]string, l *core.Locality, name string) string {
	if v, ok := labels[name]; ok {
		return v
	}
	switch name {
	case labelRegion:
		return l.GetRegion()
	case labelZone:
		return l.GetZone()
	case labelSubzone:
		return l.GetSubZone()
	}
	return ""
}

func sortedIntKeys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
