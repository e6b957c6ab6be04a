package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	filev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	agentsds "github.com/wasmesh/wasmesh/agent/sds"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/controlplane/ca"
)

// spiffe is a test workload's identity.
func spiffe(sa string) string { return "spiffe://cluster.local/ns/default/sa/" + sa }

// pki is a real CA (controlplane/ca) issuing workload certificates.
type pki struct {
	ca    *ca.Authority
	roots []byte
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	a, err := ca.NewSelfSigned(time.Now())
	require.NoError(t, err)
	var roots []byte
	for _, p := range a.ChainPEMs() {
		roots = append(roots, p...)
	}
	return &pki{ca: a, roots: roots}
}

// bundle issues a certificate for sa, valid from now-1m to now+ttl.
func (p *pki) bundle(t testing.TB, sa string, now time.Time, ttl time.Duration) *workloadcert.Bundle {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	id, err := url.Parse(spiffe(sa))
	require.NoError(t, err)
	chain, err := p.ca.SignWorkload(&key.PublicKey, id, ttl, now)
	require.NoError(t, err)
	keyPEM, err := ca.PEMKey(key)
	require.NoError(t, err)
	b, err := workloadcert.NewBundle(chain, keyPEM, p.roots)
	require.NoError(t, err)
	return b
}

// startSDS runs the agent's SDS server on a Unix socket; b may be nil (no certificate yet).
func startSDS(t testing.TB, b *workloadcert.Bundle) (*agentsds.Server, string) {
	t.Helper()
	s, err := agentsds.New(nil, nil)
	require.NoError(t, err)
	if b != nil {
		require.NoError(t, s.Update(b))
	}
	path := filepath.Join(t.TempDir(), "sds")
	lis, err := agentsds.Listen(path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, path
}

// sdsBootstrap is adsBootstrap with the agent's sds-grpc pipe cluster.
func sdsBootstrap(cpAddr, sdsPath string) string {
	return adsBootstrap(cpAddr, false) + `
  - name: sds-grpc
    type: STATIC
    connect_timeout: 1s` + h2ProtocolOptions + `
    load_assignment:
      cluster_name: sds-grpc
      endpoints: [{lb_endpoints: [{endpoint: {address: {pipe: {path: "` + sdsPath + `"}}}}]}]
`
}

func sdsSecret(name string, fetchTimeout time.Duration) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
		InitialFetchTimeout: durationpb.New(fetchTimeout),
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"}}}}}}}}
}

// meshTLS is Istio's common TLS context: the workload certificate and the root CA over SDS,
// the peer's SAN checked when sans are given.
func meshTLS(alpn []string, sans ...string) *tlsv3.CommonTlsContext {
	var ms []*tlsv3.SubjectAltNameMatcher
	for _, s := range sans {
		ms = append(ms, &tlsv3.SubjectAltNameMatcher{SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}})
	}
	return &tlsv3.CommonTlsContext{
		AlpnProtocols:                  alpn,
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret("default", 0)},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext:         &tlsv3.CertificateValidationContext{MatchTypedSubjectAltNames: ms},
			ValidationContextSdsSecretConfig: sdsSecret("ROOTCA", 0)}},
	}
}

func transportSocket(t testing.TB, m proto.Message) *corev3.TransportSocket {
	t.Helper()
	a, err := anypb.New(m)
	require.NoError(t, err)
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}
}

// hcmFilter is an HTTP connection manager with RDS routes and the given XFCC handling.
func hcmFilter(t testing.TB, stat, routeName string, xfcc hcmv3.HttpConnectionManager_ForwardClientCertDetails) *listenerv3.Filter {
	t.Helper()
	router, err := anypb.New(&routerv3.Router{})
	require.NoError(t, err)
	m := &hcmv3.HttpConnectionManager{StatPrefix: stat, ForwardClientCertDetails: xfcc,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: routeName,
			ConfigSource: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	}
	if xfcc == hcmv3.HttpConnectionManager_APPEND_FORWARD || xfcc == hcmv3.HttpConnectionManager_SANITIZE_SET {
		m.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
			Subject: wrapperspb.Bool(true), Uri: true, Dns: true}
	}
	a, err := anypb.New(m)
	require.NoError(t, err)
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}
}

