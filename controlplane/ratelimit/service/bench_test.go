package service

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const benchConfig = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: tiny
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// BenchmarkDecision measures decisions through the whole service: a gRPC client on loopback,
// the service, a real redis-server (all sharing this machine's cores). Reported: decisions/s
// per core (GOMAXPROCS), p50 and p99 decision latency seen by the client, and Redis round
// trips and INCRBY commands per decision. callers is the number of concurrent callers per
// core (GOMAXPROCS): 1 shows the latency of a lightly loaded service, 8 keep the cores busy
// (throughput; latencies then include queueing behind each other).
//
//	within-limit: every decision counts in Redis (one pipeline each).
//	over-limit-cached: the key is over its limit; the local cache answers without Redis.
func BenchmarkDecision(b *testing.B) {
	for _, bc := range []struct {
		name, key string
		callers   int
	}{{"within-limit/callers=1", "user", 1}, {"within-limit/callers=8", "user", 8}, {"over-limit-cached/callers=1", "tiny", 1}, {"over-limit-cached/callers=8", "tiny", 8}} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRig(b, map[string]string{"bench.yaml": benchConfig}, Options{Timeout: time.Second, Now: time.Now})
			c := r.client()
			ask(b, c, "bench", 0, desc(bc.key, "warm"), desc(bc.key, "warm")) // dial; "tiny" goes over
			var worker atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			trips, incrs := r.store.RoundTrips(), r.redis.Calls("incrby")
			b.SetParallelism(bc.callers)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				value := "warm"
				if bc.key == "user" {
					value = "u" + strconv.FormatInt(worker.Add(1), 10)
				}
				req := &rlv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{desc(bc.key, value)}}
				var mine []time.Duration
				for pb.Next() {
					t0 := time.Now()
					if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			b.StopTimer()
			n := float64(b.N)
			slices.Sort(lat)
			b.ReportMetric(n/elapsed.Seconds()/float64(runtime.GOMAXPROCS(0)), "decisions/s/core")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(r.store.RoundTrips()-trips)/n, "redis-trips/decision")
			b.ReportMetric(float64(r.redis.Calls("incrby")-incrs)/n, "incrby/decision")
		})
	}
}
