//go:build !wasip1

// The global mode natively: the SDK's emulator has no gRPC, so these tests give the VM
// context a scripted gRPC host that records each call (decoded with go-control-plane's
// types) and deliver the answer through the same VM callbacks the wasip1 exports call.
// wasm_global_test.go runs the same paths on the real host.

package main

import (
	"testing"
	"time"
	"unsafe"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/wasmesh/wasmesh/filters/internal/emulator"
)

// grpcCall is one call the filter made.
type grpcCall struct {
	id                                  uint32
	cluster, authority, service, method string
	timeout                             time.Duration
	req                                 *rlsv3.RateLimitRequest
}

// scriptedGRPC is the gRPC host of the native tests.
type scriptedGRPC struct {
	t         testing.TB
	calls     []grpcCall
	cancelled []uint32
	refuse    error  // call fails with it
	msg       []byte // the message proxy_get_buffer_bytes gives during onGrpcReceive
	next      uint32
}

func (g *scriptedGRPC) call(target []byte, service, method string, message []byte, timeout time.Duration) (uint32, error) {
	if g.refuse != nil {
		return 0, g.refuse
	}
	var gs corev3.GrpcService
	require.NoError(g.t, proto.Unmarshal(target, &gs))
	require.NoError(g.t, gs.ValidateAll(), "the target passes Envoy's validation")
	var req rlsv3.RateLimitRequest
	require.NoError(g.t, proto.Unmarshal(message, &req))
	require.NoError(g.t, req.ValidateAll(), "the request passes Envoy's validation")
	g.next++
	g.calls = append(g.calls, grpcCall{id: g.next, cluster: gs.GetEnvoyGrpc().GetClusterName(), authority: gs.GetEnvoyGrpc().GetAuthority(),
		service: service, method: method, timeout: timeout, req: &req})
	return g.next, nil
}

func (g *scriptedGRPC) cancel(id uint32) error {
	g.cancelled = append(g.cancelled, id)
	return nil
}

func (g *scriptedGRPC) message(size uint32) ([]byte, error) {
	require.Equal(g.t, len(g.msg), int(size))
	return g.msg, nil
}

func (g *scriptedGRPC) statusMessage() string { return "deadline exceeded" }

type globalEnv struct {
	host  proxytest.HostEmulator
	vm    *recorder
	grpc  *scriptedGRPC
	clock *clock
}

func startGlobal(t *testing.T, cfg string) *globalEnv {
	t.Helper()
	c := newClock()
	g := &scriptedGRPC{t: t}
	vm := &recorder{vmContext: vmContext{now: c.now, grpc: g}}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
	host := emulator.Start(t, opt)
	require.Equal(t, types.OnPluginStartStatusOK, host.StartPlugin(), "critical logs: %v", host.GetCriticalLogs())
	return &globalEnv{host: host, vm: vm, grpc: g, clock: c}
}

// begin sends request headers; the stream's id and the filter's action come back.
func (e *globalEnv) begin(extra ...string) (uint32, types.Action) {
	hs := [][2]string{{":method", "GET"}, {":path", "/api"}, {":authority", "front:8080"}}
	for i := 0; i+1 < len(extra); i += 2 {
		hs = append(hs, [2]string{extra[i], extra[i+1]})
	}
	id := e.host.InitializeHttpContext()
	return id, e.host.CallOnRequestHeaders(id, hs, true)
}

// answer delivers the service's response to the last call, as Envoy does for a unary
// call: proxy_on_grpc_receive alone.
func (e *globalEnv) answer(t *testing.T, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	b, err := proto.Marshal(resp)
	require.NoError(t, err)
	e.grpc.msg = b
	call := e.grpc.calls[len(e.grpc.calls)-1]
	e.vm.onGrpcReceive(call.id, uint32(len(b)))
}

// finish runs the response through the filter if the request went on; it returns the
// status the client got and its headers.
func (e *globalEnv) finish(t *testing.T, id uint32) (uint32, map[string]string, string) {
	t.Helper()
	headers := map[string]string{}
	if lr := e.host.GetSentLocalResponse(id); lr != nil {
		for _, h := range lr.Headers {
			headers[h[0]] = h[1]
		}
		return lr.StatusCode, headers, string(lr.Data)
	}
	require.Equal(t, types.ActionContinue, e.host.GetCurrentHttpStreamAction(id), "the request went on")
	e.host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	for _, h := range e.host.GetCurrentResponseHeaders(id) {
		if h[0] != ":status" {
			headers[h[0]] = h[1]
		}
	}
	return 200, headers, ""
}

