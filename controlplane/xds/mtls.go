package xds

import (
	"fmt"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rawbuffer "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// Mutual TLS between workloads (issue 27), generated only when the snapshot's MTLS option
// is on; shapes and names are Istio's (pilot/pkg/networking/core/filterchain_options.go,
// listener.go, cluster_tls.go; pilot/pkg/security/authn/utils).

// Transport protocols the TLS inspector detects, and the socket names.
const (
	transportTLS       = "tls"
	transportRawBuffer = "raw_buffer"
	tlsTransportSocket = "envoy.transport_sockets.tls"
	rawTransportSocket = "envoy.transport_sockets.raw_buffer"
	// TLSModeLabel marks a workload that has a sidecar accepting Istio mTLS (the injector
	// sets it to "istio"); its endpoints carry it as transport socket match metadata.
	TLSModeLabel = "security.istio.io/tlsMode"
	// transportSocketMatchKey is the endpoint metadata filter Envoy matches
	// transport_socket_matches against.
	transportSocketMatchKey = "envoy.transport_socket_match"
)

var (
	// Server side, PERMISSIVE: what a sidecar client offers (any Istio ALPN) tells its
	// mTLS apart from an application's own TLS.
	alpnAllIstioMTLS = []string{"istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"}
	// Negotiated by the server: the underlying protocol, never "istio" (it would take the
	// place of h2); TCP adds the metadata exchange protocol.
	alpnDownstreamHTTP = []string{"h2", "http/1.1"}
	alpnDownstreamTCP  = []string{"istio-peer-exchange", "h2", "http/1.1"}
	// Istio's sidecar cipher suites for TLS 1.2 (TLS 1.3 suites are not configurable).
	meshCipherSuites = []string{
		"ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
		"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
		"AES256-GCM-SHA384", "AES128-GCM-SHA256",
	}
)

func mtlsOn(v *View) bool { return v.Snapshot.Options.MTLS }

// peerModes is the proxy's own PeerAuthentication.
func peerModes(v *View) PeerModes {
	return PeerAuthenticationFor(v.Snapshot, v.Proxy.Namespace, v.Proxy.Labels)
}

// tlsInspector is the listener filter that sets the transport protocol and ALPN filter
// chains match on.
func tlsInspector() *listener.ListenerFilter {
	return &listener.ListenerFilter{
		Name:       wellknown.TlsInspector,
		ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})},
	}
}

// inboundFilterChains are the filter chains of an inbound port: one without the MTLS
// option, those of the port's PeerAuthentication mode with it. destPort is the match of
// virtualInbound's chains (nil on a listener of the port's own).
func inboundFilterChains(v *View, in Inbound, destPort *wrapperspb.UInt32Value) []*listener.FilterChain {
	name := InboundClusterName(in.Port)
	filters := inboundFilters(v, in)
	if !mtlsOn(v) {
		var match *listener.FilterChainMatch
		if destPort != nil {
			match = &listener.FilterChainMatch{DestinationPort: destPort}
		}
		return []*listener.FilterChain{{Name: name, FilterChainMatch: match, Filters: filters}}
	}
	return inboundChains(v, peerModes(v).Port(in.Port), in.Protocol.IsHTTP(), name, destPort, filters)
}

// inboundPassthroughChains take virtualInbound's connections to ports no service declares,
// in the workload's mode (Istio's inbound passthrough chains): under STRICT a plaintext
// client reaches no port at all, and the workload's AuthorizationPolicies apply there too
// (Istio's buildInboundPassthroughChains builds them with the network RBAC filters).
func inboundPassthroughChains(v *View) []*listener.FilterChain {
	filters := append(authzNetworkFilters(v), tcpProxy(InboundPassthroughCluster, InboundPassthroughCluster))
	if !mtlsOn(v) {
		return []*listener.FilterChain{{Name: InboundPassthroughCluster, Filters: filters}}
	}
	return inboundChains(v, peerModes(v).Mode, false, InboundPassthroughCluster, nil, filters)
}

