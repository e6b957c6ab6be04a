package main

import (
	"bufio"
	"context"
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
	"github.com/wasmesh/wasmesh/controlplane/server"
)

// TestLoadClientsReportConvergence drives the command's loop against a real discovery:
// ready, a new service, a new endpoint.
func TestLoadClientsReportConvergence(t *testing.T) {
	for _, delta := range []bool{false, true} {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "s.yaml"), []byte(bench.ServiceEntries(3)), 0o644))
		opts := discovery.Options{ConfigDir: dir, GRPCAddr: "127.0.0.1:0", Server: server.Defaults(), ShutdownGrace: time.Second}
		opts.Server.Debounce = push.DebounceOptions{After: time.Millisecond, Max: time.Second, EnableEDS: true}
		d, err := discovery.New(opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		require.Eventually(t, d.Server.Ready, 10*time.Second, time.Millisecond)

		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		ran := make(chan error, 1)
		go func() {
			ran <- run(ctx, options{addr: d.GRPCAddr(), proxies: 5, delta: delta, timeout: 20 * time.Second, dialers: 2}, inR, outW)
			outW.Close()
		}()
		lines := bufio.NewScanner(outR)
		next := func() string {
			require.True(t, lines.Scan(), "xdsload ended early")
			return lines.Text()
		}
		assert.Equal(t, "ready", next())

		require.NoError(t, os.WriteFile(filepath.Join(dir, "new.yaml"), []byte(bench.ServiceEntry(7)), 0o644))
		require.NoError(t, d.Configs.Sync())
		_, err = io.WriteString(inW, "cluster "+bench.ClusterName(7)+"\n")
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(next(), "done "))

		d.Entries.SetWorkload(&model.Workload{Name: "w", Namespace: "load", Labels: map[string]string{"app": "svc-1"}, IPs: []string{"10.99.0.1"}})
		_, err = io.WriteString(inW, "endpoint "+bench.ClusterName(1)+" 10.99.0.1\n")
		require.NoError(t, err)
		line := next()
		assert.True(t, strings.HasPrefix(line, "done ") && strings.HasSuffix(line, " 5"), line)

		_, err = io.WriteString(inW, "bogus\n")
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(next(), "error "))

		inW.Close()
		require.NoError(t, <-ran)
		cancel()
		require.NoError(t, <-done)
	}
}
