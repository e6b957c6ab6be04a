package host

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPairsSerializationMatchesTheSpec(t *testing.T) {
	// The spec's example: {"a": "1"}, {"b": "22"}.
	want := []byte{2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 'a', 0, '1', 0, 'b', 0, '2', '2', 0}
	got := EncodePairs([][2]string{{"a", "1"}, {"b", "22"}})
	assert.Equal(t, want, got)
	back, err := DecodePairs(got)
	require.NoError(t, err)
	assert.Equal(t, [][2]string{{"a", "1"}, {"b", "22"}}, back)
	// Without the last value's NUL, as some SDKs send it: the same pairs; a byte shorter
	// still cuts into the value.
	back, err = DecodePairs(got[:len(got)-1])
	require.NoError(t, err)
	assert.Equal(t, [][2]string{{"a", "1"}, {"b", "22"}}, back)
	_, err = DecodePairs(got[:len(got)-2])
	assert.ErrorIs(t, err, ErrMalformedPairs)

	// Empty maps: size 0, a single zero byte, or a zero count.
	for _, empty := range [][]byte{nil, {0}, {0, 0, 0, 0}} {
		p, err := DecodePairs(empty)
		require.NoError(t, err)
		assert.Empty(t, p)
	}
	// Round trip with empty keys and values, repeated keys and binary bytes.
	pairs := [][2]string{{"", ""}, {"k", ""}, {"k", "v2"}, {"bin", "\x00\xff"}}
	back, err = DecodePairs(EncodePairs(pairs))
	require.NoError(t, err)
	assert.Equal(t, pairs, back)

	// Sizes that overrun the data are rejected rather than read past the end.
	for _, bad := range [][]byte{
		{1, 0, 0, 0}, // count without sizes
		{1, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 'a'},  // sizes beyond the data
		{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},       // huge count
		{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // second pair's sizes missing
	} {
		_, err := DecodePairs(bad)
		assert.ErrorIs(t, err, ErrMalformedPairs, "%v", bad)
	}
}

func TestSplitPath(t *testing.T) {
	assert.Equal(t, []string{"request", "path"}, SplitPath([]byte("request\x00path")))
	// The Rust SDK terminates every segment, including the last.
	assert.Equal(t, []string{"request", "path"}, SplitPath([]byte("request\x00path\x00")))
	assert.Equal(t, []string{"a", "", "b"}, SplitPath([]byte("a\x00\x00b")))
	assert.Empty(t, SplitPath(nil))
	assert.Equal(t, []byte("a\x00b"), JoinPath("a", "b"))
}

func TestHeadersType(t *testing.T) {
	h := NewHeaders([2]string{"A", "1"}, [2]string{"b", "2"}, [2]string{"a", "3"})
	v, ok := h.Get("a")
	assert.True(t, ok)
	assert.Equal(t, "1", v)
	assert.Equal(t, []string{"1", "3"}, h.Values("A"))
	h.Set("a", "x") // replaces the first, drops the rest, keeps the position
	assert.Equal(t, [][2]string{{"a", "x"}, {"b", "2"}}, h.Pairs())
	h.Add("c", "4")
	h.Del("b")
	assert.Equal(t, [][2]string{{"a", "x"}, {"c", "4"}}, h.Pairs())
	assert.Equal(t, 4, h.ByteSize())
	var nilH *Headers
	_, ok = nilH.Get("a")
	assert.False(t, ok)
}

func TestHeaderMapHostCalls(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, h := f.op(t, "add-header", [2]string{"x-replace", "old"}, [2]string{"x-replace", "dup"}, [2]string{"X-Remove", "gone"})
	assert.Equal(t, Continue, res.Action)
	assert.Equal(t, "1", hget(h, "x-added"))
	assert.Equal(t, []string{"new"}, h.Values("x-replace"))
	_, ok := h.Get("x-remove")
	assert.False(t, ok)
	// 0.2.x: a missing header is NotFound.
	assert.Equal(t, "1:", hget(h, "x-missing-status"))
	// proxy_get_header_map_size is the serialized size of the map at that point: every header
	// but the one the guest added after asking.
	var asked [][2]string
	for _, p := range h.Pairs() {
		if p[0] != "x-map-size" {
			asked = append(asked, p)
		}
	}
	assert.Equal(t, strconv.Itoa(len(EncodePairs(asked))), hget(h, "x-map-size"))
	// The callback saw 7 headers (3 pseudo + x-op + 3 more) and end_of_stream.
	assert.Equal(t, "7/1", hget(h, "x-seen-headers"))

	// get_header_map_pairs / set_header_map_pairs round-trip through the guest.
	res, h = f.op(t, "set-pairs", [2]string{"x-drop", "1"}, [2]string{"x-keep", "2"})
	assert.Equal(t, Continue, res.Action)
	_, ok = h.Get("x-drop")
	assert.False(t, ok)
	assert.Equal(t, "2", hget(h, "x-keep"))
	assert.Equal(t, "7", hget(h, "x-pairs")) // 3 pseudo + x-op + x-drop + x-keep + x-seen-headers
}

func TestBodiesTrailersAndResponse(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})

	// Buffering: the guest pauses until the end of the body, sees all of it, rewrites it.
	s, _, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "buffer-body"})
	r1 := s.OnRequestBody(ctx, []byte("hello "), false)
	assert.Equal(t, Pause, r1.Action)
	assert.Nil(t, r1.Body)
	r2 := s.OnRequestBody(ctx, []byte("world"), true)
	assert.Equal(t, Continue, r2.Action)
	assert.Equal(t, "HELLO WORLD", string(r2.Body))
	s.Finish(ctx)

	// Append and prepend with set_buffer_bytes' start/length, and trailers added from the
	// last body chunk when the request had none.
	s, _, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "append-body,prepend-body,body-trailers"})
	r := s.OnRequestBody(ctx, []byte("body"), true)
	assert.Equal(t, ">body!", string(r.Body))
	require.NotNil(t, s.RequestTrailers())
	assert.Equal(t, "from-body", hget(s.RequestTrailers(), "x-added-trailer"))

	// Response side.
	rh := NewHeaders([2]string{":status", "200"})
	assert.Equal(t, Continue, s.OnResponseHeaders(ctx, rh, false).Action)
	assert.Equal(t, "1", hget(rh, "x-response-added"))
	s.Finish(ctx)

	s, _, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "resp-body,resp-trailers,trailers,resp-buffer"})
	tr := NewHeaders([2]string{"t", "1"})
	assert.Equal(t, Continue, s.OnRequestTrailers(ctx, tr).Action)
	assert.Equal(t, "1", hget(tr, "x-trailer-added"))
	s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), false)
	assert.Equal(t, Pause, s.OnResponseBody(ctx, []byte("a"), false).Action)
	r = s.OnResponseBody(ctx, []byte("b"), true)
	assert.Equal(t, Continue, r.Action)
	assert.Equal(t, "[ab] world", string(r.Body))
	rt := NewHeaders([2]string{"grpc-status", "0"})
	s.OnResponseTrailers(ctx, rt)
	assert.Equal(t, "1", hget(rt, "x-resp-trailer"))
	s.Finish(ctx)

	// proxy_get_buffer_status reports the body size; the plugin configuration buffer is
	// gone once configured (NotFound), as in Envoy.
	s, _, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "buffer-status"})
	s.OnRequestBody(ctx, []byte("12345"), true)
	s.Finish(ctx)
	assert.Contains(t, f.logs.messages(), "buffer status size=5 flags=0 status=0 plugin_config=1")

	// The buffered body of a paused direction can be taken once the guest resumes it.
	s, _, _ = f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "buffer-body"})
	s.OnRequestBody(ctx, []byte("part"), false)
	assert.True(t, bytes.Equal([]byte("part"), s.TakeBufferedBody(StreamRequest)))
	s.Finish(ctx)
}

func TestNetworkStream(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	s, err := f.p.NewNetworkStream(ctx, StreamOptions{})
	require.NoError(t, err)
	assert.Equal(t, Continue, s.OnNewConnection(ctx).Action)
	r := s.OnDownstreamData(ctx, []byte("ping"), false)
	assert.Equal(t, "PING", string(r.Body))
	r = s.OnUpstreamData(ctx, []byte("pong"), true)
	assert.Equal(t, "pong!", string(r.Body))
	s.OnDownstreamClose(ctx, PeerRemote)
	s.OnUpstreamClose(ctx, PeerLocal)
	s.Finish(ctx)
	assert.Contains(t, f.logs.messages(), "downstream close peer=2")
	assert.Contains(t, f.logs.messages(), "upstream close peer=1")
	m, ok := f.p.Metrics().Get("connections_total", MetricCounter)
	require.True(t, ok)
	assert.Equal(t, int64(1), m.Value)
	d, _ := f.p.Metrics().Get("deletes_total", MetricCounter)
	assert.Equal(t, int64(1), d.Value)
}
