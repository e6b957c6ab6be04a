package envoytypes_test

import (
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

func value(t *testing.T, y string) *structpb.Struct {
	t.Helper()
	var m map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(y), &m))
	s, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return s
}

func TestDecodeHTTPFilter(t *testing.T) {
	m, err := envoytypes.Decode(networking.EnvoyFilter_HTTP_FILTER, value(t, `
name: wasmesh.quota
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
  config:
    vm_config: {runtime: envoy.wasm.runtime.v8, code: {local: {filename: /q.wasm}}}
`))
	require.NoError(t, err)
	hf := m.(*hcm.HttpFilter)
	assert.Equal(t, "wasmesh.quota", hf.GetName())
	assert.Equal(t, "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm", hf.GetTypedConfig().GetTypeUrl())
	require.NoError(t, envoytypes.Validate(hf))
}

func TestDecodeErrorsNameTheProblem(t *testing.T) {
	_, err := envoytypes.Decode(networking.EnvoyFilter_HTTP_FILTER, value(t, `{name: x, typed_confg: {}}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "typed_confg")

	_, err = envoytypes.Decode(networking.EnvoyFilter_HTTP_FILTER, value(t, `
name: x
typed_config: {"@type": type.googleapis.com/envoy.config.filter.http.lua.v2.Lua}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "envoy.config.filter.http.lua.v2.Lua")

	_, err = envoytypes.Decode(networking.EnvoyFilter_BOOTSTRAP, value(t, `{}`))
	require.ErrorContains(t, err, "BOOTSTRAP")
}

func TestValidateLooksInsideTypedConfigs(t *testing.T) {
	// An HTTP filter without a name is invalid, but only the connection manager's own
	// validation says so: the listener's ValidateAll stops at the typed_config Any.
	m := &hcm.HttpConnectionManager{StatPrefix: "x", HttpFilters: []*hcm.HttpFilter{{Name: ""}}}
	a, err := anypb.New(m)
	require.NoError(t, err)
	l := &listener.Listener{Name: "l", FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
		Name: "envoy.filters.network.http_connection_manager", ConfigType: &listener.Filter_TypedConfig{TypedConfig: a},
	}}}}}
	require.NoError(t, l.ValidateAll())
	err = envoytypes.Validate(l)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "filter_chains[0].filters[0].typed_config (envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager)")
	assert.Contains(t, err.Error(), "Name")

	l.FilterChains[0].Filters[0].GetTypedConfig().TypeUrl = "type.googleapis.com/no.such.Type"
	assert.ErrorContains(t, envoytypes.Validate(l), `unknown type "type.googleapis.com/no.such.Type"`)
}

func TestValidateEnvoyLoadRules(t *testing.T) {
	router, err := anypb.New(&routerv3.Router{})
	require.NoError(t, err)
	cors, err := anypb.New(&corsv3.Cors{})
	require.NoError(t, err)
	m := &hcm.HttpConnectionManager{StatPrefix: "x", RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{RouteConfigName: "r", ConfigSource: &core.ConfigSource{ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}}}, HttpFilters: []*hcm.HttpFilter{
		{Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: router}},
		{Name: "envoy.filters.http.cors", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: cors}},
	}}
	assert.ErrorContains(t, envoytypes.Validate(m), "must be the last HTTP filter")
	m.HttpFilters = m.HttpFilters[1:]
	assert.ErrorContains(t, envoytypes.Validate(m), "not a terminal filter")
	m.HttpFilters = nil
	assert.NoError(t, envoytypes.Validate(m))

	rc := &route.RouteConfiguration{Name: "r", VirtualHosts: []*route.VirtualHost{
		{Name: "a", Domains: []string{"x", "y"}}, {Name: "b", Domains: []string{"y"}},
	}}
	assert.ErrorContains(t, envoytypes.Validate(rc), `domain "y" is in virtual hosts a and b`)
}
