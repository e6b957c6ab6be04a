package harness

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

func kitchen(tb testing.TB) []byte {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), filepath.Join("..", "host", "testdata", "guests", "kitchen"), wasmbuild.Options{})
	require.NoError(tb, err)
	b, err := art.Bytes()
	require.NoError(tb, err)
	return b
}

func newHarness(tb testing.TB, opts Options) *Harness {
	tb.Helper()
	if opts.Wasm == nil {
		opts.Wasm = kitchen(tb)
	}
	if opts.Runtime == nil {
		rt, err := host.NewRuntime(context.Background(), host.RuntimeConfig{
			CompilationCacheDir: filepath.Join(os.TempDir(), "wasmesh-host-test-wazero-cache")})
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = rt.Close(context.Background()) })
		opts.Runtime = rt
	}
	return NewT(tb, opts)
}

func phases(r *Report) []Phase {
	var out []Phase
	for _, p := range r.Phases {
		out = append(out, p.Phase)
	}
	return out
}

func TestFullLifecycle(t *testing.T) {
	h := newHarness(t, Options{Plugin: host.PluginConfig{Name: "kitchen"}})
	rep, err := h.Do(context.Background(), Request{
		Method: "POST", Path: "/items",
		Headers:  [][2]string{{"x-op", "add-header,buffer-body,trailers,resp-body"}, {"x-remove", "x"}},
		Body:     [][]byte{[]byte("hello "), []byte("world")},
		Trailers: [][2]string{{"t", "1"}},
		Response: Response{Status: 201, Headers: [][2]string{{"content-type", "text/plain"}},
			Body: [][]byte{[]byte("hi")}},
	})
	require.NoError(t, err)
	require.NotNil(t, rep.Upstream)
	assert.Equal(t, "1", rep.Upstream.Header("x-added"))
	assert.Equal(t, "", rep.Upstream.Header("x-remove"))
	assert.Equal(t, "POST", rep.Upstream.Header(":method"))
	// The guest buffers the body waiting for its end, but trailers end this request: the
	// buffered body goes upstream untouched once the trailers continue, and the trailers
	// were extended (x-trailer-added carries the trailer count).
	assert.Equal(t, "hello world", string(rep.Upstream.Body))
	assert.Contains(t, rep.Upstream.Trailers, [2]string{"x-trailer-added", "1"})
	assert.Equal(t, 201, rep.Status)
	// x-response-added carries the number of response headers the guest was given.
	assert.Equal(t, "2", rep.Client.Header("x-response-added"))
	assert.Equal(t, "hi world", string(rep.Client.Body))
	assert.Nil(t, rep.LocalResponse)
	assert.Equal(t, []Phase{PhaseRequestHeaders, PhaseRequestBody, PhaseRequestBody, PhaseRequestTrailers,
		PhaseResponseHeaders, PhaseResponseBody, PhaseLog}, phases(rep))
	first, _ := rep.Phase(PhaseRequestBody)
	assert.Equal(t, host.Pause, first.Action)
	m, ok := rep.Metric("requests_total")
	require.True(t, ok)
	assert.Equal(t, int64(1), m.Value)
	// Without trailers the body ends with end_of_stream and the guest rewrites it.
	rep2, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "buffer-body"}},
		Body: [][]byte{[]byte("hello "), []byte("world")}})
	require.NoError(t, err)
	assert.Equal(t, "HELLO WORLD", string(rep2.Upstream.Body))

	var access bool
	for _, l := range rep.Logs {
		if l.Message == "access path=/items status=201" && l.Source == "proxy_log" && l.Level == host.LogInfo {
			access = true
		}
	}
	assert.True(t, access, "%v", rep.Logs)
}

