package host

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func i64(v int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	return b
}

func propsFixture(t *testing.T) *fixture {
	node := Node{ID: "sidecar~10.0.0.2~web-1.default~default.svc.cluster.local", Cluster: "web.default",
		Metadata: map[string]any{"NAME": "web-1", "LABELS": map[string]any{"app": "web"}, "PORT": 8080.0}}
	return newFixture(t, "kitchen", PluginConfig{Name: "props", RootID: "stats", VMID: "vm-1"},
		Environment{Properties: map[string]any{"node": node.Property(), "listener_direction": int64(1)}})
}

var start = time.Date(2024, 5, 6, 7, 8, 9, 10, time.UTC)

func streamInfo() StreamInfo {
	return StreamInfo{
		Protocol: "HTTP/2", StartTime: start,
		Source: "10.0.0.1:1234", Destination: "10.0.0.2:8080",
		Connection: ConnectionInfo{ID: 7, MTLS: true, TLSVersion: "TLSv1.3",
			URISanPeerCertificate: "spiffe://cluster.local/ns/default/sa/client"},
		Upstream:    UpstreamInfo{Address: "10.0.0.3:9090"},
		ClusterName: "outbound|80||web", RouteName: "default",
		Properties: map[string]any{"xds": map[string]any{"route_metadata": map[string]any{"k": "v"}}},
	}
}

func TestPropertiesEncodedAsEnvoyDoes(t *testing.T) {
	f := propsFixture(t)
	want := map[string][]byte{
		"request.path":                        []byte("/api/v1?x=1"),
		"request.url_path":                    []byte("/api/v1"),
		"request.query":                       []byte("x=1"),
		"request.host":                        []byte("example.com"),
		"request.method":                      []byte("GET"),
		"request.scheme":                      []byte("https"),
		"request.useragent":                   []byte("ua/1"),
		"request.referer":                     []byte("https://ref"),
		"request.id":                          []byte("rid-1"),
		"request.protocol":                    []byte("HTTP/2"),
		"request.time":                        i64(start.UnixNano()),
		"request.size":                        i64(42), // content-length wins
		"request.headers.foo":                 []byte("a,b"),
		"source.address":                      []byte("10.0.0.1:1234"),
		"source.port":                         i64(1234),
		"destination.port":                    i64(8080),
		"connection.id":                       i64(7),
		"connection.mtls":                     {1},
		"connection.tls_version":              []byte("TLSv1.3"),
		"connection.uri_san_peer_certificate": []byte("spiffe://cluster.local/ns/default/sa/client"),
		"upstream.address":                    []byte("10.0.0.3:9090"),
		"upstream.port":                       i64(9090),
		"node.id":                             []byte("sidecar~10.0.0.2~web-1.default~default.svc.cluster.local"),
		"node.metadata.NAME":                  []byte("web-1"),
		"node.metadata.LABELS.app":            []byte("web"),
		"node.metadata.PORT":                  i64(int64(math.Float64bits(8080))),
		"plugin_name":                         []byte("props"),
		"plugin_root_id":                      []byte("stats"),
		"plugin_vm_id":                        []byte("vm-1"),
		"xds.cluster_name":                    []byte("outbound|80||web"),
		"xds.route_name":                      []byte("default"),
		"xds.route_metadata.k":                []byte("v"),
		"xds.node.cluster":                    []byte("web.default"),
		"cluster_name":                        []byte("outbound|80||web"),
		"listener_direction":                  i64(1),
	}
	// Maps are serialized pairs (keys sorted), values serialized recursively.
	want["node.metadata"] = EncodePairs([][2]string{{"LABELS", string(EncodePairs([][2]string{{"app", "web"}}))},
		{"NAME", "web-1"}, {"PORT", string(i64(int64(math.Float64bits(8080))))}})
	notFound := []string{"nosuch", "request.nosuch", "connection.dns_san_peer_certificate", "node.metadata.NOPE", "response.code"}
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	paths = append(paths, notFound...)
	paths = append(paths, "request.headers", "request")

	s, _, h := f.headersOnly(t, StreamOptions{Info: streamInfo()},
		[2]string{":scheme", "https"}, [2]string{":path", "/api/v1?x=1"}, [2]string{"user-agent", "ua/1"},
		[2]string{"referer", "https://ref"}, [2]string{"x-request-id", "rid-1"}, [2]string{"content-length", "42"},
		[2]string{"foo", "a"}, [2]string{"foo", "b"}, [2]string{"x-props", strings.Join(paths, ";")})
	defer s.Finish(context.Background())
	for p, v := range want {
		assert.Equal(t, "0:"+hex.EncodeToString(v), hget(h, "x-prop-"+p), p)
	}
	for _, p := range notFound {
		assert.Equal(t, "1:", hget(h, "x-prop-"+p), p)
	}
	// request.headers is a map; the top-level request wrapper cannot be listed (as Envoy).
	raw, err := hex.DecodeString(strings.TrimPrefix(hget(h, "x-prop-request.headers"), "0:"))
	require.NoError(t, err)
	pairs, err := DecodePairs(raw)
	require.NoError(t, err)
	assert.Contains(t, pairs, [2]string{"foo", "a,b"})
	assert.Contains(t, pairs, [2]string{":authority", "example.com"})
	assert.Equal(t, "3:", hget(h, "x-prop-request"))
}