// inboundListener is an Istio-like inbound listener: the TLS inspector, a chain for TLS
// (mutual TLS required, the mesh's ALPN) and, when permissive, one for plaintext.
func inboundListener(t testing.TB, name, routeName string, permissive bool) *listenerv3.Listener {
	t.Helper()
	insp, err := anypb.New(&tlsinspv3.TlsInspector{})
	require.NoError(t, err)
	dtc := &tlsv3.DownstreamTlsContext{RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: meshTLS([]string{"h2", "http/1.1"})}
	l := &listenerv3.Listener{Name: name, StatPrefix: name, TrafficDirection: corev3.TrafficDirection_INBOUND,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}},
		ListenerFilters: []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: insp}}},
		FilterChains: []*listenerv3.FilterChain{{Name: "mtls",
			FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "tls"},
			TransportSocket:  transportSocket(t, dtc),
			Filters:          []*listenerv3.Filter{hcmFilter(t, name, routeName, hcmv3.HttpConnectionManager_APPEND_FORWARD)}}},
	}
	if permissive {
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{Name: "plaintext",
			FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer"},
			Filters:          []*listenerv3.Filter{hcmFilter(t, name+"_plain", routeName, hcmv3.HttpConnectionManager_SANITIZE)}})
	}
	require.NoError(t, l.ValidateAll())
	return l
}

// istioEndpoints are endpoints labelled for Istio's auto mTLS ({tlsMode: istio}).
func istioEndpoints(name string, addrs ...string) *endpointv3.ClusterLoadAssignment {
	cla := endpoints(name, addrs...)
	for _, lb := range cla.GetEndpoints()[0].GetLbEndpoints() {
		lb.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.transport_socket_match": {Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}}}}
	}
	return cla
}

// clientCert is the tls.Certificate of a bundle, for Go clients playing a peer.
func clientCert(b *workloadcert.Bundle) []tls.Certificate { return []tls.Certificate{*b.TLS} }

// withAccessLog adds a stdout access log with the given text format to the connection
// manager of every filter chain of l.
func withAccessLog(t *testing.T, l *listenerv3.Listener, format string) *listenerv3.Listener {
	t.Helper()
	fal, err := anypb.New(&filev3.FileAccessLog{Path: "/dev/stdout", AccessLogFormat: &filev3.FileAccessLog_LogFormat{
		LogFormat: &corev3.SubstitutionFormatString{Format: &corev3.SubstitutionFormatString_TextFormatSource{
			TextFormatSource: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: format + "\n"}}}}}})
	require.NoError(t, err)
	for _, fc := range l.GetFilterChains() {
		f := fc.GetFilters()[0]
		m := &hcmv3.HttpConnectionManager{}
		require.NoError(t, f.GetTypedConfig().UnmarshalTo(m))
		m.AccessLog = append(m.AccessLog, &accesslogv3.AccessLog{Name: "envoy.access_loggers.file",
			ConfigType: &accesslogv3.AccessLog_TypedConfig{TypedConfig: fal}})
		a, err := anypb.New(m)
		require.NoError(t, err)
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
	}
	return l
}

// squash drops the white space of a JSON document (protojson varies it on purpose).
func squash(s string) string {
	return strings.Join(strings.Fields(s), "")
}

// tcpListener is an outbound listener on 127.0.0.1:0 whose tcp_proxy sends to cluster.
func tcpListener(t testing.TB, name, cluster string) *listenerv3.Listener {
	t.Helper()
	a, err := anypb.New(&tcpv3.TcpProxy{StatPrefix: name, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})
	require.NoError(t, err)
	return &listenerv3.Listener{Name: name, TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 0}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.tcp_proxy",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}}}}}
}
