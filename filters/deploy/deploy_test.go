//go:build !wasip1

// Package deploy_test checks the samples that attach the mesh's filters to proxies, as
// users write them: each parses strictly into Istio's API types, each EnvoyFilter patch
// decodes into Envoy's Wasm HTTP or network filter and passes its validation, and the plugin
// configuration each sample carries configures the real filter, built to .wasm and run in
// wazero, with the behaviour the sample's comments promise.
package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmnetv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/wasm/v3"
	wasmextv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// document is one Kubernetes-style Istio resource.
type document struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

func load(t *testing.T, file string, spec proto.Message) document {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	var doc document
	require.NoError(t, yaml.UnmarshalStrict(raw, &doc), file)
	require.NotEmpty(t, doc.Metadata.Name, "%s: metadata.name", file)
	require.NotEmpty(t, doc.Metadata.Namespace, "%s: metadata.namespace", file)
	// protojson rejects unknown fields, so a misspelt field fails here, as in Istio's
	// validation webhook.
	require.NoError(t, protojson.Unmarshal(doc.Spec, spec), "%s: spec", file)
	return doc
}

// plugin is what a sample gives a proxy: which filter module, and its configuration.
type plugin struct {
	filter  string // the filter's source directory under filters/
	name    string
	vmID    string
	config  []byte
	fail    bool // fail open
	network bool // a network (TCP) filter
}

// filterDir maps a module path in a sample (/etc/istio/extensions/<name>.wasm) to the
// filter that make builds into build/wasm/<name>.wasm.
func filterDir(t *testing.T, modulePath string) string {
	t.Helper()
	base := path.Base(modulePath)
	require.True(t, strings.HasSuffix(base, ".wasm"), "module %q is not a .wasm file", modulePath)
	dir := filepath.Join("..", strings.TrimSuffix(base, ".wasm"))
	_, err := os.Stat(filepath.Join(dir, "main.go"))
	require.NoError(t, err, "module %q names no filter of this repository", modulePath)
	return dir
}

// envoyFilterPlugins checks every patch of an EnvoyFilter sample and returns the plugin
// each one configures.
func envoyFilterPlugins(t *testing.T, file string) []plugin {
	t.Helper()
	var ef networking.EnvoyFilter
	doc := load(t, file, &ef)
	require.Equal(t, "networking.istio.io/v1alpha3", doc.APIVersion)
	require.Equal(t, "EnvoyFilter", doc.Kind)
	require.NotEmpty(t, ef.GetConfigPatches())

	var plugins []plugin
	for i, p := range ef.GetConfigPatches() {
		assert.Equal(t, networking.EnvoyFilter_Patch_INSERT_BEFORE, p.GetPatch().GetOperation(), "patch %d", i)
		value, err := protojson.Marshal(p.GetPatch().GetValue())
		require.NoError(t, err)
		var cfg *wasmextv3.PluginConfig
		network := p.GetApplyTo() == networking.EnvoyFilter_NETWORK_FILTER
		if network {
			// Before tcp_proxy: a listener Filter holding Envoy's Wasm network filter.
			assert.Equal(t, "envoy.filters.network.tcp_proxy", p.GetMatch().GetListener().GetFilterChain().GetFilter().GetName(),
				"patch %d goes before tcp_proxy", i)
			var lf listenerv3.Filter
			require.NoError(t, protojson.Unmarshal(value, &lf), "patch %d value", i)
			require.NoError(t, lf.ValidateAll(), "patch %d value", i)
			var w wasmnetv3.Wasm
			require.NoError(t, lf.GetTypedConfig().UnmarshalTo(&w), "patch %d typed_config", i)
			require.NoError(t, w.ValidateAll(), "patch %d Wasm", i)
			cfg = w.GetConfig()
		} else {
			assert.Equal(t, networking.EnvoyFilter_HTTP_FILTER, p.GetApplyTo(), "patch %d", i)
			assert.Equal(t, "envoy.filters.http.router",
				p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName(),
				"patch %d goes before the router", i)
			// The patch value is an HttpFilter as Envoy reads it from the listener.
			var hf hcmv3.HttpFilter
			require.NoError(t, protojson.Unmarshal(value, &hf), "patch %d value", i)
			require.NoError(t, hf.ValidateAll(), "patch %d value", i)
			var w wasmv3.Wasm
			require.NoError(t, hf.GetTypedConfig().UnmarshalTo(&w), "patch %d typed_config", i)
			require.NoError(t, w.ValidateAll(), "patch %d Wasm", i)
			cfg = w.GetConfig()
		}
		var conf wrapperspb.StringValue
		require.NoError(t, cfg.GetConfiguration().UnmarshalTo(&conf),
			"patch %d: the plugin configuration is a StringValue, Istio's convention", i)
		require.True(t, json.Valid([]byte(conf.GetValue())), "patch %d configuration is JSON", i)
		plugins = append(plugins, plugin{
			filter: filterDir(t, cfg.GetVmConfig().GetCode().GetLocal().GetFilename()),
			name:   cfg.GetName(), vmID: cfg.GetVmConfig().GetVmId(),
			config: []byte(conf.GetValue()), fail: cfg.GetFailOpen(), network: network,
		})
	}
	return plugins
}

