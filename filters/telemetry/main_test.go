//go:build !wasip1

// These tests drive the filter through the SDK's proxytest emulator, which only the
// forwarding (non-wasip1) build of the proxywasm package talks to. The emulator is one
// host per process with one plugin, so a client-side and a server-side proxy are
// emulated one after the other, passing the headers each produced to the next.

package main

import (
	"encoding/binary"
	"sort"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/internal/emulator"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// Two workloads of the Bookinfo sample.
var (
	productpage = nodeIdentity{
		Name: "productpage-v1-6b746f74dc-9stvs", Namespace: "default", WorkloadName: "productpage-v1",
		Owner: "kubernetes://apis/apps/v1/namespaces/default/deployments/productpage-v1", ClusterID: "Kubernetes",
		MeshID: "cluster.local", ServiceAccount: "bookinfo-productpage",
		Labels: map[string]string{"app": "productpage", "version": "v1", "pod-template-hash": "6b746f74dc"},
	}
	ratings = nodeIdentity{
		Name: "ratings-v1-b6994bb9-gh4c7", Namespace: "prod", WorkloadName: "ratings-v1", ClusterID: "east",
		MeshID: "cluster.local", ServiceAccount: "bookinfo-ratings",
		Labels: map[string]string{labelK8sName: "ratings", labelK8sVersion: "v1", labelCanonicalRevision: "r7"},
	}
)

const (
	productpageNodeID = "sidecar~10.0.0.1~productpage-v1-6b746f74dc-9stvs.default~default.svc.cluster.local"
	ratingsNodeID     = "sidecar~10.0.0.2~ratings-v1-b6994bb9-gh4c7.prod~prod.svc.cluster.local"
	productpageSAN    = "spiffe://cluster.local/ns/default/sa/bookinfo-productpage"
	ratingsSAN        = "spiffe://cluster.local/ns/prod/sa/bookinfo-ratings"
)

func le64(n int64) []byte { return binary.LittleEndian.AppendUint64(nil, uint64(n)) }

// serializePairs encodes a map property the way proxy-wasm hosts do.
func serializePairs(m map[string]string) []byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(keys)))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(m[k])))
	}
	for _, k := range keys {
		b = append(append(b, k...), 0)
		b = append(append(b, m[k]...), 0)
	}
	return b
}

// proxy is one emulated proxy running the filter.
type proxy struct {
	t    testing.TB
	host proxytest.HostEmulator
	vm   *vmContext
}

// direction values of Envoy's listener_direction.
const (
	inbound  = 1
	outbound = 2
)

// startProxy starts the filter with cfg on a proxy of workload id (nodeID ""
// omits node.id); direction 0 leaves listener_direction unset.
func startProxy(t testing.TB, cfg string, id nodeIdentity, nodeID string, direction int64) (*proxy, types.OnPluginStartStatus) {
	t.Helper()
	vm := &vmContext{}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
	for _, key := range scalarMetadataKeys {
		if v := *id.scalar(key); v != "" {
			opt.WithProperty([]string{"node", "metadata", key}, []byte(v))
		}
	}
	if len(id.Labels) > 0 {
		opt.WithProperty([]string{"node", "metadata", metaLabels}, serializePairs(id.Labels))
	}
	if nodeID != "" {
		opt.WithProperty([]string{"node", "id"}, []byte(nodeID))
	}
	if direction != 0 {
		opt.WithProperty([]string{"listener_direction"}, le64(direction))
	}
	host := emulator.Start(t, opt)
	return &proxy{t: t, host: host, vm: vm}, host.StartPlugin()
}

func mustStart(t testing.TB, cfg string, id nodeIdentity, nodeID string, direction int64) *proxy {
	t.Helper()
	p, status := startProxy(t, cfg, id, nodeID, direction)
	require.Equal(t, types.OnPluginStartStatusOK, status, "critical logs: %v", p.host.GetCriticalLogs())
	return p
}

// exchange is one request through a proxy.
type exchange struct {
	reqHeaders   [][2]string
	reqBody      []byte
	props        map[string][]byte // dotted path -> value, set before the response
	respHeaders  [][2]string       // nil: the stream ends without a response
	respBody     []byte
	respTrailers [][2]string
}

