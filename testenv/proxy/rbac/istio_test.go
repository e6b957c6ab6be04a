package rbac_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbacnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
	"github.com/wasmesh/wasmesh/testenv/proxy/rbac"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

// The control plane's translation of AuthorizationPolicies, evaluated by this package's
// engine as meshproxy evaluates it: the decisions Istio documents for the policies.
const istioPolicies = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 80, name: http, targetPort: 8080}
  - {number: 5432, name: tcp-db, protocol: TCP}
  workloadSelector: {labels: {app: web}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-untrusted, namespace: istio-system}
spec:
  action: DENY
  rules: [{from: [{source: {namespaces: [untrusted]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{to: [{operation: {paths: ["/admin*"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: frontend, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  rules:
  - from: [{source: {principals: [cluster.local/ns/demo/sa/frontend]}}]
    to: [{operation: {methods: [GET], hosts: [web, "web:*"]}}]
  - from: [{source: {principals: [cluster.local/ns/demo/sa/frontend]}}]
    to: [{operation: {ports: ["5432"]}}]
  - from: [{source: {namespaces: [untrusted]}}]
`

type chains struct {
	http []*rbac.Engine // in filter order
	tcp  []*rbac.Engine
}

func generated(t *testing.T) chains {
	t.Helper()
	var cs []*config.Config
	for _, d := range config.ParseFile("policies.yaml", []byte(istioPolicies)) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	reg := registry.NewServiceEntries(slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry()))
	reg.SetConfigs(cs)
	md, err := structpb.NewStruct(map[string]any{"NAME": "web-1", "NAMESPACE": "demo", "LABELS": map[string]any{"app": "web"}, "INSTANCE_IPS": "10.1.0.7"})
	require.NoError(t, err)
	p, err := model.ParseNode(&corev3.Node{Id: "sidecar~10.1.0.7~web-1.demo~demo.svc.cluster.local", Metadata: md})
	require.NoError(t, err)
	if w, ok := p.Workload(); ok {
		reg.SetWorkload(w)
	}
	snap := xds.NewSnapshot(push.Build("v1", mesh.Default(), config.NewIndex(cs), registry.NewAggregate(reg)))
	var out chains
	passthrough := 0
	for _, r := range xds.Listeners(xds.NewView(snap, p)).Items {
		l := r.Message.(*listenerv3.Listener)
		if l.GetName() != xds.VirtualInboundListener {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				switch f.GetName() {
				case xds.RBACNetworkFilter:
					if fc.GetName() == xds.InboundPassthroughCluster { // ports no Service declares
						passthrough++
						continue
					}
					cfg := &rbacnet.RBAC{}
					require.NoError(t, f.GetTypedConfig().UnmarshalTo(cfg))
					out.tcp = append(out.tcp, compile(t, cfg.GetRules()))
				case "envoy.filters.network.http_connection_manager":
					m := &hcmv3.HttpConnectionManager{}
					require.NoError(t, f.GetTypedConfig().UnmarshalTo(m))
					for _, hf := range m.GetHttpFilters() {
						if hf.GetName() == xds.RBACHTTPFilter {
							cfg := &rbachttp.RBAC{}
							require.NoError(t, hf.GetTypedConfig().UnmarshalTo(cfg))
							out.http = append(out.http, compile(t, cfg.GetRules()))
						}
					}
				}
			}
		}
	}
	require.Len(t, out.http, 2, "DENY and ALLOW on the HTTP chain")
	require.Len(t, out.tcp, 2, "DENY and ALLOW on the TCP chain")
	require.Equal(t, 2, passthrough, "DENY and ALLOW on the inbound passthrough chain")
	return out
}

func compile(t *testing.T, r *rbacv3.RBAC) *rbac.Engine {
	t.Helper()
	e, err := rbac.Compile(r)
	require.NoError(t, err)
	return e
}

// decide runs the engines in order: the first denial answers.
func decide(engines []*rbac.Engine, in *rbac.Input) (bool, string) {
	for _, e := range engines {
		if d := e.Evaluate(in); !d.Allowed {
			return false, rbac.ResponseDetails(d)
		}
	}
	return true, ""
}

func peer(ns, sa string) *streaminfo.TLS {
	return &streaminfo.TLS{PeerURISANs: []string{"spiffe://cluster.local/ns/" + ns + "/sa/" + sa}}
}

func TestIstioPoliciesEnforced(t *testing.T) {
	g := generated(t)
	frontend, backend, untrusted := peer("demo", "frontend"), peer("demo", "backend"), peer("untrusted", "x")
	httpIn := func(method, path, host string, tls *streaminfo.TLS) *rbac.Input {
		r := httptest.NewRequest(method, path, nil)
		r.Host = host
		return &rbac.Input{Request: r, TLS: tls, DirectRemote: netip.MustParseAddr("10.1.0.9"), Remote: netip.MustParseAddr("10.1.0.9"),
			Local: netip.MustParseAddrPort("10.1.0.7:8080")}
	}
	none := "rbac_access_denied_matched_policy[none]"
	for _, tc := range []struct {
		name    string
		in      *rbac.Input
		allowed bool
		details string
	}{
		{"frontend GET", httpIn("GET", "/api", "web", frontend), true, ""},
		{"host with port", httpIn("GET", "/api", "web:80", frontend), true, ""},
		{"other host", httpIn("GET", "/api", "web.other", frontend), false, none},
		{"other method", httpIn("POST", "/api", "web", frontend), false, none},
		{"other caller", httpIn("GET", "/api", "web", backend), false, none},
		{"plaintext caller", httpIn("GET", "/api", "web", nil), false, none},
		{"DENY before ALLOW", httpIn("GET", "/admin/users", "web", frontend), false, "rbac_access_denied_matched_policy[ns[demo]-policy[no-admin]-rule[0]]"},
		{"mesh-wide DENY wins over an ALLOW", httpIn("GET", "/", "web", untrusted), false, "rbac_access_denied_matched_policy[ns[istio-system]-policy[no-untrusted]-rule[0]]"},
	} {
		allowed, details := decide(g.http, tc.in)
		assert.Equal(t, tc.allowed, allowed, tc.name)
		assert.Equal(t, tc.details, details, tc.name)
	}

	tcpIn := func(tls *streaminfo.TLS) *rbac.Input {
		return &rbac.Input{TLS: tls, DirectRemote: netip.MustParseAddr("10.1.0.9"), Remote: netip.MustParseAddr("10.1.0.9"),
			Local: netip.MustParseAddrPort("10.1.0.7:5432")}
	}
	allowed, details := decide(g.tcp, tcpIn(frontend))
	assert.False(t, allowed, "a DENY rule with only HTTP fields matches every TCP connection (Istio warns of it)")
	assert.Equal(t, "rbac_access_denied_matched_policy[ns[demo]-policy[no-admin]-rule[0]]", details)
	allow := g.tcp[1]
	assert.True(t, allow.Evaluate(tcpIn(frontend)).Allowed, "the ALLOW rule with a port applies on TCP")
	assert.False(t, allow.Evaluate(tcpIn(backend)).Allowed, "the HTTP-only rule is dropped, not widened")
	assert.True(t, allow.Evaluate(tcpIn(untrusted)).Allowed, "the namespace rule applies on TCP")
	assert.False(t, g.tcp[0].Evaluate(tcpIn(untrusted)).Allowed)
}
