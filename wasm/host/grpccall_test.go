package host

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// sdkGuest builds filters/internal/sdkguest, the upstream Go SDK guest whose grpc* ops
// make proxy_grpc_call with raw imports (the SDK has no gRPC call API).
func sdkGuest(tb testing.TB) []byte {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), "../../filters/internal/sdkguest", wasmbuild.Options{})
	require.NoError(tb, err)
	b, err := art.Bytes()
	require.NoError(tb, err)
	return b
}

// grpcUpstream is a GRPCCallDispatcher whose answers the test controls.
type grpcUpstream struct {
	mu      sync.Mutex
	reqs    []*GRPCCallRequest
	ctxs    []context.Context
	pending []func(*GRPCCallResponse, error)
	// answer, when set, answers at once (from another goroutine, as a real client).
	answer  func(*GRPCCallRequest) (*GRPCCallResponse, error)
	unknown bool
}

func (u *grpcUpstream) DispatchGRPCCall(ctx context.Context, req *GRPCCallRequest, done func(*GRPCCallResponse, error)) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.unknown {
		return ErrUnknownCluster
	}
	u.reqs = append(u.reqs, req)
	u.ctxs = append(u.ctxs, ctx)
	u.pending = append(u.pending, done)
	if u.answer != nil {
		go done(u.answer(req))
	}
	return nil
}

func (u *grpcUpstream) call(i int) (*GRPCCallRequest, context.Context, func(*GRPCCallResponse, error)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reqs[i], u.ctxs[i], u.pending[i]
}

const grpcTestConfig = `{"grpc": {"target": "rls", "grpcService": true, "authority": "rls.example",
	"service": "envoy.service.ratelimit.v3.RateLimitService", "method": "ShouldRateLimit", "timeoutMs": 250}}`

func grpcFixture(t *testing.T, config string, env Environment) *fixture {
	t.Helper()
	return newFixtureOf(t, "sdkguest", sdkGuest(t), PluginConfig{Configuration: []byte(config)}, env)
}

// grpcRequest runs the request headers of one grpc op; finish waits for the stream to be
// resumed if it paused, then runs the response headers and returns what the guest
// reported.
func grpcRequest(t *testing.T, f *fixture, op string, extra ...[2]string) (finish func() *Headers) {
	t.Helper()
	sigs := &signals{}
	s, res, _ := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, append([][2]string{{"x-op", op}}, extra...)...)
	t.Cleanup(func() { s.Finish(context.Background()) })
	return func() *Headers {
		t.Helper()
		if res.Action == Pause {
			eventually(t, &sigs.notify, func() bool { return len(sigs.list()) > 0 }, "the stream resumed")
			assert.Equal(t, []Signal{{Kind: SignalContinue, Stream: StreamRequest}}, sigs.list())
		}
		resp := NewHeaders([2]string{":status", "200"})
		s.OnResponseHeaders(context.Background(), resp, true)
		return resp
	}
}

// noUnknownCalls checks that the guest never got a callback for a call it no longer had.
func noUnknownCalls(t *testing.T, f *fixture) {
	t.Helper()
	for _, m := range f.logs.messages() {
		assert.NotContains(t, m, "unknown grpc call")
	}
}

// A call that succeeds: the request as the guest made it, then proxy_on_grpc_receive alone
// (as Envoy's unary call), the message in GrpcReceiveBuffer, in the root context, and the
// guest resumes its stream.
func TestGRPCCallSuccess(t *testing.T) {
	up := &grpcUpstream{answer: func(req *GRPCCallRequest) (*GRPCCallResponse, error) {
		return &GRPCCallResponse{
			InitialMetadata:  [][2]string{{"content-type", "application/grpc"}, {"x-a", "1"}},
			Message:          append([]byte("re:"), req.Message...),
			TrailingMetadata: [][2]string{{"x-t", "2"}},
		}, nil
	}}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	h := grpcRequest(t, f, "grpc", [2]string{"x-grpc-message", "hello"}, [2]string{"x-grpc-md", "k1=v1,k2=v2"})()
	assert.Equal(t, "0", hget(h, "x-grpc-call"))
	assert.Equal(t, "1", hget(h, "x-grpc-id"), "call ids are odd, from 1")
	assert.Equal(t, "msg(8:re:hello:0:0:content-type=application/grpc;x-a=1#x-t=2)", hget(h, "x-grpc-trace"))
	req, callCtx, _ := up.call(0)
	assert.Equal(t, &GRPCCallRequest{Cluster: "rls", Authority: "rls.example",
		Service: "envoy.service.ratelimit.v3.RateLimitService", Method: "ShouldRateLimit",
		Metadata: [][2]string{{"k1", "v1"}, {"k2", "v2"}}, Message: []byte("hello"),
		Timeout: 250 * time.Millisecond, Plugin: "sdkguest"}, req)
	<-callCtx.Done()
	assert.ErrorIs(t, context.Cause(callCtx), context.Canceled)
	noUnknownCalls(t, f)
}

