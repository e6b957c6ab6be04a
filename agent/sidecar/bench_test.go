package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/sidecar"
)

func quiet(o *sidecar.Options) {
	o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Stderr = io.Discard
}

// BenchmarkStartToReady measures agent start (config checked, bootstrap written, proxy
// started) until the pod's /healthz/ready answers 200, beside the baseline of starting
// the proxy process alone until its admin /ready says LIVE.
func BenchmarkStartToReady(b *testing.B) {
	o, r := options(b, pod{proxyConfig: `"terminationDrainDuration":"0s"`, configured: true})
	quiet(&o)
	ip := r.ip
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	readyURL := "http://" + ip + ":15020/healthz/ready"
	until200 := func(url string) {
		for {
			if resp, err := client.Get(url); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
			}
			time.Sleep(2 * time.Millisecond) // polling interval of the measurement itself
		}
	}

	// Baseline: the proxy alone, with a bootstrap the agent wrote.
	boot, err := proxytest.Bootstrap(ip, r.discovery.Addr())()
	require.NoError(b, err)
	bootFile := filepath.Join(r.dir, "baseline.json")
	require.NoError(b, os.WriteFile(bootFile, boot, 0o644))
	var proxyAlone time.Duration
	for range 5 {
		cmd := exec.Command(proxyBinary, "-c", bootFile, "--restart-epoch", "0", "--base-id", strconv.FormatUint(proxytest.BaseID(), 10))
		start := time.Now()
		require.NoError(b, cmd.Start())
		until200("http://" + ip + ":15000/ready")
		proxyAlone += time.Since(start)
		cmd.Process.Kill()
		cmd.Wait()
	}
	proxyAlone /= 5

	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		a, err := sidecar.New(o)
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		until200(readyURL)
		total += time.Since(start)
		b.StopTimer()
		cancel()
		require.NoError(b, <-done)
		b.StartTimer()
	}
	agentMs := float64(total.Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(agentMs, "ms-agent-to-ready")
	b.ReportMetric(float64(proxyAlone.Microseconds())/1000, "ms-proxy-alone")
	b.ReportMetric(agentMs/(float64(proxyAlone.Microseconds())/1000), "ratio")
}

// BenchmarkMergedScrape fetches the agent's merged /stats/prometheus from a proxy
// exposing 10,000 series, beside the baseline of fetching the proxy's page alone.
func BenchmarkMergedScrape(b *testing.B) {
	o, r := options(b, pod{proxyConfig: `"terminationDrainDuration":"0s"`, configured: true})
	quiet(&o)
	ip := r.ip
	series := make([]string, 10000)
	for i := range series {
		series[i] = fmt.Sprintf("reporter=.=destination;.;source_workload=.=w%d;.;response_code=.=200;.;istio_requests_total %d", i, i+1)
	}
	o.ProxyEnv = append(o.ProxyEnv, proxytest.WasmCounters(b, r.dir, series))
	a, err := sidecar.New(o)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	client := &http.Client{Timeout: 10 * time.Second}
	fetch := func(url string) int {
		resp, err := client.Get(url)
		require.NoError(b, err)
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(b, 200, resp.StatusCode)
		return int(n)
	}
	ac := admin.New(ip+":15000", time.Second)
	defer ac.Close()
	require.Eventually(b, func() bool { _, live, err := ac.Ready(ctx); return err == nil && live }, 10*time.Second, 10*time.Millisecond)
	proxyURL := "http://" + ip + ":15000/stats/prometheus"
	mergedURL := "http://" + ip + ":15020/stats/prometheus"
	fetch(proxyURL)
	fetch(mergedURL)

	b.ResetTimer()
	var proxyT, mergedT time.Duration
	var bytes int
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		fetch(proxyURL)
		t1 := time.Now()
		bytes = fetch(mergedURL)
		mergedT += time.Since(t1)
		proxyT += t1.Sub(t0)
	}
	b.StopTimer()
	b.ReportMetric(float64(proxyT.Microseconds())/1000/float64(b.N), "ms-proxy-page")
	b.ReportMetric(float64(mergedT.Microseconds())/1000/float64(b.N), "ms-merged")
	b.ReportMetric(float64(mergedT)/float64(proxyT), "ratio")
	b.ReportMetric(float64(bytes), "bytes-merged")
}
