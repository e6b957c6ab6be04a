//go:build !wasip1

package main

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/wasmesh/wasmesh/filters/internal/wasmtest"
	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/host"
)

// The same descriptor decided locally, and by the service (answering at once, OK): the
// difference is the global mode's cost in the filter and the host (encode, call, pause,
// callback, decode, resume), without any network.
const benchGlobalConfig = `{"rate_limit_service": {"cluster": "rls", "domain": "mesh"},
	"descriptors": [{"name": "per_user", "mode": "global", "entries": [{"key": "user", "source": "header", "header": "x-user"}]}]}`

// BenchmarkHarnessLocalVsGlobal runs whole requests through the harness (its recording
// included, the same in both), one allowed decision each.
func BenchmarkHarnessLocalVsGlobal(b *testing.B) {
	ok, err := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1 << 30}, LimitRemaining: 1 << 29}}})
	if err != nil {
		b.Fatal(err)
	}
	service := harness.GRPCByCluster(map[string]harness.GRPCCallAnswer{"rls": harness.GRPCRespond(ok)})
	for _, tc := range []struct{ name, cfg string }{{"local", benchConfig}, {"global", benchGlobalConfig}} {
		b.Run(tc.name, func(b *testing.B) {
			h := wasmtest.Harness(b, ".", harness.Options{GRPCCalls: service,
				Plugin: host.PluginConfig{Name: "quota", Configuration: []byte(tc.cfg)}})
			req := harness.Request{Path: "/api", Headers: [][2]string{{"x-user", "alice"}}}
			for b.Loop() {
				rep, err := h.Do(context.Background(), req)
				if err != nil || rep.Status != 200 || len(rep.Failures) > 0 {
					b.Fatalf("status %d, %v, %v", rep.Status, err, rep.Failures)
				}
			}
			if tc.name == "global" && len(h.GRPCCalls()) == 0 {
				b.Fatal("the service was never asked")
			}
		})
	}
}