// A plain cluster name instead of a GrpcService; no timeout.
func TestGRPCCallToAPlainClusterName(t *testing.T) {
	up := &grpcUpstream{answer: func(req *GRPCCallRequest) (*GRPCCallResponse, error) {
		return &GRPCCallResponse{Message: []byte("ok")}, nil
	}}
	f := grpcFixture(t, `{"grpc": {"target": "outbound|8081||ratelimit.default.svc.cluster.local", "service": "s", "method": "m"}}`,
		Environment{GRPCCalls: up})
	h := grpcRequest(t, f, "grpc")()
	assert.Equal(t, "msg(2:ok:0:0:#)", hget(h, "x-grpc-trace"))
	req, _, _ := up.call(0)
	assert.Equal(t, "outbound|8081||ratelimit.default.svc.cluster.local", req.Cluster)
	assert.Empty(t, req.Authority)
	assert.Zero(t, req.Timeout)
}

// A call answered with an error status: no message, proxy_on_grpc_close(code) alone, with
// grpc-message through proxy_get_status.
func TestGRPCCallErrorStatus(t *testing.T) {
	up := &grpcUpstream{answer: func(*GRPCCallRequest) (*GRPCCallResponse, error) {
		return &GRPCCallResponse{TrailingMetadata: [][2]string{{"grpc-status", "7"}},
			Message: []byte("not delivered"), Status: 7, StatusMessage: "denied"}, nil
	}}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	h := grpcRequest(t, f, "grpc")()
	assert.Equal(t, "close(7:7:denied:buf=1)", hget(h, "x-grpc-trace"))

	// A dispatcher that fails without an answer: UNAVAILABLE with its error's text.
	up.answer = func(*GRPCCallRequest) (*GRPCCallResponse, error) {
		return nil, errors.New("connect: connection refused")
	}
	h = grpcRequest(t, f, "grpc")()
	assert.Equal(t, "close(14:14:connect: connection refused:buf=1)", hget(h, "x-grpc-trace"))
	noUnknownCalls(t, f)
}

// The host times the call out with its clock: close(4) "timeout", the dispatcher's context
// ends with ErrGRPCCallTimeout, and a late answer is dropped.
func TestGRPCCallTimeout(t *testing.T) {
	clock := NewManualClock(time.Unix(1000, 0))
	up := &grpcUpstream{}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up, Clock: clock})
	sigs := &signals{}
	s, res, _ := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "grpc"})
	defer s.Finish(context.Background())
	require.Equal(t, Pause, res.Action)
	clock.Advance(249 * time.Millisecond)
	assert.Empty(t, sigs.list())
	clock.Advance(time.Millisecond)
	require.Equal(t, []Signal{{Kind: SignalContinue, Stream: StreamRequest}}, sigs.list())
	resp := NewHeaders()
	s.OnResponseHeaders(context.Background(), resp, true)
	assert.Equal(t, "close(4:4:timeout:buf=1)", hget(resp, "x-grpc-trace"))
	_, callCtx, done := up.call(0)
	assert.ErrorIs(t, context.Cause(callCtx), ErrGRPCCallTimeout)
	done(&GRPCCallResponse{Message: []byte("late")}, nil)
	assert.Len(t, sigs.list(), 1)
	noUnknownCalls(t, f)
}

// proxy_grpc_cancel ends the call: Ok, then NotFound for a second cancel and for a close;
// the dispatcher's context ends with ErrGRPCCallCancelled and the answer reaches no one.
func TestGRPCCallCancel(t *testing.T) {
	up := &grpcUpstream{}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	h := grpcRequest(t, f, "grpc-cancel")()
	assert.Equal(t, "0", hget(h, "x-grpc-call"))
	assert.Equal(t, "0,1,1", hget(h, "x-grpc-cancel"))
	_, callCtx, done := up.call(0)
	assert.ErrorIs(t, context.Cause(callCtx), ErrGRPCCallCancelled)
	done(&GRPCCallResponse{Message: []byte("late")}, nil)
	// A second call proves the instance went on (and ran anything queued) since.
	up.answer = func(*GRPCCallRequest) (*GRPCCallResponse, error) { return &GRPCCallResponse{Status: 5}, nil }
	h = grpcRequest(t, f, "grpc")()
	assert.Equal(t, "3", hget(h, "x-grpc-id"))
	assert.Equal(t, "close(5:5::buf=1)", hget(h, "x-grpc-trace"))
	noUnknownCalls(t, f)
}