// result is what the proxy let through.
type result struct {
	reqHeaders, respHeaders [][2]string
}

func (p *proxy) do(x exchange) result {
	p.t.Helper()
	h := p.host
	id := h.InitializeHttpContext()
	require.Equal(p.t, types.ActionContinue, h.CallOnRequestHeaders(id, x.reqHeaders, x.reqBody == nil))
	if x.reqBody != nil {
		h.CallOnRequestBody(id, x.reqBody, true)
	}
	var r result
	r.reqHeaders = h.GetCurrentRequestHeaders(id)
	for path, v := range x.props {
		require.NoError(p.t, h.SetProperty(strings.Split(path, "."), v))
	}
	if x.respHeaders != nil {
		require.Equal(p.t, types.ActionContinue, h.CallOnResponseHeaders(id, x.respHeaders, x.respBody == nil && x.respTrailers == nil))
		if x.respBody != nil {
			h.CallOnResponseBody(id, x.respBody, x.respTrailers == nil)
		}
		if x.respTrailers != nil {
			h.CallOnResponseTrailers(id, x.respTrailers)
		}
		r.respHeaders = h.GetCurrentResponseHeaders(id)
	}
	h.CompleteHttpContext(id)
	return r
}

// sample is one reported metric: its name after tag extraction, its tags and value.
type sample struct {
	name   string
	labels map[string]string
	value  uint64
}

