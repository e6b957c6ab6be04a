package xds_test

import (
	"testing"

	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// A root VirtualService whose every route delegates still gets its delegates' routes; a
// delegate route keeps its own CORS policy and one without gets the root's; a delegate
// route matching a source namespace under a root that names none is narrower, not in
// conflict, and is kept.
func TestDelegateRoutesMergeIntoARootOfDelegatesOnly(t *testing.T) {
	v := viewOf(t, reviewsSE+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: root, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - name: api
    match: [{uri: {prefix: /api}}]
    corsPolicy: {allowOrigins: [{exact: "https://root.example"}]}
    delegate: {name: reviews-api, namespace: shop}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews-api, namespace: shop}
spec:
  http:
  - name: own-cors
    match: [{uri: {prefix: /api/c}}]
    corsPolicy: {allowOrigins: [{exact: "https://own.example"}]}
    route: [{destination: {host: reviews.shop.svc.cluster.local}}]
  - name: from-shop
    match: [{uri: {prefix: /api/s}, sourceNamespace: shop}]
    route: [{destination: {host: reviews.shop.svc.cluster.local}}]
  - name: plain
    route: [{destination: {host: reviews.shop.svc.cluster.local}}]
`, nil)
	origins := map[string]string{}
	for _, r := range vhost(t, routeConfig(t, v, "9080"), "reviews.shop.svc.cluster.local:9080").GetRoutes() {
		origin := ""
		if a := r.GetTypedPerFilterConfig()[xds.CorsFilter]; a != nil {
			var c corsv3.CorsPolicy
			require.NoError(t, a.UnmarshalTo(&c))
			origin = c.GetAllowOriginStringMatch()[0].GetExact()
		}
		origins[r.GetName()] = origin
	}
	assert.Equal(t, map[string]string{"api-own-cors": "https://own.example", "api-from-shop": "https://root.example",
		"api-plain": "https://root.example"}, origins)
}