// Cancelling from inside the callback: the call is still known there, as in Envoy (Ok),
// and nothing follows.
func TestGRPCCallCancelInACallback(t *testing.T) {
	up := &grpcUpstream{}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	for _, tc := range []struct {
		at, trace string
		resp      *GRPCCallResponse
	}{
		{"msg", "msg(1:m:0:0:x=y#)|cancel=0", &GRPCCallResponse{InitialMetadata: [][2]string{{"x", "y"}}, Message: []byte("m")}},
		{"close", "close(9:9::buf=1)|cancel=0", &GRPCCallResponse{Status: 9}},
	} {
		t.Run(tc.at, func(t *testing.T) {
			up.answer = func(*GRPCCallRequest) (*GRPCCallResponse, error) { return tc.resp, nil }
			h := grpcRequest(t, f, "grpc-cancel-in-"+tc.at)()
			assert.Equal(t, tc.trace, hget(h, "x-grpc-trace"))
		})
	}
	noUnknownCalls(t, f)
}

func TestGRPCCallErrors(t *testing.T) {
	// No dispatcher: the embedder does not support gRPC calls.
	f := grpcFixture(t, grpcTestConfig, Environment{})
	h := grpcRequest(t, f, "grpc")()
	assert.Equal(t, "12", hget(h, "x-grpc-call"))

	up := &grpcUpstream{unknown: true}
	f = grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	h = grpcRequest(t, f, "grpc")()
	assert.Equal(t, "2", hget(h, "x-grpc-call"), "unknown cluster")

	// No method: BadArgument before any dispatch.
	up.unknown = false
	f = grpcFixture(t, `{"grpc": {"target": "rls", "service": "s"}}`, Environment{GRPCCalls: up})
	h = grpcRequest(t, f, "grpc")()
	assert.Equal(t, "2", hget(h, "x-grpc-call"))
	assert.Empty(t, up.reqs)
}

// Closing the plugin cancels a pending call (cause ErrClosed), without a callback.
func TestGRPCCallCancelledByPluginClose(t *testing.T) {
	up := &grpcUpstream{}
	f := grpcFixture(t, grpcTestConfig, Environment{GRPCCalls: up})
	sigs := &signals{}
	s, res, _ := f.headersOnly(t, StreamOptions{OnSignal: sigs.add}, [2]string{"x-op", "grpc"})
	require.Equal(t, Pause, res.Action)
	_, callCtx, done := up.call(0)
	require.NoError(t, f.p.Close(context.Background()))
	assert.ErrorIs(t, context.Cause(callCtx), ErrClosed)
	done(&GRPCCallResponse{}, nil)
	s.Finish(context.Background())
	for _, sig := range sigs.list() {
		assert.NotEqual(t, SignalContinue, sig.Kind)
	}
	noUnknownCalls(t, f)
}

func protoField(field uint64, v []byte) []byte {
	b := binary.AppendUvarint(nil, field<<3|2)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func TestParseGRPCService(t *testing.T) {
	envoyGRPC := protoField(1, append(protoField(1, []byte("rls")), protoField(2, []byte("rls.local"))...))
	md := protoField(5, append(protoField(1, []byte("k")), protoField(2, []byte("v"))...))
	timeout := []byte{3<<3 | 2, 2, 1<<3 | 0, 5} // timeout {seconds: 5}, skipped
	for _, tc := range []struct {
		name string
		in   []byte
		want grpcTarget
		ok   bool
	}{
		{"envoy_grpc", envoyGRPC, grpcTarget{cluster: "rls", authority: "rls.local"}, true},
		{"with metadata and timeout", append(append(append([]byte{}, envoyGRPC...), md...), timeout...),
			grpcTarget{cluster: "rls", authority: "rls.local", metadata: [][2]string{{"k", "v"}}}, true},
		{"google_grpc", protoField(2, protoField(1, []byte("dns:///x"))), grpcTarget{google: true}, true},
		// Names are no messages: 'o' is wire type 7, 'r' a length past the end.
		{"cluster name", []byte("outbound|8081||rls.default.svc.cluster.local"), grpcTarget{}, false},
		{"short name", []byte("rls"), grpcTarget{}, false},
		// Well formed (field 12, fixed64) but naming no cluster: a plain name.
		{"parses but names nothing", []byte("abcdefghi"), grpcTarget{}, false},
		{"truncated", envoyGRPC[:len(envoyGRPC)-1], grpcTarget{}, false},
		{"empty", nil, grpcTarget{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseGRPCService(tc.in)
			assert.Equal(t, tc.ok, ok)
			if tc.ok {
				assert.Equal(t, tc.want, got)
			}
		})
	}
}

// FuzzParseGRPCService: any bytes either name a target or are taken as a plain cluster
// name, without a panic; a parsed target names a cluster or google_grpc.
func FuzzParseGRPCService(f *testing.F) {
	f.Add([]byte("outbound|8081||rls.default.svc.cluster.local"))
	f.Add(protoField(1, protoField(1, []byte("rls"))))
	f.Add(protoField(5, protoField(1, []byte("k"))))
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := parseGRPCService(b)
		if ok && got.cluster == "" && !got.google {
			t.Fatalf("parsed %x as a target naming nothing", b)
		}
	})
}
