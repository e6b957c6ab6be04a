package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// wasmFixture returns the path of a filter built by `make wasm`, skipping the test (or
// failing it under WASMESH_REQUIRE_FIXTURES=1) when it is missing.
func wasmFixture(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("WASMESH_WASM_DIR")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "build", "wasm")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		msg := fmt.Sprintf("%s not found (%v): run `make wasm` (or `make test`, which builds it)", p, err)
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// istioLabels are the standard labels of Istio's metrics; the bootstrap turns each into a
// stats tag, as the agent does.
var istioLabels = []string{"reporter", "source_workload", "source_workload_namespace", "source_principal",
	"source_app", "source_version", "source_canonical_service", "source_canonical_revision", "source_cluster",
	"destination_workload", "destination_workload_namespace", "destination_principal", "destination_app",
	"destination_version", "destination_service", "destination_service_name", "destination_service_namespace",
	"destination_canonical_service", "destination_canonical_revision", "destination_cluster", "request_protocol",
	"response_code", "grpc_response_status", "response_flags", "connection_security_policy"}

func statsTagsYAML() string {
	var b strings.Builder
	b.WriteString("stats_config:\n  stats_tags:\n")
	for _, l := range istioLabels {
		fmt.Fprintf(&b, "  - {tag_name: %s, regex: '(%s=\\.=(.*?);\\.;)'}\n", l, l)
	}
	return b.String()
}

func wasmFilterConfig(t *testing.T, name, file, config string, failOpen bool) *anypb.Any {
	t.Helper()
	cfg, err := anypb.New(wrapperspb.String(config))
	require.NoError(t, err)
	w := &wasmhttpv3.Wasm{Config: &wasmv3.PluginConfig{
		Name: name, RootId: name, FailOpen: failOpen, Configuration: cfg,
		Vm: &wasmv3.PluginConfig_VmConfig{VmConfig: &wasmv3.VmConfig{VmId: name, Runtime: "envoy.wasm.runtime.v8",
			Code: &corev3.AsyncDataSource{Specifier: &corev3.AsyncDataSource_Local{Local: &corev3.DataSource{
				Specifier: &corev3.DataSource_Filename{Filename: file}}}}}},
	}}
	a, err := anypb.New(w)
	require.NoError(t, err)
	return a
}

func ecdsFilter(name string) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_ConfigDiscovery{ConfigDiscovery: &corev3.ExtensionConfigSource{
		ConfigSource: &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}},
		TypeUrls: []string{"type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"},
	}}}
}

func typedExt(name string, a *anypb.Any) *corev3.TypedExtensionConfig {
	return &corev3.TypedExtensionConfig{Name: name, TypedConfig: a}
}

func TestWasmFiltersThroughECDS(t *testing.T) {
	telemetry := wasmFixture(t, "telemetry.wasm")
	quota := wasmFixture(t, "quota.wasm")
	up := newUpstream(t, "svc", false, nil)
	cp := newControlPlane(t, "")
	quotaCfg := `{"descriptors":[{"name":"all","entries":[{"key":"method","source":"method"}],` +
		`"token_bucket":{"max_tokens":3,"tokens_per_fill":1,"fill_interval":"1h"}}]}`
	res := func(telemetryCode *anypb.Any) map[resourcev3.Type][]types.Resource {
		return map[resourcev3.Type][]types.Resource{
			resourcev3.ClusterType:  {edsCluster("svc")},
			resourcev3.EndpointType: {endpoints("svc", addr(up))},
			resourcev3.ListenerType: {
				httpListener(t, "in", "r1", corev3.TrafficDirection_INBOUND, ecdsFilter("default.telemetry")),
				httpListener(t, "out", "r1", corev3.TrafficDirection_OUTBOUND, ecdsFilter("default.telemetry"), ecdsFilter("default.quota")),
			},
			resourcev3.RouteType: {routeTo("r1", "svc")},
			resourcev3.ExtensionConfigType: {
				typedExt("default.telemetry", telemetryCode),
				typedExt("default.quota", wasmFilterConfig(t, "quota", quota, quotaCfg, false)),
			},
		}
	}
	cp.set("v1", res(wasmFilterConfig(t, "telemetry", telemetry, "{}", true)))
	p := proxytest.Start(t, proxytest.Options{Bootstrap: adsBootstrap(cp.addr, false) + statsTagsYAML() + `
node:
  id: "` + testNode + `"
  cluster: ads.default
  metadata: {NAME: web-1, NAMESPACE: default, WORKLOAD_NAME: web, CLUSTER_ID: Kubernetes, MESH_ID: cluster.local,
             LABELS: {app: web, version: v1}}
`})
	c := client(t)
	in := "http://" + p.ListenerAddr("in")
	out := "http://" + p.ListenerAddr("out")
	for i := 0; i < 2; i++ {
		assert.Equal(t, 200, do(t, c, "GET", in+"/", "", nil).code)
	}
	// The quota filter on the outbound listener allows three requests, then 429.
	codes := []int{}
	for i := 0; i < 4; i++ {
		codes = append(codes, do(t, c, "GET", out+"/", "", nil).code)
	}
	assert.Equal(t, []int{200, 200, 200, 429}, codes)

	var prom string
	p.Eventually(10*time.Second, "istio_requests_total for both reporters", func() bool {
		_, prom = p.Get("/stats/prometheus")
		return regexp.MustCompile(`(?m)^istio_requests_total\{[^}]*reporter="destination"[^}]*\} 2$`).MatchString(prom) &&
			regexp.MustCompile(`(?m)^istio_requests_total\{[^}]*reporter="source"[^}]*response_code="200"[^}]*\} 3$`).MatchString(prom)
	})
	assert.Regexp(t, `(?m)^istio_requests_total\{[^}]*source_workload="web"`, prom, "node metadata reaches the filter")
	assert.Regexp(t, `(?m)^# TYPE istio_request_duration_milliseconds histogram$`, prom)
	assert.Regexp(t, `(?m)^istio_request_duration_milliseconds_bucket\{[^}]*le="0.5"\} \d+$`, prom)
	assert.NotContains(t, prom, "envoy_istio_requests_total", "wasm metrics get no envoy_ prefix")
	assert.Contains(t, prom, "envoy_cluster_upstream_rq_total{envoy_cluster_name=\"svc\"}", "Envoy's own stats do")
	_, text := p.Get("/stats?filter=istio_requests_total")
	assert.Contains(t, text, "reporter=.=destination;.;")

	// A module that does not load is NACKed naming the ECDS resource; the filter keeps
	// running the last good module.
	bogus := filepath.Join(t.TempDir(), "bogus.wasm")
	require.NoError(t, os.WriteFile(bogus, []byte("not wasm"), 0o644))
	cp.set("v2", res(wasmFilterConfig(t, "telemetry", bogus, "{}", true)))
	p.Eventually(10*time.Second, "a NACK naming default.telemetry", func() bool {
		for _, m := range cp.nackMessages() {
			if strings.Contains(m, resourcev3.ExtensionConfigType) && strings.Contains(m, "default.telemetry:") {
				return true
			}
		}
		return false
	})
	assert.Equal(t, 200, do(t, c, "GET", in+"/", "", nil).code)
	p.Eventually(10*time.Second, "the old module counting", func() bool {
		_, prom = p.Get("/stats/prometheus")
		return regexp.MustCompile(`(?m)^istio_requests_total\{[^}]*reporter="destination"[^}]*\} 3$`).MatchString(prom)
	})
}
