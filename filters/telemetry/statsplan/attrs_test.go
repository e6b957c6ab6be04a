package statsplan

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

func noNode([]string) ([]byte, bool) { return nil, false }

// Expressions naming an attribute this filter does not know, or cannot read, are refused
// with the attribute's name and column.
func TestAttributeErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"request.hots", "column 1: unknown attribute request.hots"},
		{"request.headers", "column 1: unknown attribute request.headers"},
		{"'a' + request.header['x-user']", "column 7: unknown attribute request.header['x-user']"},
		{"request.duration", "column 1: attribute request.duration is a time value, which is not supported"},
		{"response.backend_latency", "attribute response.backend_latency is a time value"},
		{"upstream_peer.colour", "unknown attribute upstream_peer.colour (a peer has labels['NAME'] and name, namespace"},
		{"upstream_peer.labels", "unknown attribute upstream_peer.labels (a peer has"},
		{"node.metadata", "unknown attribute node.metadata"},
		{"bogus", "column 1: unknown attribute bogus"},
	} {
		_, err := expr.Compile(tc.src, NewResolver(noNode).Resolve)
		if assert.Error(t, err, tc.src) {
			assert.Contains(t, err.Error(), tc.want, tc.src)
		}
	}
}

// An attribute gets one slot however often and however it is written, and its name is
// written back in one canonical form.
func TestResolverGivesEachAttributeOneSlot(t *testing.T) {
	r := NewResolver(noNode)
	for _, src := range []string{
		"request.host + request['host']",
		"request.headers['X-User'] + request['headers']['X-User'] + request.host",
		"filter_state['a.b'] + upstream_peer.labels['app.kubernetes.io/name']",
	} {
		_, err := expr.Compile(src, r.Resolve)
		require.NoError(t, err, src)
	}
	var names []string
	for _, a := range r.Attributes() {
		names = append(names, a.Name)
	}
	assert.Equal(t, []string{"request.host", "request.headers['X-User']", "filter_state['a.b']",
		"upstream_peer.labels['app.kubernetes.io/name']"}, names)
	a := r.Attributes()
	assert.Equal(t, Attribute{Name: "request.host", Type: expr.String, Source: SourceRequestHeader, Header: ":authority"}, *a[0])
	assert.Equal(t, "x-user", a[1].Header, "header names are lower case")
	assert.Equal(t, Attribute{Name: "filter_state['a.b']", Type: expr.String, Source: SourceProperty, Path: []string{"a.b"}}, *a[2])
	assert.Equal(t, Attribute{Name: a[3].Name, Type: expr.String, Source: SourcePeer, Upstream: true,
		PeerLabel: "app.kubernetes.io/name"}, *a[3])
}

func TestLookupAttribute(t *testing.T) {
	for _, tc := range []struct {
		path []string
		want Attribute
	}{
		{[]string{"response", "code"}, Attribute{Type: expr.Int, Source: SourceProperty, Path: []string{"response", "code"}, Fallback: FallbackStatus}},
		{[]string{"response", "grpc_status"}, Attribute{Type: expr.Int, Source: SourceProperty, Path: []string{"response", "grpc_status"}, Fallback: FallbackGRPCStatus}},
		{[]string{"connection", "mtls"}, Attribute{Type: expr.Bool, Source: SourceProperty, Path: []string{"connection", "mtls"}}},
		{[]string{"request", "url_path"}, Attribute{Type: expr.String, Source: SourceRequestHeader, Header: ":path", Part: PartURLPath}},
		{[]string{"request", "query"}, Attribute{Type: expr.String, Source: SourceRequestHeader, Header: ":path", Part: PartQuery}},
		{[]string{"response", "trailers", "Grpc-Message"}, Attribute{Type: expr.String, Source: SourceResponseTrailer, Header: "grpc-message"}},
		{[]string{"downstream_peer", "workload"}, Attribute{Type: expr.String, Source: SourcePeer, PeerField: "workload"}},
		{[]string{"listener_direction"}, Attribute{Type: expr.Int, Source: SourceProperty, Path: []string{"listener_direction"}}},
	} {
		a, err := LookupAttribute(tc.path, noNode)
		require.NoError(t, err, tc.path)
		tc.want.Name = a.Name
		assert.Equal(t, tc.want, *a, tc.path)
	}
}

func TestNodeAttributesAreConstants(t *testing.T) {
	node := func(path []string) ([]byte, bool) {
		if len(path) == 3 && path[2] == "MESH_ID" {
			return []byte("mesh1"), true
		}
		return nil, false
	}
	a, err := LookupAttribute([]string{"node", "metadata", "MESH_ID"}, node)
	require.NoError(t, err)
	assert.Equal(t, SourceConstant, a.Source)
	assert.Equal(t, expr.Value{Str: "mesh1"}, a.Const)
	assert.True(t, a.ConstOK)
	a, err = LookupAttribute([]string{"node", "metadata", "NOPE"}, node)
	require.NoError(t, err)
	assert.False(t, a.ConstOK)
}

func TestDecodeProperty(t *testing.T) {
	le := binary.LittleEndian.AppendUint64(nil, uint64(1<<40+7))
	v, ok := DecodeProperty(expr.Int, le)
	assert.True(t, ok)
	assert.Equal(t, int64(1<<40+7), v.Int)
	_, ok = DecodeProperty(expr.Int, le[:4])
	assert.False(t, ok, "an int is 8 bytes")
	v, ok = DecodeProperty(expr.Bool, []byte{1})
	assert.True(t, ok && v.Bool)
	_, ok = DecodeProperty(expr.Bool, []byte{1, 0})
	assert.False(t, ok, "a bool is one byte")
	v, ok = DecodeProperty(expr.String, []byte("x"))
	assert.True(t, ok)
	assert.Equal(t, "x", v.Str)
}

func TestPathPartCut(t *testing.T) {
	assert.Equal(t, "/a?b=1", PartAll.Cut("/a?b=1"))
	assert.Equal(t, "/a", PartURLPath.Cut("/a?b=1"))
	assert.Equal(t, "/a", PartURLPath.Cut("/a"))
	assert.Equal(t, "b=1?c", PartQuery.Cut("/a?b=1?c"))
	assert.Equal(t, "", PartQuery.Cut("/a"))
}
