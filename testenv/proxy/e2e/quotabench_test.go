package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redistest"
	"github.com/wasmesh/wasmesh/testenv/proxy/proxytest"
)

// startRateLimitService runs bin/ratelimit (built by `make build`) with config as its one
// config file, counting in the Redis at redisAddr, and returns its gRPC address and its
// metrics URL; it is stopped at cleanup. Without the binary the benchmark is skipped
// (failed under WASMESH_REQUIRE_FIXTURES=1).
func startRateLimitService(b *testing.B, redisAddr, config string) (grpcAddr, metricsURL string) {
	b.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(filepath.Dir(file), "..", "..", "..", "bin", "ratelimit")
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		bin = filepath.Join(dir, "ratelimit")
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("%s not found (%v): run `make build`", bin, err)
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") == "1" {
			b.Fatal(msg)
		}
		b.Skip(msg)
	}
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(config), 0o644); err != nil {
		b.Fatal(err)
	}
	grpcAddr, metricsAddr := freeLoopbackAddr(b), freeLoopbackAddr(b)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-grpc-addr", grpcAddr, "-metrics-addr", metricsAddr,
		"-config-dir", dir, "-redis-addr", redisAddr)
	log, err := os.Create(filepath.Join(dir, "ratelimit.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); _ = cmd.Wait(); log.Close() })
	metricsURL = "http://" + metricsAddr + "/metrics"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + metricsAddr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return grpcAddr, metricsURL
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("the rate-limit service did not get ready in 10s; its log is %s", log.Name())
		}
	}
}

func freeLoopbackAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metricValue sums the samples of a counter on a Prometheus text page.
func metricValue(b *testing.B, url, name string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(page, -1) {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		sum += v
	}
	return sum
}

// BenchmarkQuotaGlobalVsLocal compares, in one run, requests at a fixed 1,000 per second
// through meshproxy alone, through meshproxy with the quota filter in local mode (a token
// bucket in the proxy) and in global mode (every request asks a real bin/ratelimit, which
// counts in a real redis-server, by proxy_grpc_call over the service's HTTP/2 cluster),
// in interleaved rounds: the P50/P99 each filter mode adds over the proxy alone. The limits
// are far above the rate, so every request is allowed and every global decision is the
// service's (checked: one decision per request, no call failed open).
func BenchmarkQuotaGlobalVsLocal(b *testing.B) {
	quota := wasmFixture(b, "quota.wasm")
	redis := redistest.Start(b)
	rlAddr, rlMetrics := startRateLimitService(b, redis.Addr, `domain: bench
descriptors:
- key: generic_key
  value: front
  rate_limit: {unit: second, requests_per_unit: 1000000000}
`)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	upAddr := up.Listener.Addr().String()
	localCfg := `{"descriptors":[{"name":"front","entries":[{"key":"generic_key","source":"generic_key","value":"front"}],"token_bucket":{"max_tokens":1000000000,"tokens_per_fill":1000000000,"fill_interval":"1s"}}]}`
	globalCfg := `{"rate_limit_service":{"cluster":"ratelimit","domain":"bench","timeout":"1s"},"descriptors":[{"name":"front","mode":"global","entries":[{"key":"generic_key","source":"generic_key","value":"front"}]}]}`
	// The global proxy has the service's cluster too, HTTP/2 as Istio makes a GRPC port's.
	withRateLimitCluster := func(bootstrap string) string {
		return strings.Replace(bootstrap, "  clusters:", "  clusters:"+staticCluster("ratelimit", h2ProtocolOptions, rlAddr), 1)
	}
	plain := proxytest.Start(b, proxytest.Options{Bootstrap: benchBootstrap(upAddr, "")})
	local := proxytest.Start(b, proxytest.Options{Bootstrap: benchBootstrap(upAddr, wasmFilterYAML("quota", quota, localCfg))})
	global := proxytest.Start(b, proxytest.Options{Bootstrap: withRateLimitCluster(benchBootstrap(upAddr, wasmFilterYAML("quota", quota, globalCfg)))})
	targets := []struct {
		name string
		p    *proxytest.Proxy
	}{{"proxy", plain}, {"local", local}, {"global", global}}
	tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 1024}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for _, t := range targets { // warm up pools, VMs and the service's connection
		throughput(b, c, "http://"+t.p.ListenerAddr("in")+"/", 200)
	}
	hitsBefore := metricValue(b, rlMetrics, "ratelimit_service_rate_limit_total_hits")
	const okCalls = "wasmcustom.decision=.=ok;.;wasmesh_quota_global_calls_total"
	okBefore := global.Stat(okCalls)
	b.ResetTimer()
	const rounds = 5
	lat := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, t := range targets {
			lat[t.name] = append(lat[t.name], fixedRate(b, c, "http://"+t.p.ListenerAddr("in")+"/", 1000, time.Second)...)
		}
	}
	b.StopTimer()
	hits := metricValue(b, rlMetrics, "ratelimit_service_rate_limit_total_hits") - hitsBefore
	svcP50, svcP99 := serviceCallLatency(b, rlAddr, 500) // after counting the proxy's decisions
	p50, p99 := map[string]time.Duration{}, map[string]time.Duration{}
	for _, t := range targets {
		p50[t.name], p99[t.name] = percentile(lat[t.name], 0.50), percentile(lat[t.name], 0.99)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(p50["proxy"]), "proxy_p50_ms")
	b.ReportMetric(ms(p99["proxy"]), "proxy_p99_ms")
	for _, mode := range []string{"local", "global"} {
		b.ReportMetric(ms(p50[mode]-p50["proxy"]), mode+"_added_p50_ms")
		b.ReportMetric(ms(p99[mode]-p99["proxy"]), mode+"_added_p99_ms")
	}
	n := float64(len(lat["global"]))
	okCallsPerReq := float64(global.Stat(okCalls)-okBefore) / n
	failedOpen := global.Stat("wasmcustom.wasmesh_quota_global_failure_mode_allowed_total")
	b.ReportMetric(n/rounds, "achieved_rps")
	b.ReportMetric(ms(svcP50), "service_call_p50_ms")
	b.ReportMetric(ms(svcP99), "service_call_p99_ms")
	b.ReportMetric(hits/n, "service_decisions/req")
	b.ReportMetric(okCallsPerReq, "global_ok_calls/req")
	b.ReportMetric(float64(failedOpen), "global_failed_open")
	if hits < n || okCallsPerReq != 1 || failedOpen != 0 {
		b.Errorf("%v decisions by the service and %v OK calls per request for %v requests, %d failed open: the global mode did not ask the service for every request",
			hits, okCallsPerReq, n, failedOpen)
	}
}

// serviceCallLatency calls ShouldRateLimit n times in a row from grpc-go, the same
// request the filter sends, and returns the P50 and P99: the part of the global mode's
// added latency that is the service's (and Redis's) own.
func serviceCallLatency(b *testing.B, addr string, n int) (p50, p99 time.Duration) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := rlv3.NewRateLimitServiceClient(conn)
	req := &rlv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "front"}}}}}
	lat := make([]time.Duration, 0, n)
	for i := 0; i < n+50; i++ { // 50 to warm up the connection
		start := time.Now()
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil || resp.OverallCode != rlv3.RateLimitResponse_OK {
			b.Fatalf("ShouldRateLimit: %v %v", resp, err)
		}
		if i >= 50 {
			lat = append(lat, time.Since(start))
		}
	}
	return percentile(lat, 0.50), percentile(lat, 0.99)
}
