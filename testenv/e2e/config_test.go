package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// 8. A config file with a bad field is rejected with the file and field named, and traffic
// does not notice; a config the proxy NACKs leaves it serving on its last accepted config,
// and discovery reports the NACK for that proxy.
func TestBadConfigAndNACK(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	_, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)
	g := steadyLoad(t, ctx, front.URL("/"), 100)
	waitServed(t, g, 50)

	// A typo: "weigth". The document is rejected, with the file and field named.
	require.NoError(t, m.WriteConfig("backend-vs.yaml", `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend, namespace: default}
spec:
  hosts: [backend.default.svc.cluster.local]
  http:
  - route:
    - {destination: {host: backend.default.svc.cluster.local}, weigth: 100}
`))
	var rejected string
	require.Eventually(t, func() bool {
		b, err := getURL(m.DiscoveryURL("/debug/configz"))
		if err != nil {
			return false
		}
		var out struct {
			Documents []struct{ File, Status, Error string } `json:"documents"`
		}
		if json.Unmarshal(b, &out) != nil {
			return false
		}
		for _, d := range out.Documents {
			if strings.HasSuffix(d.File, "backend-vs.yaml") && strings.HasPrefix(d.Status, "rejected") {
				rejected = d.Error
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "discovery reports the rejected document")
	assert.Contains(t, rejected, "weigth")
	waitServed(t, g, 100)

	// An extension the proxy cannot load: it NACKs the listeners and keeps serving.
	require.NoError(t, m.WriteConfig("broken-filter.yaml", `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: broken, namespace: default}
spec:
  workloadSelector: {labels: {app: frontend}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}
    patch:
      operation: INSERT_BEFORE
      value:
        name: broken.wasm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
          config:
            name: broken
            vm_config:
              runtime: envoy.wasm.runtime.v8
              code: {local: {filename: /nonexistent/broken.wasm}}
`))
	var nackErr string
	require.Eventually(t, func() bool {
		b, err := getURL(m.DiscoveryURL("/debug/syncz"))
		if err != nil {
			return false
		}
		var conns []struct {
			Proxy string `json:"proxy"`
			Types []struct {
				Type      string `json:"type"`
				Nacks     int    `json:"nacks"`
				NackError string `json:"nackError"`
			} `json:"types"`
		}
		if json.Unmarshal(b, &conns) != nil {
			return false
		}
		for _, c := range conns {
			if !strings.Contains(c.Proxy, front.Spec.Name) {
				continue
			}
			for _, ty := range c.Types {
				if ty.Nacks > 0 {
					nackErr = ty.Type + ": " + ty.NackError
					return true
				}
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond, "discovery reports the frontend proxy's NACK")
	assert.Contains(t, nackErr, "broken.wasm")
	waitServed(t, g, 200)
	requireNoFailures(t, g)
}
