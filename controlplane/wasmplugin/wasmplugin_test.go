package wasmplugin_test

import (
	"testing"

	wasmhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
	"github.com/wasmesh/wasmesh/controlplane/wasmplugin"
)

func index(t *testing.T, docs string) *config.Index {
	t.Helper()
	var cs []*config.Config
	for _, d := range config.ParseFile("wp.yaml", []byte(docs)) {
		require.Nil(t, d.Err, "%v", d.Err)
		cs = append(cs, d.Config)
	}
	return config.NewIndex(cs)
}

func wp(ns, name, spec string) string {
	return "---\napiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec: " + spec + "\n"
}

func TestOrderByPhaseThenPriority(t *testing.T) {
	ix := index(t, wp("default", "unspecified", `{url: "file:///u.wasm"}`)+
		wp("default", "stats", `{url: "file:///s.wasm", phase: STATS}`)+
		wp("istio-system", "authz-low", `{url: "file:///a.wasm", phase: AUTHZ, priority: 1}`)+
		wp("default", "authz-high", `{url: "file:///a.wasm", phase: AUTHZ, priority: 100}`)+
		wp("default", "authz-tie-b", `{url: "file:///a.wasm", phase: AUTHZ, priority: 1}`)+
		wp("default", "authn", `{url: "file:///n.wasm", phase: AUTHN, selector: {matchLabels: {app: reviews}}}`)+
		wp("default", "other-app", `{url: "file:///n.wasm", selector: {matchLabels: {app: ratings}}}`)+
		wp("other", "other-ns", `{url: "file:///n.wasm"}`))
	var names []string
	for _, p := range wasmplugin.ForProxy(ix, "istio-system", "default", map[string]string{"app": "reviews"}) {
		names = append(names, p.Name)
	}
	assert.Equal(t, []string{"default.authn", "default.authz-high", "default.authz-tie-b", "istio-system.authz-low", "default.stats", "default.unspecified"}, names)
}

func TestMatchModesAndPorts(t *testing.T) {
	ix := index(t, wp("default", "m", `{url: "file:///m.wasm", match: [{mode: CLIENT, ports: [{number: 9080}]}, {mode: SERVER}]}`))
	p := wasmplugin.ForProxy(ix, "istio-system", "default", nil)[0]
	assert.True(t, p.Matches(false, 9080))
	assert.False(t, p.Matches(false, 9081), "outbound only to 9080")
	assert.True(t, p.Matches(true, 8080), "inbound on every port")
}

func TestExtensionConfig(t *testing.T) {
	ix := index(t, wp("istio-system", "telemetry", `{url: "file:///etc/istio/extensions/telemetry.wasm", pluginName: root, failStrategy: FAIL_OPEN,
  pluginConfig: {b: 1, a: {c: [x]}}, vmConfig: {env: [{name: POD, valueFrom: HOST}, {name: K, value: v}]}}`))
	p := wasmplugin.ForProxy(ix, "istio-system", "default", nil)[0]
	assert.True(t, p.Telemetry)
	cfg, err := p.ConfigJSON()
	require.NoError(t, err)
	assert.Equal(t, `{"a":{"c":["x"]},"b":1}`, cfg, "keys sorted, so equal configurations give equal resources")
	tec, err := p.ExtensionConfig("istio-system.telemetry", cfg)
	require.NoError(t, err)
	require.NoError(t, envoytypes.Validate(tec))
	var w wasmhttp.Wasm
	require.NoError(t, tec.GetTypedConfig().UnmarshalTo(&w))
	pc := w.GetConfig()
	assert.Equal(t, "istio-system.telemetry", pc.GetName())
	assert.Equal(t, "root", pc.GetRootId())
	assert.True(t, pc.GetFailOpen()) //nolint:staticcheck // what older proxies read
	assert.Equal(t, wasmv3.FailurePolicy_FAIL_OPEN, pc.GetFailurePolicy())
	assert.Equal(t, "/etc/istio/extensions/telemetry.wasm", pc.GetVmConfig().GetCode().GetLocal().GetFilename())
	assert.Equal(t, []string{"POD"}, pc.GetVmConfig().GetEnvironmentVariables().GetHostEnvKeys())
	assert.Equal(t, map[string]string{"K": "v"}, pc.GetVmConfig().GetEnvironmentVariables().GetKeyValues())
	var sv wrapperspb.StringValue
	require.NoError(t, pc.GetConfiguration().UnmarshalTo(&sv))
	assert.Equal(t, cfg, sv.GetValue())

	// A module not fetched yet cannot be served.
	ix = index(t, wp("default", "remote", `{url: "https://example.com/q.wasm", sha256: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}`))
	_, err = wasmplugin.ForProxy(ix, "istio-system", "default", nil)[0].ExtensionConfig("default.remote", "")
	assert.ErrorContains(t, err, "has not been fetched")
}
