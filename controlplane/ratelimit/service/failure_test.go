package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const policies = `
domain: open
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

const closedDomain = `
domain: closed
failure_mode_deny: true
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

const failTimeout = 150 * time.Millisecond

// timedAsk asks and fails the test when the answer took longer than the service's timeout
// (plus scheduling slack on a shared machine).
func timedAsk(t *testing.T, c rlv3.RateLimitServiceClient, domain string, kv ...string) *rlv3.RateLimitResponse {
	t.Helper()
	start := time.Now()
	resp := ask(t, c, domain, 0, desc(kv...))
	if d := time.Since(start); d > failTimeout+350*time.Millisecond {
		t.Fatalf("%s %v: answered in %v, past the %v timeout", domain, kv, d, failTimeout)
	}
	return resp
}

// TestRedisKilledMidRun kills redis-server (SIGKILL) under load and starts it again: no call
// fails, the open domain answers OK and the closed one OVER_LIMIT (a shadow limit still OK)
// within the timeout, and counting resumes once Redis is back.
func TestRedisKilledMidRun(t *testing.T) {
	r := newRig(t, map[string]string{"open.yaml": policies, "closed.yaml": closedDomain}, Options{Timeout: failTimeout})
	c := r.client()
	for _, d := range []string{"open", "closed"} {
		if st := timedAsk(t, c, d, "user", "u1").Statuses[0]; st.Code != ok || st.LimitRemaining != 4 {
			t.Fatalf("%s before the kill: %v", d, st)
		}
	}

	// Load from other clients while Redis dies and comes back: every call gets an answer.
	ctx, stop := context.WithCancel(context.Background())
	var calls, failed atomic.Int64
	var wg sync.WaitGroup
	for _, d := range []string{"open", "closed"} {
		lc := r.client()
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := lc.ShouldRateLimit(cctx, &rlv3.RateLimitRequest{Domain: d, Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "load")}})
				cancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("%s under load: %v", d, err)
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	r.redis.Stop()

	if resp := timedAsk(t, c, "open", "user", "u1"); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
		t.Fatalf("open domain with Redis down: %v", resp)
	}
	if resp := timedAsk(t, c, "closed", "user", "u1"); resp.OverallCode != over || resp.Statuses[0].DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("closed domain with Redis down: %v", resp)
	}
	if resp := timedAsk(t, c, "closed", "shadow", "s"); resp.OverallCode != ok {
		t.Fatalf("closed domain, shadow limit, Redis down: %v", resp)
	}
	if n := testFloat(r.metrics.RedisErrors); n < 3 {
		t.Errorf("ratelimit_redis_errors_total %v, want at least 3", n)
	}
	wantAtLeast(t, r, "open", "open", 1)
	wantAtLeast(t, r, "closed", "closed", 1)

	time.Sleep(100 * time.Millisecond)
	r.redis.Restart()
	// Counting resumes: the restarted Redis is empty, so u2 starts again from its first hit.
	deadline := time.Now().Add(3 * time.Second)
	for _, d := range []string{"open", "closed"} {
		for {
			before := testFloat(r.metrics.RedisErrors)
			st := timedAsk(t, c, d, "user", "u2").Statuses[0]
			if testFloat(r.metrics.RedisErrors) == before {
				if st.Code != ok || st.LimitRemaining != 4 {
					t.Fatalf("%s after Redis came back: %v, want the first hit of a fresh window", d, st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: Redis still failing 3 s after its restart", d)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	stop()
	wg.Wait()
	if calls.Load() < 10 || failed.Load() > 0 {
		t.Fatalf("load: %d calls, %d failed", calls.Load(), failed.Load())
	}
	if got := r.redis.Do("GET", "closed_user_u2_1800000000"); got != "1" {
		t.Fatalf("closed_user_u2 counter after the restart %q, want 1", got)
	}
}

// TestRedisSlowerThanTimeout pauses every Redis client (CLIENT PAUSE): the decision does not
// wait past the timeout and the domain's policy answers.
func TestRedisSlowerThanTimeout(t *testing.T) {
	r := newRig(t, map[string]string{"open.yaml": policies, "closed.yaml": closedDomain}, Options{Timeout: failTimeout})
	c := r.client()
	timedAsk(t, c, "open", "user", "warm")
	timedAsk(t, c, "closed", "user", "warm")
	r.redis.Do("CLIENT", "PAUSE", "1500", "ALL")
	if resp := timedAsk(t, c, "open", "user", "p"); resp.OverallCode != ok {
		t.Fatalf("open domain, Redis paused: %v", resp)
	}
	if resp := timedAsk(t, c, "closed", "user", "p"); resp.OverallCode != over {
		t.Fatalf("closed domain, Redis paused: %v", resp)
	}
	wantAtLeast(t, r, "open", "open", 1)
	wantAtLeast(t, r, "closed", "closed", 1)
}

func wantAtLeast(t *testing.T, r *rig, domain, policy string, n int) {
	t.Helper()
	if got := testFloat(r.metrics.FailurePolicy.WithLabelValues(domain, policy)); got < float64(n) {
		t.Errorf("ratelimit_service_failure_policy_total{domain=%q,policy=%q} = %v, want at least %d", domain, policy, got, n)
	}
}