func wasmPlugin(t *testing.T, file string) (*extensions.WasmPlugin, plugin) {
	t.Helper()
	var wp extensions.WasmPlugin
	doc := load(t, file, &wp)
	require.Equal(t, "extensions.istio.io/v1alpha1", doc.APIVersion)
	require.Equal(t, "WasmPlugin", doc.Kind)
	u, err := url.Parse(wp.GetUrl())
	require.NoError(t, err)
	require.Equal(t, "file", u.Scheme, "the samples load the module from the proxy's disk")
	config, err := protojson.Marshal(wp.GetPluginConfig())
	require.NoError(t, err)
	return &wp, plugin{
		filter: filterDir(t, u.Path), name: doc.Metadata.Namespace + "." + doc.Metadata.Name,
		config: config, fail: wp.GetFailStrategy() == extensions.FailStrategy_FAIL_OPEN,
	}
}

// start runs the sample's plugin configuration on the real filter in wazero; a
// configuration the filter does not accept fails here.
func start(t *testing.T, p plugin, node map[string]any) *harness.Harness {
	t.Helper()
	return wasmtest.Harness(t, p.filter, harness.Options{
		Plugin:     host.PluginConfig{Name: p.name, VMID: p.vmID, Configuration: p.config, FailOpen: p.fail},
		Properties: map[string]any{"node": node},
	})
}

func do(t *testing.T, h *harness.Harness, headers ...[2]string) *harness.Report {
	t.Helper()
	rep, err := h.Do(context.Background(), harness.Request{Path: "/reviews/1", Authority: "reviews:9080", Headers: headers})
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	return rep
}

var reviewsNode = map[string]any{
	"id": "sidecar~127.10.0.2~reviews-v1-7d9f-abcde.default~default.svc.cluster.local",
	"metadata": map[string]any{
		"NAME": "reviews-v1-7d9f-abcde", "NAMESPACE": "default", "WORKLOAD_NAME": "reviews-v1",
		"LABELS": map[string]any{"app": "reviews", "version": "v1"},
	},
}

// requestsTotal finds the istio_requests_total series the request produced.
func requestsTotal(t *testing.T, rep *harness.Report) string {
	t.Helper()
	for _, m := range rep.Metrics {
		if strings.HasSuffix(m.Name, ";.;istio_requests_total") && m.Value == 1 {
			return m.Name
		}
	}
	t.Fatalf("no istio_requests_total series in %v", rep.Metrics)
	return ""
}