// inboundChains are the filter chains of one inbound port (or of the passthrough, port 0)
// in mode: STRICT, a TLS chain only (a plaintext client matches none and is closed);
// PERMISSIVE, mTLS chosen by Istio's ALPN, then for TCP the application's own TLS passed
// through, then plaintext; DISABLE, plaintext.
func inboundChains(v *View, mode MTLSMode, http bool, name string, destPort *wrapperspb.UInt32Value, filters []*listener.Filter) []*listener.FilterChain {
	chain := func(transport string, alpn []string, tls bool) *listener.FilterChain {
		fc := &listener.FilterChain{
			Name:             name,
			FilterChainMatch: &listener.FilterChainMatch{DestinationPort: destPort, TransportProtocol: transport, ApplicationProtocols: alpn},
			Filters:          filters,
		}
		if tls {
			fc.TransportSocket = &core.TransportSocket{Name: tlsTransportSocket, ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(inboundTLSContext(v, http))}}
		}
		return fc
	}
	switch mode {
	case MTLSStrict:
		return []*listener.FilterChain{chain(transportTLS, nil, true)}
	case MTLSPermissive:
		out := []*listener.FilterChain{chain(transportTLS, alpnAllIstioMTLS, true)}
		if !http {
			out = append(out, chain(transportTLS, nil, false))
		}
		return append(out, chain(transportRawBuffer, nil, false))
	}
	return []*listener.FilterChain{chain(transportRawBuffer, nil, false)}
}

// inboundTLSContext is the server side of Istio mTLS: the workload certificate ("default")
// and the mesh root ("ROOTCA") from the agent's SDS, a client certificate required, TLS 1.2
// or later; MeshConfig.meshMTLS may raise the minimum to 1.3 and replace the cipher suites,
// as Istio applies it to sidecars' inbound mTLS.
func inboundTLSContext(v *View, http bool) *tlsv3.DownstreamTlsContext {
	alpn := alpnDownstreamTCP
	if http {
		alpn = alpnDownstreamHTTP
	}
	params := &tlsv3.TlsParameters{
		TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
		TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
		CipherSuites:              meshCipherSuites,
	}
	if mm := v.Snapshot.Mesh.GetMeshMTLS(); mm != nil {
		if mm.GetMinProtocolVersion() == meshconfig.MeshConfig_TLSConfig_TLSV1_3 {
			params.TlsMinimumProtocolVersion = tlsv3.TlsParameters_TLSv1_3
		}
		if len(mm.GetCipherSuites()) > 0 {
			params.CipherSuites = mm.GetCipherSuites()
		}
	}
	return &tlsv3.DownstreamTlsContext{
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsParams:                      params,
			AlpnProtocols:                  alpn,
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret(SDSDefaultResource, true)},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext:         &tlsv3.CertificateValidationContext{},
				ValidationContextSdsSecretConfig: sdsSecret(SDSRootResource, true),
			}},
		},
	}
}

// forwardClientCert is Istio's default for a sidecar's inbound HTTP (ProxyHeaders): the
// x-forwarded-client-cert header is appended to and forwarded, with the peer certificate's
// subject, URI SANs (the SPIFFE identity) and DNS SANs.
func forwardClientCert(m *hcm.HttpConnectionManager) {
	m.ForwardClientCertDetails = hcm.HttpConnectionManager_APPEND_FORWARD
	m.SetCurrentClientCertDetails = &hcm.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Uri: true, Dns: true}
}

// SNIFor is Istio's SNI of an in-mesh cluster: outbound_.<port>_.<subset>_.<host>.
func SNIFor(port uint32, subset, host string) string {
	return fmt.Sprintf("outbound_.%d_.%s_.%s", port, subset, host)
}

// SpiffeID is the identity of a service account: spiffe://<trust domain>/ns/<ns>/sa/<sa>.
func SpiffeID(trustDomain, ns, sa string) string {
	if trustDomain == "" {
		trustDomain = "cluster.local"
	}
	return "spiffe://" + trustDomain + "/ns/" + ns + "/sa/" + sa
}

