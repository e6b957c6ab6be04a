package envoyfilter_test

import (
	"strconv"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoyfilter"
	_ "github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

// set parses EnvoyFilter documents (validated as discovery would) and builds the patch set of
// a proxy in namespace default labelled app=reviews.
func set(t *testing.T, docs string, px envoyfilter.Proxy) *envoyfilter.Set {
	t.Helper()
	var cs []*config.Config
	for _, d := range config.ParseFile("ef.yaml", []byte(docs)) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	ix := config.NewIndex(cs)
	var compiled [][]*envoyfilter.Patch
	for _, c := range envoyfilter.Select(ix, "istio-system", "default", map[string]string{"app": "reviews"}) {
		ps, err := envoyfilter.Compile(c)
		require.NoError(t, err)
		compiled = append(compiled, ps)
	}
	return envoyfilter.NewSet(compiled, px)
}

func ef(ns, name, spec string) string {
	return "---\napiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec:\n" + spec + "\n"
}

func decode[T proto.Message](t *testing.T, m T, y string) T {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(y))
	require.NoError(t, err)
	require.NoError(t, protojson.Unmarshal(js, m))
	return m
}

// httpListener is an outbound (or inbound) listener on port with one connection manager whose
// HTTP filters are named names (the last one is the router).
func httpListener(t *testing.T, name string, port int, inbound bool, names ...string) *listener.Listener {
	var fs []string
	for _, n := range names {
		typ := "envoy.extensions.filters.http.cors.v3.Cors"
		if n == "envoy.filters.http.router" {
			typ = "envoy.extensions.filters.http.router.v3.Router"
		}
		fs = append(fs, `{name: `+n+`, typed_config: {"@type": type.googleapis.com/`+typ+`}}`)
	}
	dir := "OUTBOUND"
	rds := `rds: {route_config_name: "` + itoa(port) + `", config_source: {ads: {}, resource_api_version: V3}}`
	if inbound {
		dir = "INBOUND"
		rds = `route_config: {name: "inbound|` + itoa(port) + `||", virtual_hosts: [{name: "inbound|http|` + itoa(port) + `", domains: ["*"], routes: [{name: default, match: {prefix: /}, route: {cluster: "inbound|` + itoa(port) + `||"}}]}]}`
	}
	return decode(t, &listener.Listener{}, `
name: `+name+`
traffic_direction: `+dir+`
address: {socket_address: {address: 0.0.0.0, port_value: `+itoa(port)+`}}
filter_chains:
- filters:
  - name: envoy.filters.network.http_connection_manager
    typed_config:
      "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
      stat_prefix: s
      `+rds+`
      http_filters: [`+strings.Join(fs, ", ")+`]
`)
}

func itoa(n int) string { return strconv.Itoa(n) }

func httpFilterNames(t *testing.T, l *listener.Listener) [][]string {
	t.Helper()
	var out [][]string
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetName() != "envoy.filters.network.http_connection_manager" {
				continue
			}
			h := &hcm.HttpConnectionManager{}
			require.NoError(t, f.GetTypedConfig().UnmarshalTo(h))
			var names []string
			for _, hf := range h.GetHttpFilters() {
				names = append(names, hf.GetName())
			}
			out = append(out, names)
		}
	}
	return out
}

func hcmOf(t *testing.T, l *listener.Listener) *hcm.HttpConnectionManager {
	t.Helper()
	h := &hcm.HttpConnectionManager{}
	require.NoError(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(h))
	return h
}

const router = "envoy.filters.http.router"

func httpPatch(ctx, op, match, name string) string {
	return `  - applyTo: HTTP_FILTER
    match: {context: ` + ctx + `, listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager` + match + `}}}}
    patch: {operation: ` + op + `, value: {name: ` + name + `, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}`
}

