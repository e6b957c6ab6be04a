//go:build !wasip1

// These tests run telemetry.wasm as Envoy would: two proxies, each a plugin on the
// proxy-wasm host in wazero, the client's sidecar (reporter=source) and the server's
// (reporter=destination), with real HTTP exchanges between them through the harness.

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// nodeProperty is the "node" property of a proxy of workload id, as the agent's bootstrap
// puts it in node.metadata.
func nodeProperty(id nodeIdentity, nodeID string) map[string]any {
	md := map[string]any{}
	for _, key := range scalarMetadataKeys {
		if v := *id.scalar(key); v != "" {
			md[key] = v
		}
	}
	if len(id.Labels) > 0 {
		md[metaLabels] = id.Labels
	}
	return map[string]any{"id": nodeID, "metadata": md}
}

func sidecar(t *testing.T, cfg string, id nodeIdentity, nodeID string, direction int64) *harness.Harness {
	t.Helper()
	return wasmtest.Harness(t, ".", harness.Options{
		Plugin: host.PluginConfig{Name: "stats", RootID: "stats_outbound", Configuration: []byte(cfg)},
		Properties: map[string]any{
			"node":               nodeProperty(id, nodeID),
			"listener_direction": direction,
		},
	})
}

// hop sends one request from productpage's sidecar to ratings' sidecar and back, with
// ratings answering status, and returns what each side's application saw.
func hop(t *testing.T, client, server *harness.Harness, status int, headers [][2]string) (clientRep, serverRep *harness.Report) {
	t.Helper()
	ctx := context.Background()
	clientRep, err := client.Do(ctx, harness.Request{
		Method: "GET", Path: "/ratings/0", Authority: "ratings:9080", Headers: headers,
		Info: host.StreamInfo{Protocol: "HTTP/1.1", ClusterName: "outbound|9080||ratings.prod.svc.cluster.local",
			Upstream: host.UpstreamInfo{URISanPeerCertificate: ratingsSAN, URISanLocalCertificate: productpageSAN}},
		Upstream: func(u harness.UpstreamRequest) harness.Response {
			var err error
			serverRep, err = server.Do(ctx, harness.Request{Headers: u.Headers,
				Info: host.StreamInfo{Protocol: "HTTP/1.1", ClusterName: "inbound|9080||",
					Connection: host.ConnectionInfo{MTLS: true, URISanPeerCertificate: productpageSAN,
						URISanLocalCertificate: ratingsSAN}},
				Response: harness.Response{Status: status, Headers: [][2]string{{"content-type", "application/json"}},
					Body: [][]byte{[]byte(`{"ratings":[5]}`)}}})
			require.NoError(t, err)
			return harness.Response{Status: serverRep.Client.Status, Headers: serverRep.Client.Headers, Body: [][]byte{serverRep.Client.Body}}
		},
	})
	require.NoError(t, err)
	require.NotNil(t, serverRep)
	return clientRep, serverRep
}

// series finds the one metric whose name, once the proxy's stats_tags rules for tagNames
// are applied, is want, and returns its labels.
func series(t *testing.T, h *harness.Harness, want string, tagNames []string) (map[string]string, host.MetricSnapshot) {
	t.Helper()
	var found []host.MetricSnapshot
	var labels map[string]string
	for _, m := range h.Metrics() {
		name, tags := extractTags(t, m.Name, tagNames)
		if name == want {
			found = append(found, m)
			labels = tags
		}
	}
	require.Len(t, found, 1, "series of %s", want)
	return labels, found[0]
}

func standardTags() []string { return statsplan.StandardLabelNames[:] }