func TestTelemetryEnvoyFilter(t *testing.T) {
	plugins := envoyFilterPlugins(t, "telemetry.envoyfilter.yaml")
	require.Len(t, plugins, 4, "HTTP and TCP, one patch per direction each")
	var vms []string
	for _, p := range plugins {
		var cfg struct {
			Reporter string
			Network  bool
		}
		require.NoError(t, json.Unmarshal(p.config, &cfg))
		assert.Equal(t, p.network, cfg.Network, "%s: \"network\" says which filter type loads it", p.name)
		h := start(t, p, reviewsNode) // the plugin starts with the sample's configuration
		if p.network {
			vms = append(vms, p.vmID)
			continue // its TCP connections are run by meshproxy's e2e test
		}
		name := requestsTotal(t, do(t, h))
		// The dimensions the sample adds are in the name, for the pod's extraStatTags.
		assert.Contains(t, name, "request_host=.=reviews:9080;.;")
		assert.Contains(t, name, "request_method=.=GET;.;")
		assert.Contains(t, name, "reporter=.="+cfg.Reporter+";.;", p.name)
	}
	assert.Equal(t, plugins[0].vmID, plugins[1].vmID, "both HTTP directions share one VM")
	require.Len(t, vms, 2)
	assert.Equal(t, vms[0], vms[1], "both TCP directions share one VM")
}

func TestTelemetryWasmPlugin(t *testing.T) {
	wp, p := wasmPlugin(t, "telemetry.wasmplugin.yaml")
	assert.Equal(t, extensions.PluginPhase_STATS, wp.GetPhase())
	h := start(t, p, reviewsNode)
	name := requestsTotal(t, do(t, h))
	assert.Contains(t, name, "request_host=.=reviews:9080;.;")
	assert.Contains(t, name, "request_method=.=GET;.;")
}

// overLimit sends requests for user until one is refused and returns how many passed.
func overLimit(t *testing.T, h *harness.Harness, user string, most int) int {
	t.Helper()
	var headers [][2]string
	if user != "" {
		headers = append(headers, [2]string{"x-user", user})
	}
	for i := 0; i <= most; i++ {
		rep := do(t, h, headers...)
		if rep.Status == 429 {
			assert.NotEmpty(t, rep.Client.Header("x-ratelimit-limit"))
			assert.NotEmpty(t, rep.Client.Header("retry-after"))
			return i
		}
		require.Equal(t, 200, rep.Status)
	}
	return -1
}

func TestQuotaEnvoyFilter(t *testing.T) {
	plugins := envoyFilterPlugins(t, "quota.envoyfilter.yaml")
	require.Len(t, plugins, 1)
	var ef networking.EnvoyFilter
	load(t, "quota.envoyfilter.yaml", &ef)
	assert.Equal(t, map[string]string{"app": "reviews"}, ef.GetWorkloadSelector().GetLabels())

	h := start(t, plugins[0], reviewsNode)
	assert.Equal(t, 100, overLimit(t, h, "alice", 200), "alice's bucket holds 100 tokens")
	assert.Equal(t, 100, overLimit(t, h, "", 200), "callers without x-user share one bucket")
}

func TestQuotaWasmPlugin(t *testing.T) {
	wp, p := wasmPlugin(t, "quota.wasmplugin.yaml")
	assert.Equal(t, extensions.PluginPhase_AUTHZ, wp.GetPhase())
	assert.Equal(t, map[string]string{"app": "reviews"}, wp.GetSelector().GetMatchLabels())
	assert.False(t, p.fail, "the sample fails closed")

	h := start(t, p, reviewsNode)
	assert.Equal(t, 10, overLimit(t, h, "alice", 200))
	assert.Equal(t, 100, overLimit(t, h, "batch", 200), "the override gives batch 100")
	// Without x-user the descriptor does not apply: nothing limits the request.
	assert.Equal(t, -1, overLimit(t, h, "", 20))
}