func TestHTTPFilterOperations(t *testing.T) {
	sub := func(n string) string { return ", subFilter: {name: " + n + "}" }
	s := set(t, ef("default", "ops", `  configPatches:
`+httpPatch("SIDECAR_OUTBOUND", "INSERT_BEFORE", sub(router), "before-router")+`
`+httpPatch("SIDECAR_OUTBOUND", "INSERT_AFTER", sub("a"), "after-a")+`
`+httpPatch("SIDECAR_OUTBOUND", "INSERT_FIRST", "", "first")+`
`+httpPatch("SIDECAR_OUTBOUND", "REPLACE", sub("b"), "b-replaced")+`
`+httpPatch("SIDECAR_OUTBOUND", "INSERT_BEFORE", sub("no-such-filter"), "never")+`
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_OUTBOUND, listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: c}}}}}
    patch: {operation: REMOVE}
`+httpPatch("SIDECAR_INBOUND", "INSERT_FIRST", "", "inbound-only")), envoyfilter.Proxy{})

	out, errs := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, "a", "b", "c", router), nil)
	require.Empty(t, errs)
	assert.Equal(t, [][]string{{"first", "a", "after-a", "b-replaced", "before-router", router}}, httpFilterNames(t, out))

	in, errs := s.PatchListener(httpListener(t, "10.0.0.1_8080", 8080, true, router), nil)
	require.Empty(t, errs)
	assert.Equal(t, [][]string{{"inbound-only", router}}, httpFilterNames(t, in), "context selects the direction")
}