func (e *globalEnv) counter(t *testing.T, name string) uint64 {
	t.Helper()
	n, err := e.host.GetCounterMetric(name)
	require.NoError(t, err, name)
	return n
}

const globalFront = `{"rate_limit_headers": true, "rate_limit_service": {"cluster": "outbound|8081||ratelimit.wasmesh-system.svc.cluster.local",
	"authority": "ratelimit.wasmesh-system.svc.cluster.local", "domain": "mesh"},
	"descriptors": [
		{"name": "front", "mode": "global", "entries": [{"key": "generic_key", "source": "generic_key", "value": "front"}]},
		{"name": "per_user", "mode": "global", "entries": [{"key": "user", "source": "header", "header": "x-user"}],
		 "overrides": [{"match": {"user": "canary"}, "shadow": true}]}]}`

func okStatus(limit, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
		CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
		LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset)}
}

func overStatus(limit uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	s := okStatus(limit, 0, reset)
	s.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	return s
}

func TestGlobalAllowedAsksTheServiceOnce(t *testing.T) {
	e := startGlobal(t, globalFront)
	id, action := e.begin("x-user", "alice")
	assert.Equal(t, types.ActionPause, action, "the request waits for the service")
	require.Len(t, e.grpc.calls, 1)
	c := e.grpc.calls[0]
	assert.Equal(t, "outbound|8081||ratelimit.wasmesh-system.svc.cluster.local", c.cluster)
	assert.Equal(t, "ratelimit.wasmesh-system.svc.cluster.local", c.authority)
	assert.Equal(t, "envoy.service.ratelimit.v3.RateLimitService", c.service)
	assert.Equal(t, "ShouldRateLimit", c.method)
	assert.Equal(t, 20*time.Millisecond, c.timeout, "Envoy's default timeout")
	assert.Equal(t, "mesh", c.req.GetDomain())
	assert.Equal(t, uint32(1), c.req.GetHitsAddend())
	require.Len(t, c.req.GetDescriptors(), 2)
	assert.Equal(t, "generic_key", c.req.GetDescriptors()[0].GetEntries()[0].GetKey())
	assert.Equal(t, "front", c.req.GetDescriptors()[0].GetEntries()[0].GetValue())
	assert.Equal(t, "alice", c.req.GetDescriptors()[1].GetEntries()[0].GetValue())

	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{okStatus(100, 7, 30*time.Second), okStatus(10, 3, 2500*time.Millisecond)},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-service-note", Value: "ok"}}})
	status, headers, _ := e.finish(t, id)
	assert.Equal(t, uint32(200), status)
	assert.Equal(t, map[string]string{"x-ratelimit-limit": "10", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "3",
		"x-service-note": "ok"}, headers, "the descriptor closest to its limit, and the service's headers")
	assert.Equal(t, uint64(1), e.counter(t, callsMetric("ok")))
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("front", "allowed")))
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("per_user", "allowed")))

	// Without x-user only the front descriptor applies.
	e.begin()
	require.Len(t, e.grpc.calls, 2)
	assert.Len(t, e.grpc.calls[1].req.GetDescriptors(), 1)
}

func TestGlobalOverLimitAnswers429(t *testing.T) {
	e := startGlobal(t, globalFront)
	id, _ := e.begin("x-user", "alice")
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			overStatus(100, 1500*time.Millisecond), overStatus(10, 4200*time.Millisecond)},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-service-note", Value: "over"}}})
	status, headers, body := e.finish(t, id)
	assert.Equal(t, uint32(429), status)
	assert.Equal(t, map[string]string{
		"content-type":          "text/plain; charset=utf-8",
		"x-ratelimit-limit":     "100", // the first descriptor over its limit
		"x-ratelimit-remaining": "0",
		"x-ratelimit-reset":     "5", // the longest wait of the denying ones, rounded up
		"retry-after":           "5",
		"x-service-note":        "over",
	}, headers)
	assert.Equal(t, "too many requests: quota front exhausted\n", body)
	assert.Equal(t, uint64(1), e.counter(t, callsMetric("over_limit")))
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("front", "denied")))
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("per_user", "denied")))

	// Only one descriptor over: the other is allowed, and the limit named is the one over.
	id, _ = e.begin("x-user", "bob")
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{okStatus(100, 50, time.Second), overStatus(10, 0)}})
	status, headers, body = e.finish(t, id)
	assert.Equal(t, uint32(429), status)
	assert.Equal(t, "10", headers["x-ratelimit-limit"])
	assert.Equal(t, "1", headers["retry-after"], "at least a second, as Envoy's retry-after")
	assert.Equal(t, "too many requests: quota per_user exhausted\n", body)
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("front", "allowed")))
}