func TestResponsePropertiesInOnLog(t *testing.T) {
	ctx := context.Background()
	f := propsFixture(t)
	info := streamInfo()
	info.ResponseCodeDetails = "via_upstream"
	info.ResponseFlags = 0x20
	s, _, _ := f.headersOnly(t, StreamOptions{Info: info},
		[2]string{"x-log-props", "response.code;response.code_details;response.flags;response.headers.x-r;response.size;response.grpc_status;request.duration;request.size;response.total_size"})
	s.OnRequestBody(ctx, []byte("12345"), true)
	s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "404"}, [2]string{"x-r", "1"}), false)
	s.OnResponseBody(ctx, []byte("abc"), false)
	s.OnResponseTrailers(ctx, NewHeaders([2]string{"grpc-status", "5"}))
	s.UpdateInfo(func(i *StreamInfo) { i.Duration = 1500 * time.Millisecond })
	s.Finish(ctx)
	rec, ok := f.logs.find("access path=/ status=404")
	require.True(t, ok, f.logs.messages())
	for k, v := range map[string][]byte{
		"response.code":         i64(404),
		"response.code_details": []byte("via_upstream"),
		"response.flags":        i64(0x20),
		"response.headers.x-r":  []byte("1"),
		"response.size":         i64(3),
		"response.grpc_status":  i64(5),
		"request.duration":      i64(int64(1500 * time.Millisecond)),
		"request.size":          i64(5), // no content-length: the bytes seen
		// body + header bytes (":status404" + "x-r1" + "x-response-added1") + trailer bytes
		"response.total_size": i64(3 + 10 + 4 + 17 + 12),
	} {
		assert.Contains(t, rec.Msg+" ", "x-prop-"+k+"=0:"+hex.EncodeToString(v)+" ", k)
	}
}

func TestSetPropertyIsReadableBack(t *testing.T) {
	f := propsFixture(t)
	s, _, h := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "set-prop"})
	assert.Equal(t, "0:0:hello", hget(h, "x-prop-custom"))
	assert.Equal(t, map[string][]byte{"wasmesh.test": []byte("hello")}, s.FilterState())
	s.Finish(context.Background())
}

func TestSerializeProperty(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want []byte
		st   Status
	}{
		{"s", []byte("s"), StatusOK},
		{int(-1), i64(-1), StatusOK},
		{uint64(3), i64(3), StatusOK},
		{true, []byte{1}, StatusOK},
		{false, []byte{0}, StatusOK},
		{2 * time.Second, i64(2e9), StatusOK},
		{[]string{"a", "b"}, EncodePairs([][2]string{{"a", ""}, {"b", ""}}), StatusOK},
		{map[string]string{"b": "2", "a": "1"}, EncodePairs([][2]string{{"a", "1"}, {"b", "2"}}), StatusOK},
		{Lazy(func(string) (any, bool) { return nil, false }), nil, StatusSerializationFailure},
		{struct{}{}, nil, StatusNotFound},
		{nil, nil, StatusNotFound},
	} {
		got, st := SerializeProperty(tc.v)
		assert.Equal(t, tc.st, st, "%#v", tc.v)
		assert.Equal(t, tc.want, got, "%#v", tc.v)
	}
}

// In a TCP stream's context there is no HTTP request or response: their attributes are not
// found (as in an Envoy network filter, where the request and response wrappers have no
// headers), while the connection's are.
func TestPropertiesOfAConnection(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "kitchen", PluginConfig{Configuration: []byte(
		"conn-props=request.path;request.method;response.code;response.headers.x;source.address;connection.mtls")}, Environment{})
	s, err := f.p.NewNetworkStream(ctx, StreamOptions{Info: streamInfo()})
	require.NoError(t, err)
	res := s.OnNewConnection(ctx)
	require.Nil(t, res.Failure)
	s.Finish(ctx)
	rec, ok := f.logs.find("connection ")
	require.True(t, ok, f.logs.messages())
	assert.Equal(t, "connection x-prop-connection.mtls=0:01 x-prop-request.method=1: x-prop-request.path=1: "+
		"x-prop-response.code=1: x-prop-response.headers.x=1: x-prop-source.address=0:"+hex.EncodeToString([]byte("10.0.0.1:1234")), rec.Msg)
}

// A list property's elements are found by index; an index past the end or negative is not
// found.
func TestListPropertiesByIndex(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{Properties: map[string]any{
		"anys": []any{"a", "b"}, "strings": []string{"x"}}})
	paths := []string{"anys.0", "anys.1", "anys.2", "anys.-1", "strings.0", "strings.1"}
	s, _, h := f.headersOnly(t, StreamOptions{}, [2]string{"x-props", strings.Join(paths, ";")})
	defer s.Finish(context.Background())
	require.Nil(t, s.Failed())
	for p, want := range map[string]string{
		"anys.0": "0:" + hex.EncodeToString([]byte("a")), "anys.1": "0:" + hex.EncodeToString([]byte("b")),
		"anys.2": "1:", "anys.-1": "1:", "strings.0": "0:" + hex.EncodeToString([]byte("x")), "strings.1": "1:",
	} {
		assert.Equal(t, want, hget(h, "x-prop-"+p), p)
	}
}
