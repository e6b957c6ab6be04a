package xds_test

import (
	"slices"
	"strings"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

func httpFilterNames(t *testing.T, r *xds.Resources, name string) []string {
	t.Helper()
	res := r.Find(name)
	require.NotNil(t, res, "listener %s", name)
	h := &hcm.HttpConnectionManager{}
	require.NoError(t, res.Message.(*listener.Listener).GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(h))
	var out []string
	for _, f := range h.GetHttpFilters() {
		out = append(out, f.GetName())
	}
	return out
}

// Proxies of one shape share a view, unless an EnvoyFilter's proxy match reads something the
// shape leaves out (version, metadata): then that is part of the view's key.
func TestProxyMatchInputsKeyTheView(t *testing.T) {
	f := loadCase(t, "testdata/ext-envoyfilter-ops")
	edge := f.proxies[1] // productpage: ISTIO_VERSION 1.25.0, ROLE edge
	other := *edge
	other.ID = "sidecar~10.1.0.9~productpage-v1-old.default~default.svc.cluster.local"
	other.IstioVersion = "1.19.0"
	shape := xds.Shape(edge)
	require.Equal(t, shape, xds.Shape(&other), "the shape does not include the version")

	ve := xds.CachedView(f.snap, edge, shape)
	vo := xds.CachedView(f.snap, &other, shape)
	assert.NotEqual(t, ve.Key, vo.Key)
	assert.Contains(t, httpFilterNames(t, xds.Listeners(ve), "0.0.0.0_9080"), "edge-authz")
	assert.NotContains(t, httpFilterNames(t, xds.Listeners(vo), "0.0.0.0_9080"), "edge-authz")

	// Without any proxy match in the config, the version stays out of the key.
	g := loadCase(t, "testdata/ext-wasmplugin")
	p := g.proxies[1]
	q := *p
	q.IstioVersion = "9.9.9"
	assert.Equal(t, xds.CachedView(g.snap, p, xds.Shape(p)).Key, xds.CachedView(g.snap, &q, xds.Shape(&q)).Key)
}

// Route patches that select workloads make the route key differ between proxies of one
// namespace and scope, so shared RDS results are not handed to the wrong proxy.
func TestRoutePatchesKeyTheRoutes(t *testing.T) {
	f := loadCase(t, "testdata/ext-envoyfilter-ops")
	reviews := xds.NewView(f.snap, f.proxies[0]) // selected by the routes EnvoyFilter
	other := xds.NewView(f.snap, f.proxies[2])   // not selected
	assert.NotEqual(t, reviews.RouteKey(), other.RouteKey())
	rr := xds.Generate(reviews, xds.RouteType, []string{"9080"})
	ro := xds.Generate(other, xds.RouteType, []string{"9080"})
	require.Len(t, rr.Items, 1)
	require.Len(t, ro.Items, 1)
	assert.NotEqual(t, rr.Items[0].Hash, ro.Items[0].Hash)
}

// The Wasm filters a proxy's plugins add are part of the key of listeners shared between
// views (REDIRECT outbound listeners).
func TestPluginsKeyTheSharedListeners(t *testing.T) {
	f := loadCase(t, "testdata/ext-wasmplugin")
	pp := f.proxies[1] // productpage, REDIRECT
	reviews := *pp
	reviews.Labels = map[string]string{"app": "reviews", "version": "v1"}
	reviews.InterceptionMode = model.InterceptionRedirect
	a := xds.NewView(f.snap, pp)
	b := xds.NewView(f.snap, &reviews)
	assert.NotEqual(t, a.FilterKey(), b.FilterKey())
	fa := httpFilterNames(t, xds.Listeners(a), "0.0.0.0_9080")
	fb := httpFilterNames(t, xds.Listeners(b), "0.0.0.0_9080")
	assert.False(t, slices.Contains(fa, "default.reviews-quota"))
	assert.True(t, slices.Contains(fb, "default.reviews-quota"))
}

// A problem names the EnvoyFilter patch by its index, the first one too.
func TestAProblemNamesItsPatch(t *testing.T) {
	snap := snapshotOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: bad, namespace: shop}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_OUTBOUND}
    patch: {operation: ADD, value: {name: after-router, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1024}}}
`)
	v := viewIn(t, snap, nil)
	l := xds.Listeners(v).Find("0.0.0.0_9080")
	require.NotNil(t, l)
	require.NoError(t, l.Message.(*listener.Listener).ValidateAll())
	assert.NotContains(t, httpFilterNames(t, xds.Listeners(v), "0.0.0.0_9080"), "after-router")
	problems := xds.Problems(snap)
	require.NotEmpty(t, problems)
	for _, p := range problems {
		assert.Equal(t, 0, p.Patch)
		assert.True(t, strings.HasPrefix(p.String(), "EnvoyFilter shop/bad configPatches[0] not applied to "), p.String())
	}
}