func TestGlobalShadowCountsWithoutRejecting(t *testing.T) {
	e := startGlobal(t, globalFront)
	id, _ := e.begin("x-user", "canary")
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{okStatus(100, 9, time.Second), overStatus(10, 2*time.Second)}})
	status, headers, _ := e.finish(t, id)
	assert.Equal(t, uint32(200), status, "the override makes canary's descriptor shadow")
	assert.Equal(t, "0", headers["x-ratelimit-remaining"], "a shadow denial shapes the headers")
	assert.Equal(t, uint64(1), e.counter(t, globalRequestsMetric("per_user", "shadow_denied")))

	// An OVER_LIMIT naming no descriptor holds for all: front is enforced.
	id, _ = e.begin("x-user", "canary")
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT})
	status, _, _ = e.finish(t, id)
	assert.Equal(t, uint32(429), status)
}

func TestGlobalFailurePolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		service string
		fail    func(e *globalEnv)
		reason  string
		status  uint32
	}{
		"timeout, fail open": {`"cluster": "rls", "domain": "d"`,
			func(e *globalEnv) { e.vm.onGrpcClose(e.grpc.calls[0].id, grpcDeadlineExceeded) }, reasonTimeout, 200},
		"timeout, deny": {`"cluster": "rls", "domain": "d", "failure_mode_deny": true`,
			func(e *globalEnv) { e.vm.onGrpcClose(e.grpc.calls[0].id, grpcDeadlineExceeded) }, reasonTimeout, 500},
		"unavailable, deny with a chosen status": {`"cluster": "rls", "domain": "d", "failure_mode_deny": true, "status_on_error": 503`,
			func(e *globalEnv) { e.vm.onGrpcClose(e.grpc.calls[0].id, grpcUnavailable) }, reasonUnavailable, 503},
		"other gRPC error": {`"cluster": "rls", "domain": "d"`,
			func(e *globalEnv) { e.vm.onGrpcClose(e.grpc.calls[0].id, 13) }, reasonGRPCError, 200},
		"an answer that does not decode": {`"cluster": "rls", "domain": "d", "failure_mode_deny": true`,
			func(e *globalEnv) { e.grpc.msg = []byte{0x0b}; e.vm.onGrpcReceive(e.grpc.calls[0].id, 1) }, reasonBadResponse, 500},
		"OK without a message": {`"cluster": "rls", "domain": "d"`,
			func(e *globalEnv) { e.vm.onGrpcClose(e.grpc.calls[0].id, 0) }, reasonBadResponse, 200},
	} {
		t.Run(name, func(t *testing.T) {
			e := startGlobal(t, `{"rate_limit_service": {`+tc.service+`}, "descriptors": [{"name": "d", "mode": "global",
				"entries": [{"key": "generic_key", "source": "generic_key", "value": "x"}]}]}`)
			id, action := e.begin()
			require.Equal(t, types.ActionPause, action)
			tc.fail(e)
			status, headers, _ := e.finish(t, id)
			assert.Equal(t, tc.status, status)
			assert.Empty(t, headers["x-ratelimit-limit"], "no limit to report")
			assert.Equal(t, uint64(1), e.counter(t, callsMetric("error")))
			assert.Equal(t, uint64(1), e.counter(t, taggedName("wasmesh_quota_global_errors_total", [2]string{"reason", tc.reason})))
			allowed := uint64(0)
			if tc.status == 200 {
				allowed = 1
			}
			assert.Equal(t, allowed, e.counter(t, "wasmesh_quota_global_failure_mode_allowed_total"))
			assert.Len(t, e.host.GetErrorLogs(), 1, "the first error is logged")
		})
	}
}

func TestGlobalCallRefusedFailsOpenAtOnce(t *testing.T) {
	e := startGlobal(t, `{"rate_limit_service": {"cluster": "nowhere", "domain": "d"}, "descriptors": [{"name": "d", "mode": "global",
		"entries": [{"key": "generic_key", "source": "generic_key", "value": "x"}]}]}`)
	e.grpc.refuse = errStatus(2)
	for range 3 {
		id, action := e.begin()
		assert.Equal(t, types.ActionContinue, action)
		status, _, _ := e.finish(t, id)
		assert.Equal(t, uint32(200), status)
	}
	assert.Equal(t, uint64(3), e.counter(t, taggedName("wasmesh_quota_global_errors_total", [2]string{"reason", reasonCallFailed})))
	assert.Equal(t, uint64(3), e.counter(t, "wasmesh_quota_global_failure_mode_allowed_total"))
	require.Len(t, e.host.GetErrorLogs(), 1, "logged once")
	assert.Contains(t, e.host.GetErrorLogs()[0], `cluster "nowhere": bad argument`)
}

