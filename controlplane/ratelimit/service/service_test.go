package service

import (
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const frontend = `
domain: frontend
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /heavy
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: /shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 2}
`

const (
	ok   = rlv3.RateLimitResponse_OK
	over = rlv3.RateLimitResponse_OVER_LIMIT
)

// TestTwoClientsShareOneLimit: two gRPC clients (two proxies) hammer one descriptor at once;
// across both exactly the limit is allowed in the window.
func TestTwoClientsShareOneLimit(t *testing.T) {
	r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{})
	clients := []rlv3.RateLimitServiceClient{r.client(), r.client()}
	var mu sync.Mutex
	allowed, denied := 0, 0
	var wg sync.WaitGroup
	for _, c := range clients {
		for range 3 {
			wg.Go(func() {
				for range 10 {
					resp := ask(t, c, "frontend", 0, desc("remote_address", "10.1.2.3"))
					mu.Lock()
					if resp.OverallCode == ok {
						allowed++
					} else {
						denied++
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if allowed != 20 || denied != 40 {
		t.Fatalf("allowed %d, denied %d across both clients; want 20 and 40", allowed, denied)
	}
	// Another caller has its own counter.
	resp := ask(t, clients[1], "frontend", 0, desc("remote_address", "10.9.9.9"))
	st := resp.Statuses[0]
	if resp.OverallCode != ok || st.LimitRemaining != 19 || st.CurrentLimit.GetRequestsPerUnit() != 20 ||
		st.CurrentLimit.GetUnit() != rlv3.RateLimitResponse_RateLimit_MINUTE || st.DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("a fresh caller's status: %v", resp)
	}
	key := "frontend.remote_address"
	wantCount(t, r.metrics.TotalHits, "TotalHits", key, 61)
	wantCount(t, r.metrics.OverLimit, "OverLimit", key, 40)
	// near limit at 0.8: hits 17..20 of the first caller, 4 of them.
	wantCount(t, r.metrics.NearLimit, "NearLimit", key, 4)
}

func TestHitsAddend(t *testing.T) {
	r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{})
	c := r.client()
	if st := ask(t, c, "frontend", 4, desc("path", "/heavy")).Statuses[0]; st.Code != ok || st.LimitRemaining != 6 {
		t.Fatalf("after 4 of 10: %v", st)
	}
	// A descriptor's own hits_addend wins over the request's.
	d := desc("path", "/heavy")
	d.HitsAddend = wrapperspb.UInt64(6)
	if st := ask(t, c, "frontend", 4, d).Statuses[0]; st.Code != ok || st.LimitRemaining != 0 {
		t.Fatalf("after 10 of 10: %v", st)
	}
	// hits_addend 0 counts one.
	if resp := ask(t, c, "frontend", 0, desc("path", "/heavy")); resp.OverallCode != over || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("the 11th hit: %v", resp)
	}
	if got := r.redis.Do("GET", "frontend_path_/heavy_1800000000"); got != "11" {
		t.Fatalf("redis counter %q, want 11", got)
	}
	ttl := r.redis.Do("TTL", "frontend_path_/heavy_1800000000")
	if ttl != "60" && ttl != "59" {
		t.Fatalf("counter TTL %s, want the window (60 s)", ttl)
	}
}

// TestOneRoundTripPerRequest: all of a request's descriptors go to Redis in one pipeline;
// the overall code is OVER_LIMIT when any is over; unlimited and unknown descriptors cost
// nothing.
func TestOneRoundTripPerRequest(t *testing.T) {
	r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{})
	c := r.client()
	before := r.store.RoundTrips()
	resp := ask(t, c, "frontend", 0, desc("remote_address", "a"), desc("path", "/x"), desc("path", "/free"), desc("nothing", "here"))
	if resp.OverallCode != ok || r.store.RoundTrips()-before != 1 || r.redis.Calls("incrby") != 2 || r.redis.Calls("expire") != 2 {
		t.Fatalf("want one round trip with 2 INCRBY and 2 EXPIRE: %d trips, %d incrby, %d expire; %v",
			r.store.RoundTrips()-before, r.redis.Calls("incrby"), r.redis.Calls("expire"), resp)
	}
	if st := resp.Statuses[2]; st.CurrentLimit != nil || st.LimitRemaining != 1<<32-1 {
		t.Fatalf("unlimited status: %v", st)
	}
	if st := resp.Statuses[3]; st.CurrentLimit != nil || st.Code != ok {
		t.Fatalf("unmatched status: %v", st)
	}
	ask(t, c, "frontend", 0, desc("path", "/x"))
	resp = ask(t, c, "frontend", 0, desc("remote_address", "a"), desc("path", "/x"))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
		t.Fatalf("one descriptor over: %v", resp)
	}
}

func TestShadowModeCountsWithoutRejecting(t *testing.T) {
	r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{})
	c := r.client()
	for i := range 10 {
		resp := ask(t, c, "frontend", 0, desc("path", "/shadow"))
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok {
			t.Fatalf("request %d: shadow mode rejected: %v", i+1, resp)
		}
	}
	key := "frontend.path_/shadow"
	wantCount(t, r.metrics.ShadowMode, "ShadowMode", key, 7)
	wantCount(t, r.metrics.OverLimit, "OverLimit", key, 7)
	wantCount(t, r.metrics.TotalHits, "TotalHits", key, 10)
}

// TestOverLimitLocalCache: once a key is over its limit, its further hits in the window are
// answered without Redis (INCRBY calls counted by Redis itself).
func TestOverLimitLocalCache(t *testing.T) {
	for _, noCache := range []bool{false, true} {
		r := newRig(t, map[string]string{"frontend.yaml": frontend}, Options{NoLocalCache: noCache})
		c := r.client()
		for i := range 13 {
			resp := ask(t, c, "frontend", 0, desc("path", "/y"))
			if want := i < 2; (resp.OverallCode == ok) != want {
				t.Fatalf("no cache %v: request %d: %v", noCache, i+1, resp.OverallCode)
			}
			if i >= 2 && resp.Statuses[0].DurationUntilReset.AsDuration() != 30*time.Second {
				t.Fatalf("over-limit status: %v", resp.Statuses[0])
			}
		}
		want := 3 // two within the limit, the one that found it over; then the cache answers
		if noCache {
			want = 13
		}
		if got := r.redis.Calls("incrby"); got != want {
			t.Errorf("no cache %v: %d INCRBY in Redis, want %d", noCache, got, want)
		}
		if !noCache {
			wantCount(t, r.metrics.OverLimitWithLocalCache, "over_limit_with_local_cache", "frontend.path", 10)
		}
	}
}
