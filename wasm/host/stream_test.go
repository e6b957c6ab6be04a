package host

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxy_send_local_response is deferred until the callback returns, as in Envoy: the guest
// keeps running (and can still modify the request) after sending, and the reply is part of
// the callback's Result.
func TestLocalResponseIsDeferred(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, h := f.op(t, "local")
	assert.Equal(t, Pause, res.Action)
	require.NotNil(t, res.LocalResponse)
	assert.Equal(t, &LocalResponse{StatusCode: 403, Details: "denied by test", Body: []byte("nope"),
		Headers: [][2]string{{"x-local", "yes"}}, GRPCStatus: -1}, res.LocalResponse)
	assert.Equal(t, "1", hget(h, "x-after-local"))
	assert.Contains(t, f.logs.messages(), "local response sent status=0 then add=0")

	// A filter that sends a local reply and returns Continue still gets its reply.
	res, _ = f.op(t, "local-continue")
	assert.Equal(t, Continue, res.Action)
	require.NotNil(t, res.LocalResponse)
	assert.Equal(t, 403, res.LocalResponse.StatusCode)

	// From the response path.
	ctx := context.Background()
	s, _, _ := f.headersOnly(t, StreamOptions{}, [2]string{"x-op", "resp-local"})
	res = s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "200"}), true)
	require.NotNil(t, res.LocalResponse)
	assert.Equal(t, 502, res.LocalResponse.StatusCode)
	s.Finish(ctx)
}

func TestCloseStreamAndLifecycleCallbacks(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	res, _ := f.op(t, "close")
	assert.Equal(t, Pause, res.Action)
	assert.Equal(t, []Signal{{Kind: SignalClose, Stream: StreamRequest}}, res.Signals)

	// on_log sees the request and response headers; on_done and on_delete follow.
	ctx := context.Background()
	s, _, _ := f.headersOnly(t, StreamOptions{}, [2]string{":path", "/logged"})
	s.OnResponseHeaders(ctx, NewHeaders([2]string{":status", "201"}), true)
	s.Finish(ctx)
	s.Finish(ctx) // idempotent
	assert.Contains(t, f.logs.messages(), "access path=/logged status=201")
	m, _ := f.p.Metrics().Get("deletes_total", MetricCounter)
	assert.Equal(t, int64(2), m.Value)
	// Calls after Finish do nothing.
	assert.True(t, s.OnResponseBody(ctx, []byte("x"), true).Skipped)
	assert.Equal(t, int64(0), f.p.Stats().ActiveStreams)
}
