package pusher_test

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// s00 is the ServiceEntry of hostS00 with one endpoint, its labels and service account.
func s00(labels, sa string) string {
	return `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s00, namespace: demo}
spec: {hosts: [s00.demo.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}],
  endpoints: [{address: 10.0.0.1, labels: ` + labels + `, serviceAccount: "` + sa + `"}]}
`
}

// sans are the SANs the proxy's cluster of s00 accepts under auto mTLS.
func sans(t *testing.T, w interface {
	Resources(string, *xds.Snapshot) (*xds.Resources, string)
}) []string {
	t.Helper()
	cds, _ := w.Resources(xds.ClusterType, nil)
	r := cds.Find(clusterS00)
	require.NotNil(t, r)
	m := r.Message.(*cluster.Cluster).GetTransportSocketMatches()
	require.NotEmpty(t, m, "auto mTLS")
	var ctx tlsv3.UpstreamTlsContext
	require.NoError(t, m[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(&ctx))
	var out []string
	for _, s := range ctx.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchSubjectAltNames() {
		out = append(out, s.GetExact())
	}
	return out
}

// With mTLS, an endpoints change reaches the proxies as Istio's does: a tlsMode label that
// comes or goes is an endpoints-only push (the EDS metadata auto mTLS selects on); a
// service account that changes is a full push, for the cluster's SANs; a PeerAuthentication
// is a config change that reaches every proxy and changes its inbound chains.
func TestMTLSChangesReachTheProxies(t *testing.T) {
	p, st := meshPusher(t, push.Options{MTLS: true})
	rec := &recorder{}
	w := p.Watch(proxyIn(t, "demo", "demo-1"), rec)
	w.Subscribe(xds.EndpointType, false, []string{clusterS00})

	keys := st.set(t, s00(`{app: s00}`, ""))
	update(t, p, withHosts(push.NewFull(push.ReasonConfig, keys...), hostS00))
	assert.Empty(t, sans(t, w), "no identity known")

	st.set(t, s00(`{app: s00, security.istio.io/tlsMode: istio}`, ""))
	update(t, p, push.NewEDS(map[string]struct{}{hostS00: {}}))
	got := rec.got()
	require.NotEmpty(t, got)
	assert.False(t, got[len(got)-1].Full(), "a label change is endpoints only")
	eds, _ := w.Resources(xds.EndpointType, nil)
	cla := eds.Find(clusterS00).Message.(*endpoint.ClusterLoadAssignment)
	md := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"]
	assert.Equal(t, "istio", md.GetFields()["tlsMode"].GetStringValue())
	assert.Empty(t, sans(t, w))

	st.set(t, s00(`{app: s00, security.istio.io/tlsMode: istio}`, "s00"))
	update(t, p, push.NewEDS(map[string]struct{}{hostS00: {}}))
	got = rec.got()
	assert.True(t, got[len(got)-1].Full(), "a service account change needs CDS")
	assert.Equal(t, []string{"spiffe://cluster.local/ns/demo/sa/s00"}, sans(t, w))

	keys = st.set(t, `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
`)
	n := len(rec.got())
	update(t, p, push.NewFull(push.ReasonConfig, keys...))
	require.Len(t, rec.got(), n+1)
	lds, _ := w.Resources(xds.ListenerType, nil)
	vi := lds.Find(xds.VirtualInboundListener).Message.(*listener.Listener)
	for _, fc := range vi.GetFilterChains() {
		assert.Equal(t, "tls", fc.GetFilterChainMatch().GetTransportProtocol(), "STRICT: %s takes TLS only", fc.GetName())
		assert.NotNil(t, fc.GetTransportSocket(), fc.GetName())
	}
}
