package telemetryapi_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/telemetryapi"
)

func tel(ns, name, spec string) string {
	return "---\napiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec:\n" + spec + "\n"
}

func overlay(t *testing.T, mesh *meshconfig.MeshConfig, labels map[string]string, docs string) *telemetryapi.Overlay {
	t.Helper()
	var cs []*config.Config
	for _, d := range config.ParseFile("t.yaml", []byte(docs)) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	return telemetryapi.Build(mesh, telemetryapi.Select(config.NewIndex(cs), "istio-system", "default", labels))
}

func apply(t *testing.T, o *telemetryapi.Overlay, cfg string, inbound bool) string {
	t.Helper()
	out, problems, err := o.Apply(cfg, inbound)
	require.NoError(t, err)
	require.Empty(t, problems)
	return out
}

const docs = `` +
	// Mesh-wide: no request size metric, and no response flags tag anywhere.
	`---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: mesh-default, namespace: istio-system}
spec:
  metrics:
  - overrides:
    - match: {metric: REQUEST_SIZE}
      disabled: true
    - tagOverrides: {response_flags: {operation: REMOVE}}
` +
	// The namespace adds the request host on the client side of requests_total.
	`---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: ns, namespace: default}
spec:
  metrics:
  - providers: [{name: prometheus}]
    overrides:
    - match: {metric: REQUEST_COUNT, mode: CLIENT}
      tagOverrides: {request_host: {value: request.host}}
` +
	// The reviews workload wants its request size metric back.
	`---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: reviews, namespace: default}
spec:
  selector: {matchLabels: {app: reviews}}
  metrics:
  - overrides:
    - match: {metric: REQUEST_SIZE, mode: CLIENT_AND_SERVER}
      disabled: false
`

func TestMostSpecificWins(t *testing.T) {
	o := overlay(t, nil, map[string]string{"app": "reviews"}, docs)
	require.NotNil(t, o)
	assert.Equal(t, []config.Key{{Kind: config.Telemetry, Namespace: "istio-system", Name: "mesh-default"},
		{Kind: config.Telemetry, Namespace: "default", Name: "ns"}, {Kind: config.Telemetry, Namespace: "default", Name: "reviews"}}, o.Sources)
	assert.True(t, o.Split(), "the client side has a tag the server side has not")

	plugin := `{"max_label_sets_per_metric":1000,"metrics":[{"dimensions":{"request_method":"request.method"},"name":"requests_total"}]}`
	assert.Equal(t, `{"max_label_sets_per_metric":1000,"metrics":[`+
		`{"dimensions":{"request_method":"request.method"},"name":"requests_total"},`+
		`{"name":"request_bytes","tags_to_remove":["response_flags"]},`+
		`{"name":"request_duration_milliseconds","tags_to_remove":["response_flags"]},`+
		`{"name":"requests_total","dimensions":{"request_host":"request.host"},"tags_to_remove":["response_flags"]},`+
		`{"name":"response_bytes","tags_to_remove":["response_flags"]}]}`,
		apply(t, o, plugin, false))
	assert.Equal(t, `{"metrics":[`+
		`{"name":"request_bytes","tags_to_remove":["response_flags"]},`+
		`{"name":"request_duration_milliseconds","tags_to_remove":["response_flags"]},`+
		`{"name":"requests_total","tags_to_remove":["response_flags"]},`+
		`{"name":"response_bytes","tags_to_remove":["response_flags"]}]}`,
		apply(t, o, "", true))

	// Another workload of the namespace keeps the mesh-wide disabled request size metric.
	o = overlay(t, nil, map[string]string{"app": "ratings"}, docs)
	assert.Contains(t, apply(t, o, "", true), `"name":"request_bytes","tags_to_remove":["response_flags"],"drop":true`)
}

func TestNoTelemetryNoOverlay(t *testing.T) {
	o := overlay(t, nil, nil, tel("other", "x", `  metrics: [{overrides: [{disabled: true}]}]`))
	assert.Nil(t, o)
	out, _, err := o.Apply(`{"a":1}`, true)
	require.NoError(t, err)
	assert.Equal(t, `{"a":1}`, out)
	assert.Equal(t, "", o.Key(true))
}

func TestProvidersOutOfScopeDropEverything(t *testing.T) {
	mesh := &meshconfig.MeshConfig{ExtensionProviders: []*meshconfig.MeshConfig_ExtensionProvider{
		{Name: "stackdriver", Provider: &meshconfig.MeshConfig_ExtensionProvider_Stackdriver{}},
		{Name: "prom", Provider: &meshconfig.MeshConfig_ExtensionProvider_Prometheus{}},
	}}
	o := overlay(t, mesh, nil, tel("default", "sd", `  metrics: [{providers: [{name: stackdriver}], overrides: [{match: {metric: REQUEST_COUNT}, tagOverrides: {x: {value: "'y'"}}}]}]`))
	assert.Equal(t, `{"metrics":[{"drop":true}]}`, apply(t, o, "", false))

	// A mesh Prometheus provider under another name is the telemetry filter.
	o = overlay(t, mesh, nil, tel("default", "p", `  metrics: [{providers: [{name: prom}], overrides: [{match: {metric: REQUEST_DURATION, mode: SERVER}, disabled: true}]}]`))
	assert.Equal(t, `{"metrics":[{"name":"request_duration_milliseconds","drop":true}]}`, apply(t, o, "", true))
	assert.Equal(t, `{}`, apply(t, o, "", false))
}

func TestCustomMetricsAndUnknownTags(t *testing.T) {
	o := overlay(t, nil, nil, tel("default", "c", `  metrics:
  - overrides:
    - match: {customMetric: custom_bytes}
      tagOverrides: {path: {value: request.path}, nothing_reports_this: {operation: REMOVE}}
    - match: {customMetric: undefined_metric}
      disabled: true
    - match: {metric: TCP_SENT_BYTES}
      disabled: true`))
	plugin := `{"definitions":[{"name":"custom_bytes","type":"HISTOGRAM","value":"response.total_size"}]}`
	out, problems, err := o.Apply(plugin, false)
	require.NoError(t, err)
	assert.Equal(t, `{"definitions":[{"name":"custom_bytes","type":"HISTOGRAM","value":"response.total_size"}],`+
		`"metrics":[{"name":"custom_bytes","dimensions":{"path":"request.path"}}]}`, out,
		"removing a tag nothing reports changes nothing; TCP metrics are not reported by the filter")
	require.Len(t, problems, 1)
	assert.Equal(t, config.Key{Kind: config.Telemetry, Namespace: "default", Name: "c"}, problems[0].Source)
	assert.ErrorContains(t, problems[0].Err, `custom metric "undefined_metric"`)

	_, _, err = o.Apply(`not json`, false)
	assert.Error(t, err)
}
