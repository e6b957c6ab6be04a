package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// extCase is one document that must be rejected, with the field the error names.
type extCase struct {
	name, doc, field, message string
}

func runRejections(t *testing.T, header string, cases []extCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs := ParseFile("ext.yaml", []byte(header+tc.doc))
			require.Len(t, docs, 1)
			d := docs[0]
			require.NotNil(t, d.Err, "accepted")
			assert.Equal(t, tc.field, d.Err.Field, d.Err.Error())
			assert.Contains(t, d.Err.Error(), tc.message)
		})
	}
}

const efHeader = `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: ef, namespace: default}
`

func TestEnvoyFilterRejections(t *testing.T) {
	runRejections(t, efHeader, []extCase{
		{"missing applyTo", `spec: {configPatches: [{patch: {operation: REMOVE}}]}`, "spec.configPatches[0].applyTo", "required"},
		{"bootstrap", `spec: {configPatches: [{applyTo: BOOTSTRAP, patch: {operation: MERGE, value: {}}}]}`, "spec.configPatches[0].applyTo", "BOOTSTRAP"},
		{"missing patch", `spec: {configPatches: [{applyTo: CLUSTER}]}`, "spec.configPatches[0].patch", "required"},
		{"missing operation", `spec: {configPatches: [{applyTo: CLUSTER, patch: {value: {}}}]}`, "spec.configPatches[0].patch.operation", "required"},
		{"replace on cluster", `spec: {configPatches: [{applyTo: CLUSTER, patch: {operation: REPLACE, value: {name: c}}}]}`, "spec.configPatches[0].patch.operation", "REPLACE does not apply to CLUSTER"},
		{"add route configuration", `spec: {configPatches: [{applyTo: ROUTE_CONFIGURATION, patch: {operation: ADD, value: {name: r}}}]}`, "spec.configPatches[0].patch.operation", "ADD does not apply to ROUTE_CONFIGURATION"},
		{"merge extension config", `spec: {configPatches: [{applyTo: EXTENSION_CONFIG, patch: {operation: MERGE, value: {name: e}}}]}`, "spec.configPatches[0].patch.operation", "use ADD"},
		{"value missing", `spec: {configPatches: [{applyTo: CLUSTER, patch: {operation: MERGE}}]}`, "spec.configPatches[0].patch.value", "required for MERGE"},
		{"remove with value", `spec: {configPatches: [{applyTo: CLUSTER, patch: {operation: REMOVE, value: {name: x}}}]}`, "spec.configPatches[0].patch.value", "REMOVE takes no value"},
		{"misspelt value field", `spec: {configPatches: [{applyTo: CLUSTER, patch: {operation: MERGE, value: {conect_timeout: 1s}}}]}`, "spec.configPatches[0].patch.value", "conect_timeout"},
		{"unknown type", `
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    patch: {operation: ADD, value: {name: f, typed_config: {"@type": type.googleapis.com/envoy.config.filter.http.lua.v2.Lua}}}`, "spec.configPatches[0].patch.value", "envoy.config.filter.http.lua.v2.Lua"},
		{"added value invalid", `spec: {configPatches: [{applyTo: HTTP_FILTER, patch: {operation: INSERT_FIRST, value: {typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}}]}`, "spec.configPatches[0].patch.value", "Name"},
		{"filter class on merge", `spec: {configPatches: [{applyTo: HTTP_FILTER, patch: {operation: MERGE, filterClass: AUTHZ, value: {name: x}}}]}`, "spec.configPatches[0].patch.filterClass", "ADD"},
		{"listener match on cluster", `spec: {configPatches: [{applyTo: CLUSTER, match: {listener: {portNumber: 80}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.listener", "CLUSTER"},
		{"cluster match on listener", `spec: {configPatches: [{applyTo: LISTENER, match: {cluster: {portNumber: 80}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.cluster", "LISTENER"},
		{"route match on route configuration", `spec: {configPatches: [{applyTo: ROUTE_CONFIGURATION, match: {routeConfiguration: {vhost: {name: a}}}, patch: {operation: MERGE, value: {}}}]}`, "spec.configPatches[0].match.routeConfiguration.vhost", "no effect"},
		{"port name", `spec: {configPatches: [{applyTo: LISTENER, match: {listener: {portName: http}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.listener.portName", "not supported"},
		{"gateway match on sidecar", `spec: {configPatches: [{applyTo: VIRTUAL_HOST, match: {context: SIDECAR_OUTBOUND, routeConfiguration: {gateway: gw}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.routeConfiguration.gateway", "GATEWAY"},
		{"subFilter on network filter", `
spec:
  configPatches:
  - applyTo: NETWORK_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager, subFilter: {name: envoy.filters.http.router}}}}}
    patch: {operation: REMOVE}`, "spec.configPatches[0].match.listener.filterChain.filter.subFilter", "HTTP_FILTER"},
		{"subFilter under tcp proxy", `
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match: {listener: {filterChain: {filter: {name: envoy.filters.network.tcp_proxy, subFilter: {name: envoy.filters.http.router}}}}}
    patch: {operation: REMOVE}`, "spec.configPatches[0].match.listener.filterChain.filter.name", "http_connection_manager"},
		{"proxy version regex", `spec: {configPatches: [{applyTo: CLUSTER, match: {proxy: {proxyVersion: "^1.(("}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.proxy.proxyVersion", "regular expression"},
		{"extension config name", `
spec:
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch: {operation: ADD, value: {typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}}`, "spec.configPatches[0].patch.value", "Name"},
		{"target refs", `spec: {targetRefs: [{kind: Gateway, name: gw}], configPatches: []}`, "spec.targetRefs", "workload selector"},
		{"waypoint", `spec: {configPatches: [{applyTo: HTTP_FILTER, match: {waypoint: {portNumber: 80}}, patch: {operation: REMOVE}}]}`, "spec.configPatches[0].match.waypoint", "waypoint"},
	})
}

const wpHeader = `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: wp, namespace: default}
`

func TestWasmPluginRejections(t *testing.T) {
	runRejections(t, wpHeader, []extCase{
		{"missing url", `spec: {phase: AUTHZ}`, "spec.url", "required"},
		{"oci", `spec: {url: "oci://registry/filter:v1"}`, "spec.url", "OCI"},
		{"no scheme", `spec: {url: "registry.example.com/filter:v1"}`, "spec.url", "OCI"},
		{"ftp", `spec: {url: "ftp://example.com/f.wasm"}`, "spec.url", "ftp"},
		{"http without sha", `spec: {url: "https://example.com/f.wasm"}`, "spec.sha256", "required"},
		{"bad sha", `spec: {url: "https://example.com/f.wasm", sha256: ABC}`, "spec.sha256", "hex"},
		{"relative file", `spec: {url: "file://relative/f.wasm"}`, "spec.url", "file:///"},
		{"network type", `spec: {url: "file:///f.wasm", type: NETWORK}`, "spec.type", "NETWORK"},
		{"target refs", `spec: {url: "file:///f.wasm", targetRefs: [{kind: Gateway, name: gw}]}`, "spec.targetRefs", "selector"},
		{"pull secret", `spec: {url: "file:///f.wasm", imagePullSecret: s}`, "spec.imagePullSecret", "not supported"},
		{"env name", `spec: {url: "file:///f.wasm", vmConfig: {env: [{name: "1X", value: a}]}}`, "spec.vmConfig.env[0].name", "C identifier"},
		{"host env value", `spec: {url: "file:///f.wasm", vmConfig: {env: [{name: X, valueFrom: HOST, value: a}]}}`, "spec.vmConfig.env[0].value", "empty"},
		{"match port", `spec: {url: "file:///f.wasm", match: [{mode: SERVER, ports: [{number: 0}]}]}`, "spec.match[0].ports[0].number", "out of range"},
		{"misspelt field", `spec: {url: "file:///f.wasm", failStrategey: FAIL_OPEN}`, "spec", "failStrategey"},
	})
}

const telHeader = `apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: t, namespace: default}
`

func TestTelemetryRejections(t *testing.T) {
	runRejections(t, telHeader, []extCase{
		{"tracing", `spec: {tracing: [{randomSamplingPercentage: 10}]}`, "spec.tracing", "metrics only"},
		{"access logging", `spec: {accessLogging: [{providers: [{name: envoy}]}]}`, "spec.accessLogging", "metrics only"},
		{"provider name", `spec: {metrics: [{providers: [{}]}]}`, "spec.metrics[0].providers[0].name", "required"},
		{"reporting interval", `spec: {metrics: [{reportingInterval: 5s}]}`, "spec.metrics[0].reportingInterval", "TCP"},
		{"custom metric name", `spec: {metrics: [{overrides: [{match: {customMetric: "my-metric"}}]}]}`, "spec.metrics[0].overrides[0].match.customMetric", "letters"},
		{"tag name", `spec: {metrics: [{overrides: [{tagOverrides: {"bad-tag": {value: "request.host"}}}]}]}`, "spec.metrics[0].overrides[0].tagOverrides.bad-tag", "letters"},
		{"upsert without value", `spec: {metrics: [{overrides: [{tagOverrides: {host: {operation: UPSERT}}}]}]}`, "spec.metrics[0].overrides[0].tagOverrides.host.value", "UPSERT"},
		{"remove with value", `spec: {metrics: [{overrides: [{tagOverrides: {host: {operation: REMOVE, value: x}}}]}]}`, "spec.metrics[0].overrides[0].tagOverrides.host.value", "REMOVE"},
		{"target refs", `spec: {targetRefs: [{kind: Gateway, name: gw}]}`, "spec.targetRefs", "selector"},
		{"bad enum", `spec: {metrics: [{overrides: [{match: {metric: REQUEST_COUNTS}}]}]}`, "spec", "REQUEST_COUNTS"},
	})
}

// The samples users copy (filters/deploy) must be accepted as they are.
func TestFilterSamplesAreAccepted(t *testing.T) {
	files, err := filepath.Glob("../../filters/deploy/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, d := range ParseFile(filepath.Base(f), data) {
			require.Nil(t, d.Err, "%s: %v", f, d.Err)
		}
	}
}

func TestExtensionKindsAccepted(t *testing.T) {
	docs := ParseFile("ok.yaml", []byte(efHeader+`
spec:
  workloadSelector: {labels: {app: reviews}}
  priority: -5
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND, cluster: {service: reviews.default.svc.cluster.local, portNumber: 9080}}
    patch: {operation: MERGE, value: {connect_timeout: 2s}}
  - applyTo: HTTP_FILTER
    match: {context: ANY, proxy: {proxyVersion: "^1\\..*"}}
    patch:
      operation: ADD
      filterClass: AUTHZ
      value: {name: envoy.filters.http.cors, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors}}
---
`+wpHeader+`
spec:
  url: https://example.com/f.wasm
  sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  phase: AUTHN
  priority: 3
  match: [{mode: CLIENT, ports: [{number: 9080}]}]
  vmConfig: {env: [{name: POD_NAME, valueFrom: HOST}, {name: A, value: b}]}
---
`+telHeader+`
spec:
  selector: {matchLabels: {app: reviews}}
  metrics:
  - providers: [{name: prometheus}]
    overrides:
    - match: {metric: REQUEST_COUNT, mode: CLIENT}
      disabled: true
    - match: {metric: ALL_METRICS}
      tagOverrides:
        request_host: {value: request.host}
        response_flags: {operation: REMOVE}
`))
	require.Len(t, docs, 3)
	for _, d := range docs {
		require.Nil(t, d.Err, "%v", d.Err)
	}
}