func TestLocalReplyGoesThroughTheResponseCallbacks(t *testing.T) {
	h := newHarness(t, Options{})
	rep, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "local"}}})
	require.NoError(t, err)
	assert.Nil(t, rep.Upstream)
	require.NotNil(t, rep.LocalResponse)
	assert.Equal(t, "denied by test", rep.LocalResponse.Details)
	assert.Equal(t, 403, rep.Status)
	assert.Equal(t, "nope", string(rep.Client.Body))
	assert.Equal(t, "yes", rep.Client.Header("x-local"))
	assert.Equal(t, "text/plain", rep.Client.Header("content-type"))
	// Envoy encodes a local reply through the filter chain, this filter included: the guest
	// saw :status, content-length, content-type and x-local.
	assert.Equal(t, "4", rep.Client.Header("x-response-added"))
	rh, _ := rep.Phase(PhaseResponseHeaders)
	assert.True(t, rh.LocalReply)

	// For a gRPC request the reply is a trailers-only gRPC response.
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "local"}, {"content-type", "application/grpc"}}})
	require.NoError(t, err)
	assert.Equal(t, 200, rep.Status)
	assert.Equal(t, "7", rep.Client.Header("grpc-status")) // 403 -> PERMISSION_DENIED
	assert.Equal(t, "nope", rep.Client.Header("grpc-message"))

	// A reply sent while encoding the upstream response replaces it directly.
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "resp-local"}}})
	require.NoError(t, err)
	assert.NotNil(t, rep.Upstream)
	assert.Equal(t, 502, rep.Status)
	assert.Equal(t, "replaced", string(rep.Client.Body))
	assert.Equal(t, "", rep.Client.Header("x-response-added"))
}

func TestHTTPCalls(t *testing.T) {
	calls := ByCluster(map[string]HTTPCallAnswer{"auth": Respond(200, [][2]string{{"x-a", "1"}}, "ok")})
	h := newHarness(t, Options{HTTPCalls: calls})
	rep, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "httpcall"}}})
	require.NoError(t, err)
	ph, _ := rep.Phase(PhaseRequestHeaders)
	assert.Equal(t, host.Pause, ph.Action)
	assert.True(t, ph.Resumed)
	assert.Equal(t, time.Duration(0), ph.Waited)
	require.NotNil(t, rep.Upstream)
	assert.Equal(t, "200:ok:0:2:200", rep.Upstream.Header("x-auth"))
	require.Len(t, rep.HTTPCalls, 1)
	assert.Equal(t, "auth", rep.HTTPCalls[0].Request.Cluster)
	assert.False(t, rep.HTTPCalls[0].Pending)
	assert.Equal(t, "ok", string(rep.HTTPCalls[0].Response.Body))

	// A delayed answer: Do lets virtual time pass until it arrives.
	delayed := Respond(200, nil, "late")
	delayed.Delay = 300 * time.Millisecond
	h = newHarness(t, Options{HTTPCalls: func(*host.HTTPCallRequest) HTTPCallAnswer { return delayed }})
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "httpcall"}}})
	require.NoError(t, err)
	ph, _ = rep.Phase(PhaseRequestHeaders)
	assert.Equal(t, 300*time.Millisecond, ph.Waited)
	assert.Equal(t, "200:late:0:1:200", rep.Upstream.Header("x-auth"))

	// No answer: the call times out after the guest's timeout, as a failure.
	h = newHarness(t, Options{HTTPCalls: func(*host.HTTPCallRequest) HTTPCallAnswer { return NoAnswer() }})
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "httpcall"}, {"x-call-timeout", "1500"}}})
	require.NoError(t, err)
	ph, _ = rep.Phase(PhaseRequestHeaders)
	assert.Equal(t, 1500*time.Millisecond, ph.Waited)
	assert.Equal(t, "failed:11:timeout", rep.Upstream.Header("x-auth"))
	require.Len(t, rep.HTTPCalls, 1)
	assert.ErrorIs(t, rep.HTTPCalls[0].Err, host.ErrHTTPCallTimeout)

	// The call's answer can deny the request.
	h = newHarness(t, Options{HTTPCalls: calls})
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "deny-on-call"}}})
	require.NoError(t, err)
	assert.Nil(t, rep.Upstream)
	assert.Equal(t, 401, rep.Status)
	assert.Equal(t, "call said no", string(rep.Client.Body))
}

func TestStalledStream(t *testing.T) {
	h := newHarness(t, Options{})
	rep, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "pause"}}, MaxWait: -1})
	require.NoError(t, err)
	assert.Equal(t, PhaseRequestHeaders, rep.Stalled)
	assert.Nil(t, rep.Upstream)
	assert.Equal(t, 0, rep.Status)
	assert.Equal(t, PhaseLog, rep.Phases[len(rep.Phases)-1].Phase)

	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "close"}}})
	require.NoError(t, err)
	assert.True(t, rep.Closed)
	assert.Equal(t, 0, rep.Status)
}