func TestInvalidPatchIsUndoneAndReported(t *testing.T) {
	// ADD appends after the router, which Envoy rejects (the router must be last): that patch
	// is undone and reported; the patches before and after it still apply.
	s := set(t, ef("default", "bad", `  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "one")+`
`+httpPatch("ANY", "ADD", "", "after-router")+`
`+httpPatch("ANY", "INSERT_FIRST", "", "two")), envoyfilter.Proxy{})
	out, errs := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, router), nil)
	assert.Equal(t, [][]string{{"two", "one", router}}, httpFilterNames(t, out))
	require.Len(t, errs, 1)
	assert.Equal(t, 1, errs[0].Patch.Index)
	assert.Equal(t, config.Key{Kind: config.EnvoyFilter, Namespace: "default", Name: "bad"}, errs[0].Patch.Filter)
	assert.Equal(t, "listener 0.0.0.0_9080", errs[0].Resource)
	assert.Contains(t, errs[0].Error(), "EnvoyFilter default/bad configPatches[1] on listener 0.0.0.0_9080")
	assert.Contains(t, errs[0].Err.Error(), "terminal filter envoy.filters.http.router must be the last HTTP filter")
}

func TestFilterClassPlacesAfterPhase(t *testing.T) {
	s := set(t, ef("default", "class", `  configPatches:
  - applyTo: HTTP_FILTER
    patch: {operation: ADD, filterClass: AUTHZ, value: {name: authz-1, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}
  - applyTo: HTTP_FILTER
    patch: {operation: ADD, filterClass: AUTHZ, value: {name: authz-2, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}
  - applyTo: HTTP_FILTER
    patch: {operation: ADD, filterClass: AUTHN, value: {name: authn, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}
  - applyTo: HTTP_FILTER
    patch: {operation: ADD, filterClass: STATS, value: {name: stats, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}`), envoyfilter.Proxy{})
	ranks := map[string]int{"wasm-authn": 1, "wasm-authz": 2, "wasm-stats": 3, "wasm-other": 4, router: 5}
	out, errs := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, "wasm-authn", "wasm-authz", "wasm-stats", "wasm-other", router),
		func(n string) int { return ranks[n] })
	require.Empty(t, errs)
	assert.Equal(t, [][]string{{"wasm-authn", "authn", "wasm-authz", "authz-1", "authz-2", "wasm-stats", "stats", "wasm-other", router}}, httpFilterNames(t, out))

	// Without plugins of a phase, the filter goes before the first later one.
	out, errs = s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, "wasm-other", router), func(n string) int { return ranks[n] })
	require.Empty(t, errs)
	assert.Equal(t, [][]string{{"authn", "authz-1", "authz-2", "stats", "wasm-other", router}}, httpFilterNames(t, out))
}

func TestMergeHTTPFilterTypedConfig(t *testing.T) {
	s := set(t, ef("default", "merge", `  configPatches:
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          suppress_envoy_headers: true
  - applyTo: NETWORK_FILTER
    match: {listener: {portNumber: 9080, filterChain: {filter: {name: envoy.filters.network.http_connection_manager}}}}
    patch:
      operation: MERGE
      value:
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stream_idle_timeout: 7s
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}
    patch:
      operation: MERGE
      value: {typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}}`), envoyfilter.Proxy{})
	out, errs := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, router), nil)
	h := hcmOf(t, out)
	assert.Equal(t, 7*1e9, float64(h.GetStreamIdleTimeout().AsDuration()))
	assert.Equal(t, "s", h.GetStatPrefix(), "merge keeps the fields the patch does not set")
	assert.Contains(t, string(h.GetHttpFilters()[0].GetTypedConfig().GetValue()), "\x01", "suppress_envoy_headers set in the router's own config")
	require.Len(t, errs, 1, "a typed_config of another type cannot be merged")
	assert.Equal(t, 2, errs[0].Patch.Index)
	assert.Contains(t, errs[0].Err.Error(), "cannot be merged into")

	// A port that does not match leaves the listener alone.
	other, _ := s.PatchListener(httpListener(t, "0.0.0.0_9081", 9081, false, router), nil)
	assert.Nil(t, hcmOf(t, other).GetStreamIdleTimeout())
}

func TestListenerAndFilterChainOperations(t *testing.T) {
	s := set(t, ef("default", "l", `  configPatches:
  - applyTo: LISTENER
    match: {context: SIDECAR_OUTBOUND, listener: {portNumber: 9081}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    match: {listener: {name: 0.0.0.0_9080}}
    patch: {operation: MERGE, value: {per_connection_buffer_limit_bytes: 1024, listener_filters: [{name: envoy.filters.listener.tls_inspector, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector}}]}}
  - applyTo: LISTENER_FILTER
    match: {listener: {portNumber: 9080}}
    patch: {operation: INSERT_FIRST, value: {name: envoy.filters.listener.http_inspector, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.listener.http_inspector.v3.HttpInspector}}}
  - applyTo: FILTER_CHAIN
    match: {listener: {portNumber: 9080}}
    patch: {operation: ADD, value: {name: extra, filter_chain_match: {destination_port: 1}, filters: [{name: envoy.filters.network.tcp_proxy, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: x, cluster: BlackHoleCluster}}]}}
  - applyTo: NETWORK_FILTER
    match: {listener: {portNumber: 9080, filterChain: {name: extra, filter: {name: envoy.filters.network.tcp_proxy}}}}
    patch: {operation: REMOVE}
  - applyTo: LISTENER
    patch: {operation: ADD, value: {name: added, address: {socket_address: {address: 0.0.0.0, port_value: 7000}}, filter_chains: [{filters: [{name: envoy.filters.network.tcp_proxy, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy, stat_prefix: x, cluster: BlackHoleCluster}}]}]}}`), envoyfilter.Proxy{})

	gone, _ := s.PatchListener(httpListener(t, "0.0.0.0_9081", 9081, false, router), nil)
	assert.Nil(t, gone)
	out, errs := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, router), nil)
	require.Empty(t, errs)
	assert.Equal(t, uint32(1024), out.GetPerConnectionBufferLimitBytes().GetValue())
	require.Len(t, out.GetListenerFilters(), 2)
	assert.Equal(t, "envoy.filters.listener.http_inspector", out.GetListenerFilters()[0].GetName())
	require.Len(t, out.GetFilterChains(), 2)
	assert.Equal(t, "extra", out.GetFilterChains()[1].GetName())
	assert.Len(t, out.GetFilterChains()[1].GetFilters(), 1, "filter chains added by ADD are not patched further, as in Istio")

	assert.Len(t, s.Added(networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_SIDECAR_OUTBOUND), 1, "ADD without context adds outbound")
	assert.Empty(t, s.Added(networking.EnvoyFilter_LISTENER, networking.EnvoyFilter_SIDECAR_INBOUND))
}

func TestVirtualInboundPortIsTheFilterChainPort(t *testing.T) {
	// virtualInbound listens on 15006; the port of a patch's listener match selects its filter
	// chains by destination port.
	s := set(t, ef("default", "vi", `  configPatches:
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_INBOUND, listener: {portNumber: 8080}}
    patch: {operation: INSERT_FIRST, value: {name: only-8080, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}`), envoyfilter.Proxy{})
	l := httpListener(t, "virtualInbound", 15006, true, router)
	second := proto.Clone(l.FilterChains[0]).(*listener.FilterChain)
	l.FilterChains[0].FilterChainMatch = &listener.FilterChainMatch{DestinationPort: wrapU32(8080)}
	second.FilterChainMatch = &listener.FilterChainMatch{DestinationPort: wrapU32(9090)}
	l.FilterChains = append(l.FilterChains, second)
	out, errs := s.PatchListener(l, nil)
	require.Empty(t, errs)
	assert.Equal(t, [][]string{{"only-8080", router}, {router}}, httpFilterNames(t, out))
}

func TestRoutePatches(t *testing.T) {
	s := set(t, ef("default", "r", `  configPatches:
  - applyTo: ROUTE_CONFIGURATION
    match: {context: SIDECAR_OUTBOUND, routeConfiguration: {portNumber: 9080}}
    patch: {operation: MERGE, value: {max_direct_response_body_size_bytes: 2048}}
  - applyTo: VIRTUAL_HOST
    match: {routeConfiguration: {vhost: {name: "old.default.svc.cluster.local:9080"}}}
    patch: {operation: REMOVE}
  - applyTo: HTTP_ROUTE
    match: {routeConfiguration: {vhost: {domainName: reviews, route: {name: default}}}}
    patch: {operation: INSERT_BEFORE, value: {name: health, match: {path: /healthz}, direct_response: {status: 200}}}
  - applyTo: HTTP_ROUTE
    match: {routeConfiguration: {vhost: {name: "reviews.default.svc.cluster.local:9080", route: {action: ROUTE}}}}
    patch: {operation: MERGE, value: {route: {timeout: 3s}}}
  - applyTo: VIRTUAL_HOST
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: added, domains: [added.example.com], routes: [{match: {prefix: /}, direct_response: {status: 404}}]}}
  - applyTo: HTTP_ROUTE
    match: {context: SIDECAR_INBOUND, routeConfiguration: {vhost: {route: {name: default}}}}
    patch: {operation: MERGE, value: {route: {timeout: 9s}}}`), envoyfilter.Proxy{})
	rc := decode(t, &route.RouteConfiguration{}, `
