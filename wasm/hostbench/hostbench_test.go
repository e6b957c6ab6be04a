package hostbench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// kitchen loads the host's test guest that adds x-response-added to every response.
func kitchen(t *testing.T) *Filter {
	t.Helper()
	ctx := context.Background()
	art, err := wasmbuild.Build(ctx, "../host/testdata/guests/kitchen", wasmbuild.Options{})
	require.NoError(t, err)
	code, err := art.Bytes()
	require.NoError(t, err)
	f, err := Load(ctx, code, host.RuntimeConfig{}, host.PluginConfig{Name: "kitchen"}, host.Environment{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	return f
}

// callbacks is the number of guest callbacks x takes.
func callbacks(t *testing.T, f *Filter, x Exchange) (int64, *host.Headers) {
	t.Helper()
	before := f.Plugin.Stats().Callbacks
	resp, err := f.Do(context.Background(), x)
	require.NoError(t, err)
	st := f.Plugin.Stats()
	require.Empty(t, st.Failures)
	return st.Callbacks - before, resp
}

func TestDoSendsTheWholeExchange(t *testing.T) {
	f := kitchen(t)
	x := Exchange{Request: [][2]string{{":method", "GET"}, {":path", "/"}}, Response: [][2]string{{":status", "200"}}}
	headersOnly, resp := callbacks(t, f, x)
	v, ok := resp.Get("x-response-added")
	assert.True(t, ok, "the response headers as the filter left them")
	assert.Equal(t, "1", v, "the filter saw the one response header")
	// context create, request headers, response headers, log, done, delete
	assert.GreaterOrEqual(t, headersOnly, int64(6))

	x.ResponseBody = []byte("ok")
	withBody, _ := callbacks(t, f, x)
	assert.Equal(t, headersOnly+1, withBody, "the body is one more callback")
}
