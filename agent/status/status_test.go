package status_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/probe"
	"github.com/wasmesh/wasmesh/agent/status"
)

// nonLoopbackIP is an address of this machine that is not loopback: a request to it
// comes from it, so the server sees a peer that is not localhost.
func nonLoopbackIP(t *testing.T) string {
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address to send a request from another host's address")
	return ""
}

// serve runs the status server on ip until the test ends; quits counts /quitquitquit.
func serve(t *testing.T, ip string, level *slog.LevelVar, quits *atomic.Int32) string {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	// The proxy's admin is not running: pages that ask it answer 503, which shows the
	// request reached the page.
	srv := status.New(status.Config{
		Admin: admin.New("127.0.0.1:1", time.Second), Probes: probe.NewHandler(nil, "127.0.0.1"),
		Gatherer: prometheus.NewRegistry(), LogLevel: level, Quit: func() { quits.Add(1) },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return "http://" + l.Addr().String()
}

// The status port as pilot-agent locks it down: read-only pages answer GET only, to
// anyone; state changes and the agent's internals answer requests from localhost only.
func TestStatusPortLockdown(t *testing.T) {
	var level slog.LevelVar
	var quits atomic.Int32
	local := serve(t, "127.0.0.1", &level, &quits)
	remote := serve(t, nonLoopbackIP(t), &level, &quits)
	client := &http.Client{Timeout: 5 * time.Second}
	do := func(method, url string) int {
		req, err := http.NewRequest(method, url, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		method, path string
		fromRemote   bool
		want         int
	}{
		{"GET", "/healthz/ready", true, 503},
		{"HEAD", "/healthz/ready", true, 503},
		{"POST", "/healthz/ready", true, 405},
		{"GET", "/stats/prometheus", true, 200},
		{"DELETE", "/stats/prometheus", false, 405},
		{"POST", "/app-health/app/readyz", true, 405},
		{"POST", "/quitquitquit", true, 403},
		{"GET", "/quitquitquit", false, 405},
		{"GET", "/debug/pprof/", true, 403},
		{"GET", "/debug/pprof/", false, 200},
		{"POST", "/debug/pprof/symbol", false, 405},
		{"GET", "/debug/config_dump", true, 403},
		{"GET", "/debug/config_dump", false, 503},
		{"POST", "/debug/config_dump", false, 405},
		{"GET", "/debug/logging", true, 200},
		{"PUT", "/debug/logging?level=debug", true, 403},
		{"POST", "/debug/logging?level=debug", true, 403},
		{"DELETE", "/debug/logging", false, 405},
	} {
		base := local
		if c.fromRemote {
			base = remote
		}
		assert.Equal(t, c.want, do(c.method, base+c.path), "%s %s from %s", c.method, c.path, base)
	}
	assert.Equal(t, slog.LevelInfo, level.Level(), "no request from another host changed the log level")
	assert.Zero(t, quits.Load(), "no request from another host, and no GET, quit the agent")

	assert.Equal(t, 200, do("PUT", local+"/debug/logging?level=debug"))
	assert.Equal(t, slog.LevelDebug, level.Level())
	assert.Equal(t, 200, do("POST", local+"/quitquitquit"))
	assert.Equal(t, int32(1), quits.Load())
}
