package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/bench"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// loadRun is xdsload's loop running against a real discovery serving config.
type loadRun struct {
	t     *testing.T
	d     *discovery.Discovery
	dir   string
	in    *io.PipeWriter
	lines *bufio.Scanner
	ran   chan error
	stop  func()
}

func startLoad(t *testing.T, config string, o options, tune ...func(*server.Options, *options)) *loadRun {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(config), 0o644))
	opts := discovery.Options{ConfigDir: dir, GRPCAddr: "127.0.0.1:0", Server: server.Defaults(), ShutdownGrace: time.Second}
	opts.Debounce = push.DebounceOptions{After: time.Millisecond, Max: time.Second, EnableEDS: true}
	o.timeout, o.dialers = 20*time.Second, 2
	for _, f := range tune {
		f(&opts.Server, &o)
	}
	d, err := discovery.New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	require.Eventually(t, d.Server.Ready, 10*time.Second, time.Millisecond)

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &loadRun{t: t, d: d, dir: dir, in: inW, lines: bufio.NewScanner(outR), ran: make(chan error, 1)}
	o.addr = d.GRPCAddr()
	go func() {
		r.ran <- run(ctx, o, inR, outW)
		outW.Close()
	}()
	r.stop = func() {
		inW.Close()
		require.NoError(t, <-r.ran)
		cancel()
		require.NoError(t, <-done)
	}
	return r
}

func (r *loadRun) next() string {
	require.True(r.t, r.lines.Scan(), "xdsload ended early")
	return r.lines.Text()
}

// ask sends a command and returns the answer.
func (r *loadRun) ask(command string) string {
	_, err := io.WriteString(r.in, command+"\n")
	require.NoError(r.t, err)
	return r.next()
}

// TestLoadClientsReportConvergence drives the command's loop against a real discovery:
// ready, a new service, a new endpoint; SotW and Delta, on h2grpc and on grpc-go.
func TestLoadClientsReportConvergence(t *testing.T) {
	for _, o := range []options{{delta: false}, {delta: true}, {delta: false, grpcGo: true}, {delta: true, grpcGo: true}} {
		o.proxies = 5
		r := startLoad(t, bench.ServiceEntries(3), o)
		assert.Equal(t, "ready refused=0 retries=0", readyCounts(r.next()))

		require.NoError(t, os.WriteFile(filepath.Join(r.dir, "new.yaml"), []byte(bench.ServiceEntry(7)), 0o644))
		require.NoError(t, r.d.Configs.Sync())
		assert.True(t, strings.HasPrefix(r.ask("cluster "+bench.ClusterName(7)), "done "))

		r.d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: "w", Namespace: "load", Labels: map[string]string{"app": "svc-1"}, IPs: []string{"10.99.0.1"}}}})
		line := r.ask("endpoint " + bench.ClusterName(1) + " 10.99.0.1")
		assert.True(t, strings.HasPrefix(line, "done ") && strings.HasSuffix(line, " 5"), line)

		assert.True(t, strings.HasPrefix(r.ask("bogus"), "error "))
		r.stop()
	}
}

// With proxies scoped by Sidecars, endpoint-watchers waits for, and counts, only the
// proxies whose scope holds the service.
func TestEndpointWatchersAreTheProxiesInScope(t *testing.T) {
	// 20 services in two scopes of 10; proxies 0, 2, 4 in the first, 1 and 3 in the second.
	r := startLoad(t, bench.ScopedConfig(20), options{proxies: 5, delta: true, namespaces: 2})
	assert.Equal(t, "ready refused=0 retries=0", readyCounts(r.next()))
	r.d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: "w", Namespace: "load", Labels: map[string]string{"app": "svc-12"}, IPs: []string{"10.99.0.2"}}}})
	line := r.ask("endpoint-watchers " + bench.ClusterName(12) + " 10.99.0.2")
	assert.True(t, strings.HasPrefix(line, "done ") && strings.HasSuffix(line, " 2"), line)
	r.stop()
}

// readyCounts is a ready line without its timing.
func readyCounts(line string) string {
	f := strings.Fields(line)
	if len(f) == 4 && strings.HasPrefix(f[3], "synced-ms=") {
		return strings.Join(f[:3], " ")
	}
	return line
}

// Clients refused by admission reconnect after Envoy's jittered backoff until every one
// holds its config, and the ready line counts them; without retries the first refusal is
// the run's error.
func TestRefusedClientsRetryWithBackoff(t *testing.T) {
	storm := func(retryBase time.Duration) func(*server.Options, *options) {
		return func(s *server.Options, o *options) {
			// One connection per 50 ms, none may wait: all but the first of a storm are refused.
			s.ConnectRate, s.ConnectBurst, s.ConnectWait = 20, 1, time.Millisecond
			o.dialers, o.retryBase, o.retryMax, o.timeout = 0, 20*time.Millisecond, 200*time.Millisecond, 10*time.Second
			if retryBase == 0 {
				o.retryBase = 0
			}
		}
	}
	r := startLoad(t, bench.ServiceEntries(3), options{proxies: 8}, storm(time.Millisecond))
	var refused, retries, ms int
	_, err := fmt.Sscanf(r.next(), "ready refused=%d retries=%d synced-ms=%d", &refused, &retries, &ms)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, refused, 1, "a storm against one connection per 50 ms refuses some")
	assert.LessOrEqual(t, refused, 7)
	assert.GreaterOrEqual(t, retries, refused)
	assert.Greater(t, ms, 0)
	assert.Len(t, r.d.Server.Connections(), 8, "every client connected in the end")
	r.stop()

	r = startLoad(t, bench.ServiceEntries(3), options{proxies: 8}, storm(0))
	line := r.next()
	assert.True(t, strings.HasPrefix(line, "error ") && strings.Contains(line, "ResourceExhausted"), line)
	r.in.Close()
	require.Error(t, <-r.ran)
}
