package xds_test

import (
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// The policies of a mesh whose root namespace is "mesh-root" (MeshConfig.rootNamespace):
// a mesh-wide STRICT there, a workload policy there that only selects workloads of the root
// namespace, "open" PERMISSIVE for its namespace with a workload policy whose own mode is
// UNSET, and "plain" with a namespace policy of UNSET mode (inheriting the mesh's).
const peerPolicies = `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: mesh, namespace: mesh-root}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: gateway, namespace: mesh-root}
spec: {selector: {matchLabels: {app: gw}}, mtls: {mode: DISABLE}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: ns, namespace: open}
spec: {mtls: {mode: PERMISSIVE}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: db, namespace: open}
spec: {selector: {matchLabels: {app: db}}, portLevelMtls: {5432: {mode: DISABLE}, 5433: {mode: UNSET}}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: ns, namespace: plain}
spec: {}
`

func TestPeerAuthenticationLevels(t *testing.T) {
	snap := snapshotOf(t, peerPolicies)
	snap.Mesh.RootNamespace = "mesh-root"
	cases := []struct {
		name   string
		ns     string
		labels map[string]string
		port   uint32
		want   xds.MTLSMode
	}{
		{"the mesh's", "elsewhere", map[string]string{"app": "gw"}, 80, xds.MTLSStrict},
		{"a root namespace selector selects there", "mesh-root", map[string]string{"app": "gw"}, 80, xds.MTLSDisable},
		{"the namespace's over the mesh's", "open", map[string]string{"app": "web"}, 80, xds.MTLSPermissive},
		{"a workload's UNSET inherits the namespace's", "open", map[string]string{"app": "db"}, 80, xds.MTLSPermissive},
		{"a port level mode", "open", map[string]string{"app": "db"}, 5432, xds.MTLSDisable},
		{"a port level UNSET inherits", "open", map[string]string{"app": "db"}, 5433, xds.MTLSPermissive},
		{"a namespace's UNSET inherits the mesh's", "plain", nil, 80, xds.MTLSStrict},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, xds.PeerAuthenticationFor(snap, tc.ns, tc.labels).Port(tc.port))
		})
	}
	snap.Mesh.RootNamespace = "other-root"
	assert.Equal(t, xds.MTLSPermissive, xds.PeerAuthenticationFor(snap, "elsewhere", nil).Mode, "nothing set anywhere")
}

// Of two policies at one level the oldest counts (creationTimestamp), whatever their names;
// without timestamps, the first by name.
func TestPeerAuthenticationOldestWins(t *testing.T) {
	policy := func(name, created, mode string) string {
		return "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: " + name + ", namespace: shop" + created +
			"}\nspec: {selector: {matchLabels: {app: web}}, mtls: {mode: " + mode + "}}\n"
	}
	web := map[string]string{"app": "web"}
	snap := snapshotOf(t, policy("a-newer", ", creationTimestamp: 2026-01-02T00:00:00Z", "STRICT")+policy("b-older", ", creationTimestamp: 2020-01-02T00:00:00Z", "DISABLE"))
	m := xds.PeerAuthenticationFor(snap, "shop", web)
	assert.Equal(t, xds.MTLSDisable, m.Mode)
	assert.Equal(t, []string{"shop/b-older"}, m.Policies)
	snap = snapshotOf(t, policy("a", "", "STRICT")+policy("b", "", "DISABLE"))
	assert.Equal(t, xds.MTLSStrict, xds.PeerAuthenticationFor(snap, "shop", web).Mode)
}

// MeshConfig.meshMTLS raises the inbound minimum TLS version to 1.3 and replaces the cipher
// suites of inbound mTLS; without it, TLS 1.2 and Istio's suites.
func TestMeshMTLSSettingsApplyInbound(t *testing.T) {
	snap := snapshotOf(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: client, namespace: shop}
spec: {hosts: [client.shop.svc.cluster.local], location: MESH_INTERNAL, resolution: STATIC, ports: [{number: 80, name: http}], workloadSelector: {labels: {app: client}}}
`)
	snap.Options.MTLS = true
	params := func() *tlsv3.TlsParameters {
		l := xds.Listeners(viewIn(t, snap, nil)).Find(xds.VirtualInboundListener).Message.(*listener.Listener)
		var ctx tlsv3.DownstreamTlsContext
		require.NoError(t, l.GetFilterChains()[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(&ctx))
		return ctx.GetCommonTlsContext().GetTlsParams()
	}
	assert.Equal(t, tlsv3.TlsParameters_TLSv1_2, params().GetTlsMinimumProtocolVersion())
	assert.Len(t, params().GetCipherSuites(), 6)
	snap = xds.NewSnapshot(snap.Snapshot)
	snap.Mesh.MeshMTLS = &meshconfig.MeshConfig_TLSConfig{MinProtocolVersion: meshconfig.MeshConfig_TLSConfig_TLSV1_3, CipherSuites: []string{"ECDHE-ECDSA-AES256-GCM-SHA384"}}
	assert.Equal(t, tlsv3.TlsParameters_TLSv1_3, params().GetTlsMinimumProtocolVersion())
	assert.Equal(t, []string{"ECDHE-ECDSA-AES256-GCM-SHA384"}, params().GetCipherSuites())
}