func TestGlobalStreamGoneCancelsTheCall(t *testing.T) {
	e := startGlobal(t, globalFront)
	id, _ := e.begin()
	e.host.CompleteHttpContext(id) // the client went away
	require.Len(t, e.grpc.calls, 1)
	assert.Equal(t, []uint32{e.grpc.calls[0].id}, e.grpc.cancelled)
	assert.Equal(t, uint64(1), e.counter(t, "wasmesh_quota_global_cancelled_total"))
	// A late callback for the cancelled call finds nothing to do.
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT})
	assert.Equal(t, uint64(0), e.counter(t, callsMetric("over_limit")))

	// A stream that got its answer cancels nothing when it ends.
	id, _ = e.begin()
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	e.finish(t, id)
	e.host.CompleteHttpContext(id)
	assert.Len(t, e.grpc.cancelled, 1)
}

func TestGlobalBothLocalBucketAnswersFirst(t *testing.T) {
	e := startGlobal(t, `{"rate_limit_headers": true, "rate_limit_service": {"cluster": "rls", "domain": "mesh", "timeout": "50ms"},
		"descriptors": [{"name": "per_user", "mode": "both", "entries": [{"key": "user", "source": "header", "header": "x-user"}],
		 "token_bucket": {"max_tokens": 2, "tokens_per_fill": 2, "fill_interval": "1m"}}]}`)
	for i := range 2 {
		id, action := e.begin("x-user", "alice")
		require.Equal(t, types.ActionPause, action, "request %d asks the service", i)
		e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{okStatus(1000, 900, time.Minute)}})
		status, headers, _ := e.finish(t, id)
		assert.Equal(t, uint32(200), status)
		assert.Equal(t, []string{"1", "0"}[i], headers["x-ratelimit-remaining"], "the local bucket is closer to its limit")
	}
	require.Len(t, e.grpc.calls, 2)
	assert.Equal(t, 50*time.Millisecond, e.grpc.calls[0].timeout)

	id, action := e.begin("x-user", "alice")
	assert.Equal(t, types.ActionPause, action)
	status, headers, _ := e.finish(t, id)
	assert.Equal(t, uint32(429), status, "the local bucket is empty")
	assert.Equal(t, "2", headers["x-ratelimit-limit"])
	assert.Len(t, e.grpc.calls, 2, "and the service was not asked")
	assert.Equal(t, uint64(1), e.counter(t, requestsMetric("per_user", "denied")))
}

func TestGlobalRequestType(t *testing.T) {
	for _, tc := range []struct {
		requestType string
		internal    bool
		asks        bool
	}{
		{"", true, true}, {"", false, true},
		{"internal", true, true}, {"internal", false, false},
		{"external", true, false}, {"external", false, true},
	} {
		e := startGlobal(t, `{"rate_limit_service": {"cluster": "rls", "domain": "d", "request_type": "`+tc.requestType+`"},
			"descriptors": [{"name": "d", "mode": "global", "entries": [{"key": "generic_key", "source": "generic_key", "value": "x"}]},
			{"name": "local", "token_bucket": {"max_tokens": 10, "fill_interval": "1s"}}]}`)
		extra := []string{"x-envoy-internal", "false"}
		if tc.internal {
			extra[1] = "true"
		}
		_, action := e.begin(extra...)
		assert.Equal(t, tc.asks, len(e.grpc.calls) == 1, "%+v", tc)
		assert.Equal(t, tc.asks, action == types.ActionPause, "%+v", tc)
	}
}

// The request headers the service asks for reach the upstream.
func TestGlobalRequestHeadersToAdd(t *testing.T) {
	e := startGlobal(t, globalFront)
	id, _ := e.begin()
	e.answer(t, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-tier", Value: "gold"}}})
	assert.Contains(t, e.host.GetCurrentRequestHeaders(id), [2]string{"x-ratelimit-tier", "gold"})
}

// The local mode allocates one httpContext per request; the global mode's state must not
// push it out of the 64-byte size class it had before the global mode.
func TestHTTPContextStaysSmall(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(httpContext{}), uintptr(64))
}
