package harness

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/host"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// sdkGuest is filters/internal/sdkguest, whose grpc* ops make proxy_grpc_call.
func sdkGuest(tb testing.TB) []byte {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), "../../filters/internal/sdkguest", wasmbuild.Options{})
	require.NoError(tb, err)
	b, err := art.Bytes()
	require.NoError(tb, err)
	return b
}

func grpcHarness(t *testing.T, calls GRPCCallHandler) *Harness {
	return newHarness(t, Options{Wasm: sdkGuest(t), GRPCCalls: calls, Plugin: host.PluginConfig{
		Configuration: []byte(`{"grpc": {"target": "rls", "service": "s.v1.S", "method": "M", "timeoutMs": 800}}`)}})
}

func grpcDo(t *testing.T, h *Harness, extra ...[2]string) *Report {
	t.Helper()
	rep, err := h.Do(context.Background(), Request{Headers: append([][2]string{{"x-op", "grpc"}}, extra...),
		Response: Response{Status: 200}})
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	return rep
}

// Scenarios answer gRPC calls with a canned answer per cluster or a Go function of the
// request, after a virtual delay or never; each call is recorded in the report.
func TestGRPCCalls(t *testing.T) {
	h := grpcHarness(t, GRPCByCluster(map[string]GRPCCallAnswer{"rls": GRPCRespond([]byte("ok"))}))
	rep := grpcDo(t, h, [2]string{"x-grpc-message", "req"})
	assert.Equal(t, "msg(2:ok:0:0:#)", rep.Client.Header("x-grpc-trace"))
	require.Len(t, rep.GRPCCalls, 1)
	c := rep.GRPCCalls[0]
	assert.Equal(t, "rls", c.Request.Cluster)
	assert.Equal(t, "s.v1.S", c.Request.Service)
	assert.Equal(t, "M", c.Request.Method)
	assert.Equal(t, "req", string(c.Request.Message))
	assert.False(t, c.Pending)
	assert.Equal(t, "ok", string(c.Response.Message))
	assert.Len(t, h.GRPCCalls(), 1)

	// Another cluster is unknown: BadArgument at the call, nothing recorded.
	rep = grpcDo(t, h, [2]string{"x-grpc-target", "other"})
	assert.Equal(t, "2", rep.Client.Header("x-grpc-call"))
	assert.Empty(t, rep.GRPCCalls)

	// A Go function answers from the request, with a status, after virtual time.
	h = grpcHarness(t, func(req *host.GRPCCallRequest) GRPCCallAnswer {
		a := GRPCError(8, "over limit for "+string(req.Message))
		a.Delay = 300 * time.Millisecond
		return a
	})
	rep = grpcDo(t, h, [2]string{"x-grpc-message", "tenant-a"})
	ph, _ := rep.Phase(PhaseRequestHeaders)
	assert.Equal(t, 300*time.Millisecond, ph.Waited)
	assert.Equal(t, "close(8:8:over limit for tenant-a:buf=1)", rep.Client.Header("x-grpc-trace"))

	// No answer: the guest's timeout ends the call with DEADLINE_EXCEEDED.
	h = grpcHarness(t, func(*host.GRPCCallRequest) GRPCCallAnswer { return GRPCCallAnswer{} })
	rep = grpcDo(t, h)
	ph, _ = rep.Phase(PhaseRequestHeaders)
	assert.Equal(t, 800*time.Millisecond, ph.Waited)
	assert.Equal(t, "close(4:4:timeout:buf=1)", rep.Client.Header("x-grpc-trace"))
	require.Len(t, rep.GRPCCalls, 1)
	assert.ErrorIs(t, rep.GRPCCalls[0].Err, host.ErrGRPCCallTimeout)
	b, err := json.Marshal(rep.GRPCCalls[0])
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(b), `"error":"wasm host: grpc call timed out"`), string(b))

	// A failure without an answer: UNAVAILABLE.
	h = grpcHarness(t, func(*host.GRPCCallRequest) GRPCCallAnswer { return GRPCCallAnswer{Fail: true} })
	rep = grpcDo(t, h)
	assert.Equal(t, "close(14:14:harness: grpc call failed:buf=1)", rep.Client.Header("x-grpc-trace"))

	// A call the guest cancels is recorded as cancelled.
	h = grpcHarness(t, func(*host.GRPCCallRequest) GRPCCallAnswer { return GRPCCallAnswer{} })
	rep, err = h.Do(context.Background(), Request{Headers: [][2]string{{"x-op", "grpc-cancel"}}, Response: Response{Status: 200}})
	require.NoError(t, err)
	require.Len(t, rep.GRPCCalls, 1)
	assert.ErrorIs(t, rep.GRPCCalls[0].Err, host.ErrGRPCCallCancelled)
}