func TestWasmHopBothReporters(t *testing.T) {
	client := sidecar(t, "", productpage, productpageNodeID, outbound)
	server := sidecar(t, "", ratings, ratingsNodeID, inbound)
	clientRep, serverRep := hop(t, client, server, 200, nil)

	// The exchange headers never reach either application.
	for _, h := range [][][2]string{serverRep.Upstream.Headers, clientRep.Client.Headers} {
		for _, kv := range h {
			assert.False(t, strings.HasPrefix(kv[0], "x-envoy-peer-metadata"), "%s reached the app", kv[0])
		}
	}
	assert.Equal(t, 200, clientRep.Status)

	src, m := series(t, client, "istio_requests_total", standardTags())
	assert.Equal(t, int64(1), m.Value)
	dst, m := series(t, server, "istio_requests_total", standardTags())
	assert.Equal(t, int64(1), m.Value)
	for label, want := range map[string][2]string{ // label: client's value, server's value
		"reporter":                       {"source", "destination"},
		"source_workload":                {"productpage-v1", "productpage-v1"},
		"source_workload_namespace":      {"default", "default"},
		"source_app":                     {"productpage", "productpage"},
		"source_version":                 {"v1", "v1"},
		"source_cluster":                 {"Kubernetes", "Kubernetes"},
		"source_principal":               {productpageSAN, productpageSAN},
		"destination_workload":           {"ratings-v1", "ratings-v1"},
		"destination_workload_namespace": {"prod", "prod"},
		"destination_app":                {"ratings", "ratings"},
		"destination_version":            {"v1", "v1"},
		"destination_cluster":            {"east", "east"},
		"destination_principal":          {ratingsSAN, ratingsSAN},
		"destination_service_name":       {"ratings", "ratings"},
		"destination_service_namespace":  {"prod", "prod"},
		"request_protocol":               {"http", "http"},
		"response_code":                  {"200", "200"},
		"response_flags":                 {"-", "-"},
		"connection_security_policy":     {"unknown", "mutual_tls"},
	} {
		assert.Equal(t, want[0], src[label], "client %s", label)
		assert.Equal(t, want[1], dst[label], "server %s", label)
	}
	assert.Equal(t, "ratings.prod.svc.cluster.local", src["destination_service"])

	for _, h := range []*harness.Harness{client, server} {
		_, d := series(t, h, "istio_request_duration_milliseconds", standardTags())
		assert.Equal(t, host.MetricHistogram, d.Type)
		assert.Equal(t, uint64(1), d.Count)
		_, b := series(t, h, "istio_response_bytes", standardTags())
		assert.Equal(t, uint64(1), b.Count)
	}
}

// A client whose peer sends nothing (a workload outside the mesh) reports unknown.
func TestWasmPeerWithoutMetadata(t *testing.T) {
	client := sidecar(t, "", productpage, productpageNodeID, outbound)
	rep, err := client.Do(context.Background(), harness.Request{Path: "/", Authority: "ext:80",
		Info:     host.StreamInfo{ClusterName: "outbound|80||ext.example.com"},
		Response: harness.Response{Status: 204}})
	require.NoError(t, err)
	assert.Equal(t, 204, rep.Status)
	labels, _ := series(t, client, "istio_requests_total", standardTags())
	assert.Equal(t, "unknown", labels["destination_workload"])
	assert.Equal(t, "unknown", labels["destination_app"])
	assert.Equal(t, "productpage-v1", labels["source_workload"])
	assert.Equal(t, "204", labels["response_code"])
}

// The annotation path: the plugin configuration adds a dimension, and it becomes a
// Prometheus label only when the proxy's stats_tags include it, which the agent writes for
// the pod annotation sidecar.istio.io/extraStatTags.
func TestWasmExtraDimensionNeedsItsStatsTag(t *testing.T) {
	cfg := `{"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`
	client := sidecar(t, cfg, productpage, productpageNodeID, outbound)
	server := sidecar(t, "", ratings, ratingsNodeID, inbound)
	hop(t, client, server, 200, [][2]string{{"x-user", "alice"}})

	labels, _ := series(t, client, "istio_requests_total", append(standardTags(), "user"))
	assert.Equal(t, "alice", labels["user"])
	assert.Equal(t, "source", labels["reporter"])

	// Without the extra stats tag the dimension stays in the name: no clean series.
	for _, m := range client.Metrics() {
		name, _ := extractTags(t, m.Name, standardTags())
		if strings.HasSuffix(name, "istio_requests_total") {
			assert.Equal(t, "user=.=alice;.;istio_requests_total", name)
		}
	}
}

func TestWasmBadConfigurationRefusesToStart(t *testing.T) {
	_, err := harness.New(context.Background(), harness.Options{Wasm: wasmtest.Bytes(t, "."),
		Plugin: host.PluginConfig{Name: "stats", Configuration: []byte(
			`{"metrics": [{"dimensions": {"user": "request.header['x-user']"}}]}`)}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown attribute request.header['x-user']`)
}

// The scenario in testdata, which the README shows users running with bin/filtertest.
func TestWasmScenarios(t *testing.T) { wasmtest.Scenarios(t, ".") }