// samples lists what the filter reported, reading each value from the host by the name
// the filter defined, and checking the name survives Envoy's tag extraction.
func (p *proxy) samples() []sample {
	p.t.Helper()
	reg := p.vm.plugin.reg
	var out []sample
	for _, g := range reg.groups {
		var tagNames []string
		for _, tg := range g.tags {
			tagNames = append(tagNames, tg.Name)
		}
		for key := range g.sets {
			for _, mi := range g.metrics {
				m := reg.pl.Metrics[mi]
				full := key + m.FullName
				var v uint64
				var err error
				switch m.Kind {
				case statsplan.Counter:
					v, err = p.host.GetCounterMetric(full)
				case statsplan.Gauge:
					v, err = p.host.GetGaugeMetric(full)
				case statsplan.Histogram:
					v, err = p.host.GetHistogramMetric(full)
				}
				require.NoError(p.t, err)
				rest, labels := extractTags(p.t, full, tagNames)
				require.Equal(p.t, m.FullName, rest)
				require.Len(p.t, labels, len(tagNames), "every tag extracted from %q", full)
				out = append(out, sample{name: rest, labels: labels, value: v})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// only returns the single sample of metric name.
func (p *proxy) only(name string) sample {
	p.t.Helper()
	var found []sample
	for _, s := range p.samples() {
		if s.name == name {
			found = append(found, s)
		}
	}
	require.Len(p.t, found, 1, "label sets of %s", name)
	return found[0]
}

func header(hs [][2]string, name string) (string, bool) {
	for _, h := range hs {
		if h[0] == name {
			return h[1], true
		}
	}
	return "", false
}

// serverRequest is productpage calling ratings, as ratings' sidecar sees it.
func serverRequest() exchange {
	return exchange{
		reqHeaders: [][2]string{
			{":method", "GET"}, {":path", "/ratings/0?x=1"}, {":authority", "ratings.prod.svc.cluster.local:9080"},
			{"x-user", "alice"},
			{headerPeerMetadata, encodePeerMetadata(productpage)}, {headerPeerID, productpageNodeID},
		},
		props: map[string][]byte{
			"cluster_name":                         []byte("inbound|9080||"),
			"connection.mtls":                      {1},
			"connection.uri_san_peer_certificate":  []byte(productpageSAN),
			"connection.uri_san_local_certificate": []byte(ratingsSAN),
			"response.code":                        le64(200),
			"response.flags":                       le64(0),
			"request.duration":                     le64(12_400_000), // 12.4 ms
			"request.total_size":                   le64(321),
			"response.total_size":                  le64(4567),
		},
		respHeaders: [][2]string{{":status", "200"}, {"content-type", "application/json"}},
	}
}

// clientRequest is productpage calling ratings, as productpage's sidecar sees it, with
// ratings' sidecar's answer.
func clientRequest() exchange {
	return exchange{
		reqHeaders: [][2]string{
			{":method", "GET"}, {":path", "/ratings/0"}, {":authority", "ratings:9080"},
		},
		props: map[string][]byte{
			"cluster_name":                       []byte("outbound|9080||ratings.prod.svc.cluster.local"),
			"upstream.uri_san_peer_certificate":  []byte(ratingsSAN),
			"upstream.uri_san_local_certificate": []byte(productpageSAN),
			"connection.mtls":                    {0}, // the downstream (app) connection: not what the client reports
			"response.code":                      le64(503),
			"response.flags":                     le64(0x20 | 0x8000),
			"request.duration":                   le64(30_000_000),
			"request.total_size":                 le64(100),
			"response.total_size":                le64(200),
		},
		respHeaders: [][2]string{
			{":status", "503"},
			{headerPeerMetadata, encodePeerMetadata(ratings)}, {headerPeerID, ratingsNodeID},
		},
	}
}

// The labels of the two requests above, as Istio would report them.
var (
	wantServerLabels = map[string]string{
		"reporter":                       "destination",
		"source_workload":                "productpage-v1",
		"source_workload_namespace":      "default",
		"source_principal":               productpageSAN,
		"source_app":                     "productpage",
		"source_version":                 "v1",
		"source_canonical_service":       "productpage",
		"source_canonical_revision":      "v1",
		"source_cluster":                 "Kubernetes",
		"destination_workload":           "ratings-v1",
		"destination_workload_namespace": "prod",
		"destination_principal":          ratingsSAN,
		"destination_app":                "ratings",
		"destination_version":            "v1",
		"destination_service":            "ratings.prod.svc.cluster.local",
		"destination_service_name":       "ratings",
		"destination_service_namespace":  "prod",
		"destination_canonical_service":  "ratings",
		"destination_canonical_revision": "r7",
		"destination_cluster":            "east",
		"request_protocol":               "http",
		"response_code":                  "200",
		"grpc_response_status":           "",
		"response_flags":                 "-",
		"connection_security_policy":     "mutual_tls",
	}
	wantClientLabels = map[string]string{
		"reporter":                       "source",
		"source_workload":                "productpage-v1",
		"source_workload_namespace":      "default",
		"source_principal":               productpageSAN,
		"source_app":                     "productpage",
		"source_version":                 "v1",
		"source_canonical_service":       "productpage",
		"source_canonical_revision":      "v1",
		"source_cluster":                 "Kubernetes",
		"destination_workload":           "ratings-v1",
		"destination_workload_namespace": "prod",
		"destination_principal":          ratingsSAN,
		"destination_app":                "ratings",
		"destination_version":            "v1",
		"destination_service":            "ratings.prod.svc.cluster.local",
		"destination_service_name":       "ratings",
		"destination_service_namespace":  "prod",
		"destination_canonical_service":  "ratings",
		"destination_canonical_revision": "r7",
		"destination_cluster":            "east",
		"request_protocol":               "http",
		"response_code":                  "503",
		"grpc_response_status":           "",
		"response_flags":                 "UF,URX",
		"connection_security_policy":     "unknown",
	}
)

func TestServerSideReportsDestination(t *testing.T) {
	p := mustStart(t, "", ratings, ratingsNodeID, inbound)
	p.do(serverRequest())

	got := p.samples()
	require.Len(t, got, 4)
	want := map[string]uint64{
		"istio_request_bytes":                 321,
		"istio_request_duration_milliseconds": 12,
		"istio_requests_total":                1,
		"istio_response_bytes":                4567,
	}
	for _, s := range got {
		assert.Equal(t, wantServerLabels, s.labels, s.name)
		assert.Equal(t, want[s.name], s.value, s.name)
	}
}

func TestClientSideReportsSource(t *testing.T) {
	p := mustStart(t, "", productpage, productpageNodeID, outbound)
	p.do(clientRequest())
	p.do(clientRequest())

	got := p.samples()
	require.Len(t, got, 4)
	for _, s := range got {
		assert.Equal(t, wantClientLabels, s.labels, s.name)
	}
	assert.Equal(t, uint64(2), p.only("istio_requests_total").value)
	assert.Equal(t, uint64(30), p.only("istio_request_duration_milliseconds").value)
}

// TestEncodedName pins the whole metric name for a configuration that keeps two tags.
func TestEncodedName(t *testing.T) {
	var remove []string
	for _, n := range statsplan.StandardLabelNames {
		if n != "reporter" && n != "response_code" {
			remove = append(remove, `"`+n+`"`)
		}
	}
	p := mustStart(t, `{"metrics": [{"tags_to_remove": [`+strings.Join(remove, ",")+`]}]}`, ratings, "", inbound)
	p.do(serverRequest())
	n, err := p.host.GetCounterMetric("reporter=.=destination;.;response_code=.=200;.;istio_requests_total")
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)
	n, err = p.host.GetHistogramMetric("reporter=.=destination;.;response_code=.=200;.;istio_response_bytes")
	require.NoError(t, err)
	assert.Equal(t, uint64(4567), n)
}

// TestStandardLabels changes one thing about a request at a time and checks the labels
// it moves, on each side.
func TestStandardLabels(t *testing.T) {
	type change func(x *exchange)
	setProp := func(path string, v []byte) change {
		return func(x *exchange) { x.props[path] = v }
	}
	withHeader := func(name, v string) change {
		return func(x *exchange) { x.reqHeaders = append(x.reqHeaders, [2]string{name, v}) }
	}
	dropReqHeader := func(name string) change {
		return func(x *exchange) {
			var hs [][2]string
			for _, h := range x.reqHeaders {
				if h[0] != name {
					hs = append(hs, h)
				}
			}
			x.reqHeaders = hs
		}
	}
	dropRespHeader := func(name string) change {
		return func(x *exchange) {
			var hs [][2]string
			for _, h := range x.respHeaders {
				if h[0] != name {
					hs = append(hs, h)
				}
			}
			x.respHeaders = hs
		}
	}
	unknownSource := map[string]string{
		"source_workload": "unknown", "source_workload_namespace": "unknown", "source_app": "unknown",
		"source_version": "unknown", "source_canonical_service": "unknown", "source_canonical_revision": "unknown",
		"source_cluster": "unknown",
	}
	unknownDestination := map[string]string{
		"destination_workload": "unknown", "destination_workload_namespace": "unknown", "destination_app": "unknown",
		"destination_version": "unknown", "destination_canonical_service": "unknown",
		"destination_canonical_revision": "unknown", "destination_cluster": "unknown",
		// destination_service_namespace stays known: it comes with the service, from the
		// route's cluster, not from the peer.
	}
	for _, tc := range []struct {
		name    string
		server  bool
		cfg     string
		changes []change
		want    map[string]string // labels that differ from wantServerLabels / wantClientLabels
	}{
		{name: "server: peer sent no metadata", server: true,
			changes: []change{dropReqHeader(headerPeerMetadata), dropReqHeader(headerPeerID)}, want: unknownSource},
		{name: "server: peer sent garbage", server: true,
			changes: []change{dropReqHeader(headerPeerMetadata), withHeader(headerPeerMetadata, "!!not base64!!")}, want: unknownSource},
		{name: "client: peer sent no metadata",
			changes: []change{dropRespHeader(headerPeerMetadata), dropRespHeader(headerPeerID)}, want: unknownDestination},
		{name: "server: plaintext", server: true, changes: []change{setProp("connection.mtls", []byte{0})},
			want: map[string]string{"connection_security_policy": "none"}},
		{name: "server: no mtls property", server: true, changes: []change{func(x *exchange) { delete(x.props, "connection.mtls") }},
			want: map[string]string{"connection_security_policy": "unknown"}},
		{name: "server: no certificates", server: true, changes: []change{func(x *exchange) {
			delete(x.props, "connection.uri_san_peer_certificate")
			delete(x.props, "connection.uri_san_local_certificate")
		}}, want: map[string]string{"source_principal": "unknown", "destination_principal": "unknown"}},
		{name: "client: no certificates", changes: []change{func(x *exchange) {
			delete(x.props, "upstream.uri_san_peer_certificate")
			delete(x.props, "upstream.uri_san_local_certificate")
		}}, want: map[string]string{"source_principal": "unknown", "destination_principal": "unknown"}},
		{name: "server: response flags", server: true, changes: []change{setProp("response.flags", le64(0x2|0x100))},
			want: map[string]string{"response_flags": "UH,NR"}},
		{name: "server: response code from :status", server: true, changes: []change{
			func(x *exchange) { delete(x.props, "response.code"); x.respHeaders[0][1] = "404" }},
			want: map[string]string{"response_code": "404"}},
		{name: "server: no response", server: true, changes: []change{
			func(x *exchange) { delete(x.props, "response.code"); x.respHeaders = nil }},
			want: map[string]string{"response_code": "0"}},
		{name: "server: grpc status in trailers", server: true, changes: []change{
			withHeader("content-type", "application/grpc"),
			func(x *exchange) { x.respBody = []byte("msg"); x.respTrailers = [][2]string{{"grpc-status", "14"}} }},
			want: map[string]string{"request_protocol": "grpc", "grpc_response_status": "14"}},
		{name: "server: grpc status in headers", server: true, changes: []change{
			withHeader("content-type", "application/grpc+proto"),
			func(x *exchange) { x.respHeaders = append(x.respHeaders, [2]string{"grpc-status", "5"}) }},
			want: map[string]string{"request_protocol": "grpc", "grpc_response_status": "5"}},
		{name: "server: grpc status property wins", server: true, changes: []change{
			withHeader("content-type", "application/grpc"), setProp("response.grpc_status", le64(7)),
			func(x *exchange) { x.respHeaders = append(x.respHeaders, [2]string{"grpc-status", "5"}) }},
			want: map[string]string{"request_protocol": "grpc", "grpc_response_status": "7"}},
		{name: "server: grpc without status", server: true, changes: []change{withHeader("content-type", "application/grpc")},
			want: map[string]string{"request_protocol": "grpc", "grpc_response_status": "2"}},
		{name: "client: service from :authority when the cluster says nothing", changes: []change{
			setProp("cluster_name", []byte("outbound|80||")),
			func(x *exchange) { x.reqHeaders[2][1] = "details.default.svc.cluster.local:9080" }},
			want: map[string]string{"destination_service": "details.default.svc.cluster.local",
				"destination_service_name": "details", "destination_service_namespace": "default"}},
		{name: "client: external host, namespace from the destination workload", changes: []change{
			setProp("cluster_name", []byte("PassthroughCluster")),
			func(x *exchange) { x.reqHeaders[2][1] = "httpbin.org" }},
			want: map[string]string{"destination_service": "httpbin.org", "destination_service_name": "PassthroughCluster"}},
		{name: "client: host header fallback disabled", cfg: `{"disable_host_header_fallback": true}`, changes: []change{
			setProp("cluster_name", []byte("outbound|80||"))},
			want: map[string]string{"destination_service": "unknown", "destination_service_name": "unknown"}},
		{name: "reporter fixed by configuration", server: true, cfg: `{"reporter": "destination"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, base, id, dir := clientRequest(), wantClientLabels, productpage, int64(outbound)
			if tc.server {
				x, base, id, dir = serverRequest(), wantServerLabels, ratings, inbound
			}
			if strings.Contains(tc.cfg, `"reporter"`) {
				dir = 0 // the configuration decides
			}
			for _, c := range tc.changes {
				c(&x)
			}
			p := mustStart(t, tc.cfg, id, "", dir)
			p.do(x)
			want := map[string]string{}
			for k, v := range base {
				want[k] = v
			}
			for k, v := range tc.want {
				want[k] = v
			}
			assert.Equal(t, want, p.only("istio_requests_total").labels)
		})
	}
}

func TestWithoutListenerDirectionReportsDestination(t *testing.T) {
	p := mustStart(t, "", ratings, "", 0)
	p.do(serverRequest())
	p.do(serverRequest())
	assert.Equal(t, "destination", p.only("istio_requests_total").labels["reporter"])
	assert.Len(t, p.host.GetWarnLogs(), 1, "warned once")
}

func TestReporterOverridesListenerDirection(t *testing.T) {
	p := mustStart(t, `{"reporter": "source"}`, productpage, "", inbound)
	r := p.do(clientRequest())
	assert.Equal(t, wantClientLabels, p.only("istio_requests_total").labels)
	_, added := header(r.reqHeaders, headerPeerMetadata)
	assert.True(t, added, "a source reporter is the client side: it sends its metadata")
}

// TestPeerExchange passes headers client -> server -> client as two proxies would.
func TestPeerExchange(t *testing.T) {
	// Client side, request path: the app's request gets productpage's identity, replacing
	// whatever the app put there.
	client := mustStart(t, "", productpage, productpageNodeID, outbound)
	app := [][2]string{{":method", "GET"}, {":path", "/ratings/0"}, {":authority", "ratings:9080"},
		{headerPeerMetadata, encodePeerMetadata(nodeIdentity{WorkloadName: "spoofed"})}}
	sent := client.do(exchange{reqHeaders: app}).reqHeaders
	md, ok := header(sent, headerPeerMetadata)
	require.True(t, ok)
	assert.Equal(t, encodePeerMetadata(productpage), md)
	peerID, ok := header(sent, headerPeerID)
	require.True(t, ok)
	assert.Equal(t, productpageNodeID, peerID)

	// Server side: the request reaches the app without the exchange headers, and the
	// response carries ratings' identity.
	server := mustStart(t, "", ratings, ratingsNodeID, inbound)
	x := serverRequest()
	x.reqHeaders = sent
	got := server.do(x)
	_, ok = header(got.reqHeaders, headerPeerMetadata)
	assert.False(t, ok, "stripped before the app")
	_, ok = header(got.reqHeaders, headerPeerID)
	assert.False(t, ok, "stripped before the app")
	md, ok = header(got.respHeaders, headerPeerMetadata)
	require.True(t, ok)
	assert.Equal(t, encodePeerMetadata(ratings), md)
	peerID, _ = header(got.respHeaders, headerPeerID)
	assert.Equal(t, ratingsNodeID, peerID)
	s := server.only("istio_requests_total")
	assert.Equal(t, "productpage-v1", s.labels["source_workload"])
	assert.Equal(t, "productpage", s.labels["source_app"])

	// Client side, response path: the answer reaches the app without them, and the
	// client reports ratings as the destination.
	client = mustStart(t, "", productpage, productpageNodeID, outbound)
	cx := clientRequest()
	cx.respHeaders = got.respHeaders
	back := client.do(cx)
	_, ok = header(back.respHeaders, headerPeerMetadata)
	assert.False(t, ok, "stripped before the app")
	_, ok = header(back.respHeaders, headerPeerID)
	assert.False(t, ok, "stripped before the app")
	s = client.only("istio_requests_total")
	assert.Equal(t, "ratings-v1", s.labels["destination_workload"])
	assert.Equal(t, "east", s.labels["destination_cluster"])
}

// TestServerAnswersPeersThatSentNothing: the server side identifies itself even to a
// client that sent no metadata, and strips a lone id header.
func TestServerAnswersPeersThatSentNothing(t *testing.T) {
	server := mustStart(t, "", ratings, ratingsNodeID, inbound)
	x := serverRequest()
	x.reqHeaders = [][2]string{{":method", "GET"}, {":path", "/"}, {headerPeerID, "x"}}
	got := server.do(x)
	_, ok := header(got.reqHeaders, headerPeerID)
	assert.False(t, ok)
	_, ok = header(got.respHeaders, headerPeerMetadata)
	assert.True(t, ok)
}

func TestMetricValueFallbacks(t *testing.T) {
	p := mustStart(t, "", ratings, "", inbound)
	x := serverRequest()
	for _, k := range []string{"request.duration", "request.total_size", "response.total_size"} {
		delete(x.props, k)
	}
	x.reqBody = []byte("0123456789")
	x.respBody = []byte("abc")
	p.do(x)
	assert.Equal(t, uint64(10), p.only("istio_request_bytes").value, "body bytes")
	assert.Equal(t, uint64(3), p.only("istio_response_bytes").value, "body bytes")
	assert.Less(t, p.only("istio_request_duration_milliseconds").value, uint64(60_000), "timed on the guest clock")
	assert.False(t, p.vm.plugin.durationFromHost)
}

func TestCustomDimensions(t *testing.T) {
	cfg := `{
		"metrics": [
			{"name": "requests_total",
			 "dimensions": {
				"user": "request.headers['x-user']",
				"team": "request.headers['x-team']",
				"request_host": "request.host",
				"route": "request.url_path.startsWith('/ratings') ? 'ratings' : 'other'",
				"caller": "downstream_peer.labels['app']",
				"mesh": "node.metadata['MESH_ID']",
				"port_class": "string(response.code / 100)"
			 }}
		]
	}`
	_, status := startProxy(t, cfg, ratings, "", inbound)
	assert.Equal(t, types.OnPluginStartStatusFailed, status, "/ is not in the subset")

	cfg = strings.Replace(cfg, `"port_class": "string(response.code / 100)"`,
		`"code_class": "response.code >= 500 ? '5xx' : 'ok'"`, 1)
	cfg = strings.Replace(cfg, `"metrics": [`, `"metrics": [{"tags_to_remove": ["response_flags", "grpc_response_status"]},`, 1)
	p := mustStart(t, cfg, ratings, "", inbound)
	p.do(serverRequest())

	s := p.only("istio_requests_total")
	assert.Equal(t, "alice", s.labels["user"])
	assert.Equal(t, "unknown", s.labels["team"], "a missing header is unknown, as in Istio")
	assert.Equal(t, "ratings.prod.svc.cluster.local:9080", s.labels["request_host"])
	assert.Equal(t, "ratings", s.labels["route"])
	assert.Equal(t, "productpage", s.labels["caller"])
	assert.Equal(t, "cluster.local", s.labels["mesh"])
	assert.Equal(t, "ok", s.labels["code_class"])
	assert.NotContains(t, s.labels, "response_flags")
	assert.NotContains(t, s.labels, "grpc_response_status")

	other := p.only("istio_response_bytes")
	assert.NotContains(t, other.labels, "user", "dimensions restricted by name")
	assert.NotContains(t, other.labels, "response_flags", "removal without a name applies to all")
}

func TestOverrideStandardLabel(t *testing.T) {
	p := mustStart(t, `{"metrics": [{"dimensions": {"response_code": "response.code >= 500 ? '5xx' : string(response.code)"}}]}`,
		productpage, "", outbound)
	p.do(clientRequest())
	want := map[string]string{}
	for k, v := range wantClientLabels {
		want[k] = v
	}
	want["response_code"] = "5xx"
	assert.Equal(t, want, p.only("istio_requests_total").labels)
}

func TestUpstreamPeerOnClientSide(t *testing.T) {
	p := mustStart(t, `{"metrics": [{"name": "requests_total", "dimensions": {
		"callee": "upstream_peer.canonical_revision", "caller": "has(downstream_peer.workload) ? 'known' : 'none'"}}]}`,
		productpage, "", outbound)
	p.do(clientRequest())
	s := p.only("istio_requests_total")
	assert.Equal(t, "r7", s.labels["callee"])
	assert.Equal(t, "none", s.labels["caller"], "the client side has no downstream peer")
}

func TestDefinitions(t *testing.T) {
	cfg := `{
		"definitions": [
			{"name": "requests_total", "value": "2"},
			{"name": "user_bytes", "type": "COUNTER", "value": "int(request.headers['x-bytes'])"},
			{"name": "last_port", "type": "GAUGE", "value": "destination.port"},
			{"name": "path_length", "type": "HISTOGRAM", "value": "size(request.url_path)"}
		],
		"metrics": [{"tags_to_remove": ["response_flags"]}]
	}`
	p := mustStart(t, cfg, ratings, "", inbound)
	x := serverRequest()
	x.props["destination.port"] = le64(9080)
	x.reqHeaders = append(x.reqHeaders, [2]string{"x-bytes", "40"})
	p.do(x)
	x.props["destination.port"] = le64(8080)
	x.reqHeaders[len(x.reqHeaders)-1][1] = "2"
	p.do(x)

	assert.Equal(t, uint64(4), p.only("istio_requests_total").value, "a redefined standard metric keeps its name")
	assert.Equal(t, uint64(42), p.only("istio_user_bytes").value)
	assert.Equal(t, uint64(8080), p.only("istio_last_port").value, "a gauge is set, not added")
	assert.Equal(t, uint64(len("/ratings/0")), p.only("istio_path_length").value)
	assert.Equal(t, wantServerLabels["destination_workload"], p.only("istio_path_length").labels["destination_workload"],
		"new metrics get the standard labels")
	assert.NotContains(t, p.only("istio_path_length").labels, "response_flags")

	// A value that does not evaluate is not recorded (Istio would record 0).
	x.reqHeaders[len(x.reqHeaders)-1][1] = "many"
	p.do(x)
	assert.Equal(t, uint64(42), p.only("istio_user_bytes").value)
	assert.Equal(t, uint64(6), p.only("istio_requests_total").value)
}

func TestConfigErrorsRefuseToStart(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"metrics": [{"name": "requests_total", "dimensions": {"user": "request.header['x-user']"}}]}`,
			`metrics[0] (requests_total): dimension "user": expression "request.header['x-user']": column 1: unknown attribute request.header['x-user']`},
		{`{"definitions": [{"name": "b", "type": "HISTOGRAM", "value": "response.total_size +"}]}`,
			`definitions[0] (b): value expression "response.total_size +": column 22: unexpected end of expression`},
		{`{"stat_prefix": "istio", "metricz": []}`, `plugin configuration: metricz: unknown field`},
		{`{"definitions": [{"name": "b", "value": "1", "kind": "COUNTER"}]}`, `plugin configuration: definitions[0].kind: unknown field`},
		{`not json`, `plugin configuration: invalid character`},
	} {
		p, status := startProxy(t, tc.cfg, ratings, "", inbound)
		assert.Equal(t, types.OnPluginStartStatusFailed, status, tc.cfg)
		logs := p.host.GetCriticalLogs()
		if assert.Len(t, logs, 1, tc.cfg) {
			assert.Contains(t, logs[0], tc.want)
		}
	}
}

func TestCardinalityCap(t *testing.T) {
	cfg := `{"max_label_sets_per_metric": 3,
		"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`
	p := mustStart(t, cfg, ratings, "", inbound)
	users := []string{"u1", "u2", "u3", "u4", "u5", "u1", "u6", "u3"}
	for _, u := range users {
		x := serverRequest()
		x.reqHeaders[3][1] = u
		p.do(x)
	}
	perUser := map[string]uint64{}
	for _, s := range p.samples() {
		if s.name == "istio_requests_total" {
			perUser[s.labels["user"]] = s.value
		}
	}
	assert.Equal(t, map[string]uint64{"u1": 2, "u2": 1, "u3": 2}, perUser, "known label sets keep counting")
	n, err := p.host.GetCounterMetric("metric=.=istio_requests_total;.;wasmesh_telemetry_overflow_total")
	require.NoError(t, err)
	assert.Equal(t, uint64(3), n, "u4, u5 and u6 overflowed")
	n, err = p.host.GetCounterMetric("metric=.=istio_response_bytes;.;wasmesh_telemetry_overflow_total")
	require.NoError(t, err)
	assert.Zero(t, n, "metrics without the dimension have one label set")
	assert.Equal(t, 3, p.vm.plugin.reg.labelSets(0))
}

// TestHostileHeaderValues: separators in a header value cannot forge tags.
func TestHostileHeaderValues(t *testing.T) {
	p := mustStart(t, `{"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`,
		ratings, "", inbound)
	x := serverRequest()
	x.reqHeaders[3][1] = "eve;.;reporter=.=source;.;x"
	p.do(x)
	s := p.only("istio_requests_total")
	assert.Equal(t, "eve;_;reporter=_=source;_;x", s.labels["user"])
	assert.Equal(t, "destination", s.labels["reporter"])
}