func TestFailurePolicies(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		h := newHarness(t, Options{Plugin: host.PluginConfig{FailOpen: failOpen}})
		rep, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "trap"}}})
		require.NoError(t, err)
		require.Len(t, rep.Failures, 1)
		assert.Equal(t, host.FailureTrap, rep.Failures[0].Kind)
		if failOpen {
			// The request goes on as if the filter were absent from then on; what the guest
			// changed before it trapped stays changed, as in Envoy.
			require.NotNil(t, rep.Upstream)
			assert.Equal(t, "5/1", rep.Upstream.Header("x-seen-headers"))
			assert.Equal(t, 200, rep.Status)
			assert.Equal(t, "", rep.Client.Header("x-response-added"))
		} else {
			assert.Nil(t, rep.Upstream)
			assert.Equal(t, 503, rep.Status)
			assert.Equal(t, host.FailStreamDetails, rep.LocalResponse.Details)
		}
		assert.Equal(t, int64(1), h.Stats().Failures[host.FailureTrap])
		assert.Equal(t, int64(1), h.Stats().Replacements)
		// The next request is served by the replacement instance.
		rep, err = h.Do(context.Background(), Request{})
		require.NoError(t, err)
		assert.Empty(t, rep.Failures)
		assert.Equal(t, "4/1", rep.Upstream.Header("x-seen-headers"))
	}
}

func TestTicksAndSharedDataAcrossInstances(t *testing.T) {
	h := newHarness(t, Options{Plugin: host.PluginConfig{Instances: 2, VMID: "vm", Configuration: []byte("tick=1000")}})
	h.Advance(3500 * time.Millisecond)
	m, _ := h.Metric("ticks_total")
	assert.Equal(t, int64(6), m.Value) // 3 ticks on each instance
	var ticks int
	for _, l := range h.Logs() {
		if len(l.Message) > 5 && l.Message[:5] == "tick " {
			ticks++
		}
	}
	assert.Equal(t, 6, ticks)

	for i := 0; i < 4; i++ {
		rep, err := h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "shared"}}, Worker: i % 2, PinWorker: true})
		require.NoError(t, err)
		assert.Equal(t, i%2, rep.Worker)
	}
	assert.Equal(t, "4", string(h.SharedData()["counter"]))
}

// The harness runs the stream as meshproxy does (httpfilter): a body held past the buffer
// limit gets Envoy's 413, a reply from the response path of the filter's own local reply
// replaces it, and a reply after the response headers went on resets the stream.
func TestStreamSemanticsShared(t *testing.T) {
	h := newHarness(t, Options{BufferLimit: 8})
	rep, err := h.Do(context.Background(), Request{Method: "POST", Headers: [][2]string{{"x-op", "buffer-body"}},
		Body: [][]byte{[]byte("12345"), []byte("67890"), []byte("!")}})
	require.NoError(t, err)
	assert.Nil(t, rep.Upstream)
	assert.Equal(t, 413, rep.Status)
	assert.Equal(t, "request_payload_too_large", rep.LocalResponse.Details)
	assert.Equal(t, "Payload Too Large", string(rep.Client.Body))
	assert.Len(t, phasesOf(rep, PhaseRequestBody), 1, "the guest never sees the chunk past the limit")

	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "local,resp-local"}}})
	require.NoError(t, err)
	assert.Equal(t, 502, rep.Status)
	assert.Equal(t, "replaced", string(rep.Client.Body))
	assert.Equal(t, "replaced by test", rep.LocalResponse.Details)

	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "resp-buffer"}},
		Response: Response{Body: [][]byte{[]byte("0123456789")}, Trailers: [][2]string{{"t", "1"}}}})
	require.NoError(t, err)
	assert.True(t, rep.Closed, "the response headers went on before its body outgrew the limit")
	assert.Equal(t, "response_payload_too_large", rep.CloseDetails)
	assert.Equal(t, 0, rep.Status)
}

func phasesOf(r *Report, p Phase) []PhaseReport {
	var out []PhaseReport
	for _, ph := range r.Phases {
		if ph.Phase == p {
			out = append(out, ph)
		}
	}
	return out
}