// serviceIdentities are the identities a client accepts from the service's endpoints: the
// SPIFFE identity of each endpoint's service account and the ServiceEntry's
// subjectAltNames, sorted (Istio's PushContext.ServiceAccounts).
func serviceIdentities(v *View, svc *model.Service) []string {
	var out []string
	for _, ep := range v.Snapshot.Endpoints(svc.Hostname) {
		if ep.ServiceAccount == "" {
			continue
		}
		ns := ep.Namespace
		if ns == "" {
			ns = svc.Namespace
		}
		out = append(out, SpiffeID(v.Snapshot.Mesh.GetTrustDomain(), ns, ep.ServiceAccount))
	}
	for _, c := range v.Snapshot.Configs.Namespace(config.ServiceEntry, svc.Namespace) {
		if se := c.Spec.(*networking.ServiceEntry); c.Name == svc.Name && slices.Contains(se.GetHosts(), svc.Hostname) {
			out = append(out, se.GetSubjectAltNames()...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// IdentitiesChanged reports whether the service accounts of host's endpoints in reg differ
// from those snap holds.
func IdentitiesChanged(snap *push.Snapshot, reg registry.Registry, host string) bool {
	return !slices.Equal(accounts(snap.Endpoints(host)), accounts(reg.Endpoints(host)))
}

func accounts(eps []*model.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		if ep.ServiceAccount != "" {
			out = append(out, ep.Namespace+"/"+ep.ServiceAccount)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// serviceMTLSMode is what the destination's workloads accept on a service port, inferred as
// Istio's BestEffortInferServiceMTLSMode does: none outside the mesh, else the
// PeerAuthentication of a workload the service selects, at the port's target port.
func serviceMTLSMode(v *View, svc *model.Service, p model.Port) MTLSMode {
	if svc.MeshExternal {
		return MTLSDisable
	}
	target := p.Port
	if p.TargetPort != 0 {
		target = p.TargetPort
	}
	return PeerAuthenticationFor(v.Snapshot, svc.Namespace, svc.WorkloadSelector).Port(target)
}

// applyUpstreamTLS sets the cluster's TLS. Without the MTLS option it is the
// DestinationRule's tls only, as before. With it, Istio's buildUpstreamTLSSettings:
// ISTIO_MUTUAL defaults its SNI to SNIFor and its SANs to the service's identities; no TLS
// setting, auto mTLS on, and a destination that does not DISABLE mTLS get mTLS for the
// endpoints labelled tlsMode istio and plaintext for the others (transport_socket_matches).
func applyUpstreamTLS(v *View, c *cluster.Cluster, opts *clusterOptions, svc *model.Service, p model.Port, sub *networking.Subset, tp *networking.TrafficPolicy) {
	t := tp.GetTls()
	http2 := opts.http2() != nil
	if !mtlsOn(v) {
		upstreamTLS(c, opts, t, http2)
		return
	}
	if t.GetMode() == networking.ClientTLSSettings_ISTIO_MUTUAL {
		istio := &networking.ClientTLSSettings{Mode: t.GetMode(), Sni: t.GetSni(), SubjectAltNames: t.GetSubjectAltNames()}
		if istio.Sni == "" {
			istio.Sni = SNIFor(p.Port, sub.GetName(), svc.Hostname)
		}
		if len(istio.SubjectAltNames) == 0 {
			istio.SubjectAltNames = serviceIdentities(v, svc)
		}
		upstreamTLS(c, opts, istio, http2)
		return
	}
	if t != nil || !autoMTLS(v) || svc.Resolution == model.Passthrough || serviceMTLSMode(v, svc, p) == MTLSDisable {
		upstreamTLS(c, opts, t, http2)
		return
	}
	upstreamTLS(c, opts, &networking.ClientTLSSettings{
		Mode: networking.ClientTLSSettings_ISTIO_MUTUAL, Sni: SNIFor(p.Port, sub.GetName(), svc.Hostname), SubjectAltNames: serviceIdentities(v, svc),
	}, http2)
	c.TransportSocketMatches = []*cluster.Cluster_TransportSocketMatch{
		{
			Name:            "tlsMode-istio",
			Match:           &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}},
			TransportSocket: c.TransportSocket,
		},
		{
			Name:            "tlsMode-disabled",
			Match:           &structpb.Struct{},
			TransportSocket: &core.TransportSocket{Name: rawTransportSocket, ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbuffer.RawBuffer{})}},
		},
	}
	c.TransportSocket = nil
}

// autoMTLS is MeshConfig.enableAutoMtls, true unless set false.
func autoMTLS(v *View) bool {
	e := v.Snapshot.Mesh.GetEnableAutoMtls()
	return e == nil || e.GetValue()
}

// markTLSMode gives each endpoint of a workload labelled tlsMode the transport socket
// match metadata auto mTLS selects on (Istio's util.AppendLbEndpointMetadata).
func markTLSMode(origin map[*endpoint.LbEndpoint]*model.Endpoint) {
	for lb, ep := range origin {
		mode := ep.Labels[TLSModeLabel]
		if mode == "" || mode == "disabled" {
			continue
		}
		lb.Metadata = &core.Metadata{FilterMetadata: map[string]*structpb.Struct{
			transportSocketMatchKey: {Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue(mode)}},
		}}
	}
}
