package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redistest"
)

func TestFlagErrors(t *testing.T) {
	for args, want := range map[string]string{
		"":                                  "-config-dir is required",
		"-config-dir d -timeout 0s":         "-timeout 0s: want a positive duration",
		"-config-dir d -near-limit-ratio 2": "-near-limit-ratio 2: want a number in (0, 1]",
		"-config-dir d extra":               `unexpected arguments ["extra"]`,
		"-config-dir d -redis-addr @h:1":    "empty Sentinel master name",
		"-config-dir d -redis-addr nohost":  `redis address "nohost": want host:port`,
		"-config-dir d -redis-addr m@h:1 -redis-cluster": "a Sentinel master and Cluster mode exclude each other",
	} {
		err := run(context.Background(), strings.Fields(args), io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ratelimit %s: got %v, want %q", args, err, want)
		}
	}
}

func TestBadConfigAtStartRefusesToServe(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "x.yaml"), []byte("domain: x\ndescriptors: 3\n"), 0o644)
	err := run(context.Background(), []string{"-config-dir", dir, "-grpc-addr", "127.0.0.1:0", "-metrics-addr", ""}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "x.yaml: descriptors: want a list of descriptors") {
		t.Fatalf("got %v", err)
	}
}

// TestServes runs the command against a real Redis: a decision over gRPC, then /healthz and
// the decision's metrics on /metrics.
func TestServes(t *testing.T) {
	redis := redistest.Start(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-config-dir", dir, "-grpc-addr", "127.0.0.1:0", "-metrics-addr", "127.0.0.1:0",
			"-redis-addr", redis.Addr}, &logs, func(g, m string) { addrs <- [2]string{g, m} })
	}()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	cc, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := rlv3.NewRateLimitServiceClient(cc)
	req := &rlv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for i, want := range []rlv3.RateLimitResponse_Code{rlv3.RateLimitResponse_OK, rlv3.RateLimitResponse_OVER_LIMIT} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.ShouldRateLimit(rctx, req)
		rcancel()
		if err != nil || resp.OverallCode != want {
			t.Fatalf("request %d: %v %v, want %v", i+1, resp, err, want)
		}
	}
	get := func(path string) string {
		resp, err := http.Get("http://" + a[1] + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s %s", path, resp.Status, b)
		}
		return string(b)
	}
	if h := get("/healthz"); h != "ok\n" {
		t.Fatalf("/healthz: %q", h)
	}
	metrics := get("/metrics")
	for _, want := range []string{
		`ratelimit_service_rate_limit_total_hits{key="d.k"} 2`,
		`ratelimit_service_rate_limit_over_limit{key="d.k"} 1`,
		`ratelimit_redis_latency_seconds_count 2`,
		`ratelimit_service_config_load_total{result="success"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v\n%s", err, logs.String())
	}
}
