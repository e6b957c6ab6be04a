//go:build !wasip1

// The global mode's real path: quota.wasm in wazero, proxy_grpc_call through the
// proxy-wasm host to the harness's gRPC dispatcher, whose stand-in service decodes the
// request with go-control-plane's types and answers a RateLimitResponse they encode. The
// host's virtual clock times calls out.

package main

import (
	"context"
	"sync"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// standIn is a rate-limit service: one counter per descriptor (its entries), a limit per
// first entry value, no windows (the tests are shorter than any).
type standIn struct {
	t      *testing.T
	limits map[string]uint32 // by the value of a descriptor's first entry
	mu     sync.Mutex
	counts map[string]uint32
	reqs   []*rlsv3.RateLimitRequest
}

func descriptorKey(d *commonrl.RateLimitDescriptor) string {
	k := ""
	for _, e := range d.GetEntries() {
		k += e.GetKey() + "=" + e.GetValue() + ";"
	}
	return k
}

func (s *standIn) handle(req *host.GRPCCallRequest) harness.GRPCCallAnswer {
	var in rlsv3.RateLimitRequest
	if err := proto.Unmarshal(req.Message, &in); err != nil {
		return harness.GRPCError(3, err.Error())
	}
	if err := in.ValidateAll(); err != nil {
		return harness.GRPCError(3, err.Error())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, &in)
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for _, d := range in.GetDescriptors() {
		limit, ok := s.limits[d.GetEntries()[0].GetValue()]
		if !ok {
			out.Statuses = append(out.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
			continue
		}
		key := descriptorKey(d)
		s.counts[key] += in.GetHitsAddend()
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: limit, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			DurationUntilReset: durationpb.New(42500 * time.Millisecond)}
		if s.counts[key] > limit {
			st.Code, out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
		} else {
			st.LimitRemaining = limit - s.counts[key]
		}
		out.Statuses = append(out.Statuses, st)
	}
	b, err := proto.Marshal(out)
	require.NoError(s.t, err)
	return harness.GRPCRespond(b)
}

const rlsCluster = "outbound|8081||ratelimit.default.svc.cluster.local"

func globalHarness(t *testing.T, cfg string, calls harness.GRPCCallHandler) *harness.Harness {
	t.Helper()
	return wasmtest.Harness(t, ".", harness.Options{GRPCCalls: calls,
		Plugin: host.PluginConfig{Name: "quota", Configuration: []byte(cfg), Instances: 2}})
}

func doGlobal(t *testing.T, h *harness.Harness, worker int, headers ...[2]string) *harness.Report {
	t.Helper()
	rep, err := h.Do(context.Background(), harness.Request{Path: "/api", Worker: worker, PinWorker: true, Headers: headers})
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	return rep
}

func metric(t *testing.T, h *harness.Harness, name string) int64 {
	t.Helper()
	m, ok := h.Metric(name)
	require.True(t, ok, "metric %s", name)
	return m.Value
}

const wasmGlobalConfig = `{"rate_limit_headers": true, "rate_limit_service": {"cluster": "` + rlsCluster + `", "domain": "mesh"},
	"descriptors": [
		{"name": "front", "mode": "global", "entries": [{"key": "generic_key", "source": "generic_key", "value": "front"}]},
		{"name": "per_user", "mode": "global", "entries": [{"key": "user", "source": "header", "header": "x-user"}],
		 "overrides": [{"match": {"user": "canary"}, "shadow": true}]}]}`

func TestWasmGlobalSharedLimitAcrossWorkers(t *testing.T) {
	svc := &standIn{t: t, limits: map[string]uint32{"front": 3}, counts: map[string]uint32{}}
	h := globalHarness(t, wasmGlobalConfig, svc.handle)
	var got []int
	for i := range 5 {
		rep := doGlobal(t, h, i%2)
		got = append(got, rep.Status)
		require.Len(t, rep.GRPCCalls, 1, "one call per request")
		c := rep.GRPCCalls[0].Request
		assert.Equal(t, rlsCluster, c.Cluster)
		assert.Empty(t, c.Authority, "none configured: Envoy's default, the cluster name")
		assert.Equal(t, "envoy.service.ratelimit.v3.RateLimitService", c.Service)
		assert.Equal(t, "ShouldRateLimit", c.Method)
		assert.Equal(t, 20*time.Millisecond, c.Timeout)
		if i == 2 {
			assert.Equal(t, "3", rep.Client.Header("x-ratelimit-limit"))
			assert.Equal(t, "0", rep.Client.Header("x-ratelimit-remaining"))
			assert.Equal(t, "43", rep.Client.Header("x-ratelimit-reset"))
		}
		if i == 3 {
			assert.Nil(t, rep.Upstream, "a denied request never reaches the upstream")
			assert.Equal(t, "3", rep.Client.Header("x-ratelimit-limit"))
			assert.Equal(t, "0", rep.Client.Header("x-ratelimit-remaining"))
			assert.Equal(t, "43", rep.Client.Header("retry-after"), "duration_until_reset 42.5s, rounded up")
			assert.Equal(t, "too many requests: quota front exhausted\n", string(rep.Client.Body))
		}
	}
	assert.Equal(t, []int{200, 200, 200, 429, 429}, got, "one limit for both workers")
	assert.Equal(t, int64(3), metric(t, h, globalRequestsMetric("front", "allowed")))
	assert.Equal(t, int64(2), metric(t, h, globalRequestsMetric("front", "denied")))
	assert.Equal(t, int64(3), metric(t, h, callsMetric("ok")))
	assert.Equal(t, int64(2), metric(t, h, callsMetric("over_limit")))
	for _, r := range svc.reqs {
		assert.Equal(t, "mesh", r.GetDomain())
		assert.Equal(t, uint32(1), r.GetHitsAddend())
	}
}

func TestWasmGlobalShadowDescriptor(t *testing.T) {
	svc := &standIn{t: t, limits: map[string]uint32{"canary": 1, "alice": 1}, counts: map[string]uint32{}}
	h := globalHarness(t, wasmGlobalConfig, svc.handle)
	for range 3 {
		assert.Equal(t, 200, doGlobal(t, h, 0, [2]string{"x-user", "canary"}).Status)
	}
	assert.Equal(t, int64(2), metric(t, h, globalRequestsMetric("per_user", "shadow_denied")))
	assert.Equal(t, 200, doGlobal(t, h, 1, [2]string{"x-user", "alice"}).Status)
	assert.Equal(t, 429, doGlobal(t, h, 1, [2]string{"x-user", "alice"}).Status, "not shadow for alice")
	require.Len(t, svc.reqs, 5)
	assert.Len(t, svc.reqs[0].GetDescriptors(), 2, "front and per_user in one request")
}

func TestWasmGlobalFailurePolicy(t *testing.T) {
	generic := `"descriptors": [{"name": "d", "mode": "global", "entries": [{"key": "generic_key", "source": "generic_key", "value": "x"}]}]`
	never := func(*host.GRPCCallRequest) harness.GRPCCallAnswer { return harness.GRPCCallAnswer{} }
	fail := func(*host.GRPCCallRequest) harness.GRPCCallAnswer {
		return harness.GRPCCallAnswer{Fail: true, Delay: time.Millisecond}
	}
	for name, tc := range map[string]struct {
		service string
		calls   harness.GRPCCallHandler
		status  int
		reason  string
		waited  time.Duration
	}{
		"timeout, fail open":       {`"timeout": "30ms"`, never, 200, reasonTimeout, 30 * time.Millisecond},
		"timeout, deny":            {`"failure_mode_deny": true`, never, 500, reasonTimeout, 20 * time.Millisecond},
		"unavailable, fail open":   {`"timeout": "1s"`, fail, 200, reasonUnavailable, time.Millisecond},
		"unavailable, deny as 503": {`"failure_mode_deny": true, "status_on_error": 503`, fail, 503, reasonUnavailable, time.Millisecond},
		"unknown cluster":          {``, harness.GRPCByCluster(nil), 200, reasonCallFailed, 0},
	} {
		t.Run(name, func(t *testing.T) {
			svc := `"cluster": "rls", "domain": "d"`
			if tc.service != "" {
				svc += ", " + tc.service
			}
			h := globalHarness(t, `{"rate_limit_service": {`+svc+`}, `+generic+`}`, tc.calls)
			rep := doGlobal(t, h, 0)
			assert.Equal(t, tc.status, rep.Status)
			if tc.status == 200 {
				assert.NotNil(t, rep.Upstream)
			}
			if tc.waited > 0 {
				ph, ok := rep.Phase(harness.PhaseRequestHeaders)
				require.True(t, ok)
				assert.Equal(t, tc.waited, ph.Waited, "the request waited for the call's end")
			}
			assert.Equal(t, int64(1), metric(t, h, taggedName("wasmesh_quota_global_errors_total", [2]string{"reason", tc.reason})))
			allowed := int64(0)
			if tc.status == 200 {
				allowed = 1
			}
			assert.Equal(t, allowed, metric(t, h, "wasmesh_quota_global_failure_mode_allowed_total"))
		})
	}
}

func TestWasmGlobalStreamEndCancelsTheCall(t *testing.T) {
	never := func(*host.GRPCCallRequest) harness.GRPCCallAnswer { return harness.GRPCCallAnswer{} }
	h := globalHarness(t, `{"rate_limit_service": {"cluster": "rls", "domain": "d", "timeout": "0s"},
		"descriptors": [{"name": "d", "mode": "global", "entries": [{"key": "generic_key", "source": "generic_key", "value": "x"}]}]}`, never)
	rep, err := h.Do(context.Background(), harness.Request{Path: "/", MaxWait: time.Second})
	require.NoError(t, err)
	assert.Equal(t, harness.PhaseRequestHeaders, rep.Stalled, "no timeout: the request waits until it is given up")
	calls := h.GRPCCalls()
	require.Len(t, calls, 1)
	assert.Equal(t, time.Duration(0), calls[0].Request.Timeout)
	assert.False(t, calls[0].Pending)
	assert.ErrorIs(t, calls[0].Err, host.ErrGRPCCallCancelled, "the filter cancelled the call when the stream ended")
	assert.Equal(t, int64(1), metric(t, h, "wasmesh_quota_global_cancelled_total"))
}

func TestWasmGlobalLocalBucketAnswersFirst(t *testing.T) {
	svc := &standIn{t: t, limits: map[string]uint32{"alice": 100}, counts: map[string]uint32{}}
	h := globalHarness(t, `{"rate_limit_service": {"cluster": "rls", "domain": "d"},
		"descriptors": [{"name": "per_user", "mode": "both", "entries": [{"key": "user", "source": "header", "header": "x-user"}],
		 "token_bucket": {"max_tokens": 2, "tokens_per_fill": 2, "fill_interval": "1m"}}]}`, svc.handle)
	var got []int
	for i := range 4 {
		got = append(got, doGlobal(t, h, i%2, [2]string{"x-user", "alice"}).Status)
	}
	assert.Equal(t, []int{200, 200, 429, 429}, got, "the local bucket, shared by both workers, holds 2")
	assert.Len(t, h.GRPCCalls(), 2, "requests the local bucket denies never reach the service")
	assert.Equal(t, int64(2), metric(t, h, requestsMetric("per_user", "denied")))
	assert.Equal(t, int64(2), metric(t, h, globalRequestsMetric("per_user", "allowed")))
}