// A misspelt field in a sample is an error that names it, not a silently ignored field.
func TestMisspeltFieldIsRejected(t *testing.T) {
	raw, err := os.ReadFile("quota.wasmplugin.yaml")
	require.NoError(t, err)
	bad := strings.Replace(string(raw), "failStrategy:", "failStrategey:", 1)
	var doc document
	require.NoError(t, yaml.Unmarshal([]byte(bad), &doc))
	err = protojson.Unmarshal(doc.Spec, &extensions.WasmPlugin{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "failStrategey")
}

func TestQuotaGlobalWasmPlugin(t *testing.T) {
	wp, p := wasmPlugin(t, "quota-global.wasmplugin.yaml")
	assert.Equal(t, extensions.PluginPhase_AUTHZ, wp.GetPhase())
	assert.Equal(t, map[string]string{"app": "productpage"}, wp.GetSelector().GetMatchLabels())
	assert.True(t, p.fail, "the sample fails open, as its global mode does")

	// A stand-in for the service on the sample's cluster: over the limit from the fourth
	// request on.
	var mu sync.Mutex
	var asked []*rlsv3.RateLimitRequest
	service := func(req *host.GRPCCallRequest) harness.GRPCCallAnswer {
		if req.Cluster != "outbound|8081||ratelimit.default.svc.cluster.local" || req.Authority != "ratelimit.default.svc.cluster.local" {
			return harness.GRPCCallAnswer{UnknownCluster: true}
		}
		var in rlsv3.RateLimitRequest
		if err := proto.Unmarshal(req.Message, &in); err != nil {
			return harness.GRPCError(3, err.Error())
		}
		mu.Lock()
		asked = append(asked, &in)
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		if len(asked) > 3 {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		mu.Unlock()
		b, err := proto.Marshal(resp)
		if err != nil {
			return harness.GRPCError(13, err.Error())
		}
		return harness.GRPCRespond(b)
	}
	h := wasmtest.Harness(t, p.filter, harness.Options{GRPCCalls: service,
		Plugin:     host.PluginConfig{Name: p.name, Configuration: p.config, FailOpen: p.fail},
		Properties: map[string]any{"node": productpageNode}})
	var got []int
	for range 4 {
		got = append(got, do(t, h, [2]string{"x-user", "alice"}).Status)
	}
	assert.Equal(t, []int{200, 200, 200, 429}, got)

	// The sample asks what Envoy's native filter, configured by ratelimit.envoyfilter.yaml,
	// asks for the same request: one service configuration serves both.
	filter, vhost := nativeRateLimit(t)
	require.NotEmpty(t, asked)
	assert.Equal(t, filter.GetDomain(), asked[0].GetDomain())
	assert.Equal(t, nativeDescriptors(vhost, map[string]string{"x-user": "alice"}), descriptorsOf(asked[0]))

	// Without the service, the sample's failure policy lets requests go.
	h = start(t, p, productpageNode)
	assert.Equal(t, 200, do(t, h, [2]string{"x-user", "alice"}).Status)
	m, ok := h.Metric("wasmesh_quota_global_failure_mode_allowed_total")
	require.True(t, ok)
	assert.Equal(t, int64(1), m.Value)
}

func descriptorsOf(req *rlsv3.RateLimitRequest) [][][2]string {
	var out [][][2]string
	for _, d := range req.GetDescriptors() {
		var entries [][2]string
		for _, e := range d.GetEntries() {
			entries = append(entries, [2]string{e.GetKey(), e.GetValue()})
		}
		out = append(out, entries)
	}
	return out
}

// nativeDescriptors evaluates the virtual host's rate_limits actions the way Envoy does
// for a request with these headers: a generic_key action gives its key (default
// "generic_key") and value; a request_headers action gives the header's value, and a
// rate limit with an absent header gives no descriptor.
func nativeDescriptors(vhost *routev3.VirtualHost, headers map[string]string) [][][2]string {
	var out [][][2]string
	for _, rl := range vhost.GetRateLimits() {
		var entries [][2]string
		complete := true
		for _, a := range rl.GetActions() {
			switch {
			case a.GetGenericKey() != nil:
				key := a.GetGenericKey().GetDescriptorKey()
				if key == "" {
					key = "generic_key"
				}
				entries = append(entries, [2]string{key, a.GetGenericKey().GetDescriptorValue()})
			case a.GetRequestHeaders() != nil:
				v, ok := headers[a.GetRequestHeaders().GetHeaderName()]
				complete = complete && ok
				entries = append(entries, [2]string{a.GetRequestHeaders().GetDescriptorKey(), v})
			default:
				panic(fmt.Sprintf("action %v is not evaluated here", a))
			}
		}
		if complete {
			out = append(out, entries)
		}
	}
	return out
}

var productpageNode = map[string]any{
	"id": "sidecar~127.10.0.5~productpage-v1-5c7f-fghij.default~default.svc.cluster.local",
	"metadata": map[string]any{
		"NAME": "productpage-v1-5c7f-fghij", "NAMESPACE": "default", "WORKLOAD_NAME": "productpage-v1",
		"LABELS": map[string]any{"app": "productpage", "version": "v1"},
	},
}

// nativeRateLimit checks ratelimit.envoyfilter.yaml, Envoy's native rate limit filter
// attached by EnvoyFilter: the filter passes Envoy's validation, and the virtual host it
// patches still does once merged into the one Istio generates for the inbound port. It
// returns the filter and the merged virtual host.
func nativeRateLimit(t *testing.T) (*ratelimitv3.RateLimit, *routev3.VirtualHost) {
	t.Helper()
	var ef networking.EnvoyFilter
	load(t, "ratelimit.envoyfilter.yaml", &ef)
	assert.Equal(t, map[string]string{"app": "productpage"}, ef.GetWorkloadSelector().GetLabels())
	patches := ef.GetConfigPatches()
	require.Len(t, patches, 2)

	filter := patches[0]
	assert.Equal(t, networking.EnvoyFilter_HTTP_FILTER, filter.GetApplyTo())
	assert.Equal(t, networking.EnvoyFilter_Patch_INSERT_BEFORE, filter.GetPatch().GetOperation())
	assert.Equal(t, "envoy.filters.http.router", filter.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName())
	value, err := protojson.Marshal(filter.GetPatch().GetValue())
	require.NoError(t, err)
	var hf hcmv3.HttpFilter
	require.NoError(t, protojson.Unmarshal(value, &hf))
	require.NoError(t, hf.ValidateAll())
	assert.Equal(t, "envoy.filters.http.ratelimit", hf.GetName())
	var rl ratelimitv3.RateLimit
	require.NoError(t, hf.GetTypedConfig().UnmarshalTo(&rl))
	require.NoError(t, rl.ValidateAll())

	vhost := patches[1]
	assert.Equal(t, networking.EnvoyFilter_VIRTUAL_HOST, vhost.GetApplyTo())
	assert.Equal(t, networking.EnvoyFilter_Patch_MERGE, vhost.GetPatch().GetOperation())
	name := vhost.GetMatch().GetRouteConfiguration().GetVhost().GetName()
	value, err = protojson.Marshal(vhost.GetPatch().GetValue())
	require.NoError(t, err)
	var patch routev3.VirtualHost
	require.NoError(t, protojson.Unmarshal(value, &patch))
	merged := &routev3.VirtualHost{Name: name, Domains: []string{"*"}, Routes: []*routev3.Route{{
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "inbound|9080||"}}},
	}}}
	proto.Merge(merged, &patch)
	require.NoError(t, merged.ValidateAll())
	return &rl, merged
}

func TestNativeRateLimitEnvoyFilter(t *testing.T) {
	rl, vhost := nativeRateLimit(t)
	assert.Equal(t, "wasmesh", rl.GetDomain())
	assert.False(t, rl.GetFailureModeDeny())
	assert.Equal(t, 20*time.Millisecond, rl.GetTimeout().AsDuration())
	assert.Equal(t, corev3.ApiVersion_V3, rl.GetRateLimitService().GetTransportApiVersion())
	assert.Equal(t, "outbound|8081||ratelimit.default.svc.cluster.local",
		rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName())
	assert.Equal(t, [][][2]string{{{"generic_key", "front"}}, {{"user", "bob"}}},
		nativeDescriptors(vhost, map[string]string{"x-user": "bob"}))
	assert.Equal(t, [][][2]string{{{"generic_key", "front"}}}, nativeDescriptors(vhost, nil),
		"without x-user the per-user descriptor is not sent")
}