name: "9080"
virtual_hosts:
- {name: "reviews.default.svc.cluster.local:9080", domains: [reviews.default.svc.cluster.local, reviews], routes: [{name: default, match: {prefix: /}, route: {cluster: "outbound|9080||reviews.default.svc.cluster.local", timeout: 0.5s}}]}
- {name: "old.default.svc.cluster.local:9080", domains: [old.default.svc.cluster.local], routes: [{name: default, match: {prefix: /}, route: {cluster: c}}]}
`)
	out, errs := s.PatchRouteConfiguration(rc, networking.EnvoyFilter_SIDECAR_OUTBOUND)
	require.Empty(t, errs)
	assert.Equal(t, uint32(2048), out.GetMaxDirectResponseBodySizeBytes().GetValue())
	require.Len(t, out.GetVirtualHosts(), 2)
	vh := out.GetVirtualHosts()[0]
	require.Len(t, vh.GetRoutes(), 2)
	assert.Equal(t, "health", vh.GetRoutes()[0].GetName())
	assert.Equal(t, durationpb.New(3e9).AsDuration(), vh.GetRoutes()[1].GetRoute().GetTimeout().AsDuration(),
		"a Duration is replaced whole: merging 3s into 0.5s gives 3s, not 3.5s")
	assert.Equal(t, "added", out.GetVirtualHosts()[1].GetName())

	// The inbound route configuration lives inline in the inbound listener.
	in, errs := s.PatchListener(httpListener(t, "10.0.0.1_8080", 8080, true, router), nil)
	require.Empty(t, errs)
	assert.Equal(t, 9.0, hcmOf(t, in).GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetTimeout().AsDuration().Seconds())
}

func TestClusterPatches(t *testing.T) {
	s := set(t, ef("default", "c", `  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: reviews.default.svc.cluster.local, portNumber: 9080}}
    patch: {operation: MERGE, value: {connect_timeout: 2s, per_connection_buffer_limit_bytes: 100}}
  - applyTo: CLUSTER
    match: {cluster: {name: BlackHoleCluster}}
    patch: {operation: REMOVE}
  - applyTo: CLUSTER
    match: {context: SIDECAR_INBOUND, cluster: {service: reviews.default.svc.cluster.local}}
    patch: {operation: MERGE, value: {connect_timeout: 4s}}
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: extra, type: STATIC, connect_timeout: 1s}}
  - applyTo: CLUSTER
    match: {cluster: {name: "outbound|9080||ratings.default.svc.cluster.local"}}
    patch: {operation: MERGE, value: {connect_timeout: -1s}}`), envoyfilter.Proxy{})
	mk := func(name string) *cluster.Cluster {
		return &cluster.Cluster{Name: name, ConnectTimeout: durationpb.New(1e9), ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}}
	}
	out, errs := s.PatchCluster(mk("outbound|9080||reviews.default.svc.cluster.local"), nil)
	require.Empty(t, errs)
	assert.Equal(t, 2.0, out.GetConnectTimeout().AsDuration().Seconds())
	other, _ := s.PatchCluster(mk("outbound|9081||reviews.default.svc.cluster.local"), nil)
	assert.Equal(t, 1.0, other.GetConnectTimeout().AsDuration().Seconds())
	gone, _ := s.PatchCluster(mk("BlackHoleCluster"), nil)
	assert.Nil(t, gone)
	in, _ := s.PatchCluster(mk("inbound|8080||"), []string{"reviews.default.svc.cluster.local"})
	assert.Equal(t, 4.0, in.GetConnectTimeout().AsDuration().Seconds(), "an inbound cluster matches the services it serves")
	require.Len(t, s.Added(networking.EnvoyFilter_CLUSTER, networking.EnvoyFilter_SIDECAR_OUTBOUND), 1)

	bad, errs := s.PatchCluster(mk("outbound|9080||ratings.default.svc.cluster.local"), nil)
	require.Len(t, errs, 1, "a negative timeout fails Envoy's validation")
	assert.Equal(t, 4, errs[0].Patch.Index)
	assert.Equal(t, 1.0, bad.GetConnectTimeout().AsDuration().Seconds(), "the cluster is sent without the patch")
}

func TestSelectionAndOrder(t *testing.T) {
	docs := ef("default", "b-late", `  priority: 10
  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "ns-prio10")) +
		ef("default", "a-ns", `  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "ns-prio0")) +
		ef("istio-system", "z-root", `  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "root-prio0")) +
		ef("istio-system", "early", `  priority: -1
  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "root-prio-1")) +
		ef("default", "other-app", `  workloadSelector: {labels: {app: ratings}}
  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "not-selected")) +
		ef("other", "other-ns", `  configPatches:
`+httpPatch("ANY", "INSERT_FIRST", "", "not-selected")) +
		ef("default", "versioned", `  configPatches:
  - applyTo: HTTP_FILTER
    match: {proxy: {proxyVersion: "^1\\.2.*", metadata: {ZONE: a}}}
    patch: {operation: INSERT_FIRST, value: {name: versioned, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault}}}`)
	md, err := structpb.NewStruct(map[string]any{"ZONE": "a"})
	require.NoError(t, err)
	s := set(t, docs, envoyfilter.Proxy{IstioVersion: "1.25.0", Metadata: md})
	out, _ := s.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, router), nil)
	// INSERT_FIRST: the last applied comes first. Order: priority -1, then 0 (root before the
	// namespace's), then 10.
	assert.Equal(t, [][]string{{"ns-prio10", "versioned", "ns-prio0", "root-prio0", "root-prio-1", router}}, httpFilterNames(t, out))

	s2 := set(t, docs, envoyfilter.Proxy{IstioVersion: "1.30.0", Metadata: md})
	out2, _ := s2.PatchListener(httpListener(t, "0.0.0.0_9080", 9080, false, router), nil)
	assert.NotContains(t, httpFilterNames(t, out2)[0], "versioned")
	assert.NotEqual(t, s.ID, s2.ID)

	var cs []*config.Config
	for _, d := range config.ParseFile("ef.yaml", []byte(docs)) {
		cs = append(cs, d.Config)
	}
	version, keys := envoyfilter.ProxyInputs(config.NewIndex(cs))
	assert.True(t, version)
	assert.Equal(t, []string{"ZONE"}, keys)
}

func TestMergeSemantics(t *testing.T) {
	dst := decode(t, &cluster.Cluster{}, `{name: a, connect_timeout: 1.5s, metadata: {filter_metadata: {x: {a: 1}}}, dns_resolvers: [{socket_address: {address: 1.1.1.1, port_value: 53}}]}`)
	src := decode(t, &cluster.Cluster{}, `{connect_timeout: 2s, dns_resolvers: [{socket_address: {address: 8.8.8.8, port_value: 53}}]}`)
	require.NoError(t, envoyfilter.Merge(dst, src, false))
	assert.Equal(t, 2.0, dst.GetConnectTimeout().AsDuration().Seconds())
	assert.Len(t, dst.GetDnsResolvers(), 2, "MERGE appends lists") //nolint:staticcheck // test data
	require.NoError(t, envoyfilter.Merge(dst, src, true))
	assert.Len(t, dst.GetDnsResolvers(), 1, "MERGE_AND_REPLACE_LIST replaces them") //nolint:staticcheck // test data
	assert.Equal(t, "a", dst.GetName())
	assert.Error(t, envoyfilter.Merge(dst, &route.Route{}, false))
}

func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }
