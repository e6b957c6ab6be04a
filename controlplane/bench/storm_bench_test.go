package bench

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/discovery/discoverytest"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/server"
)

// stormModes are the admission settings a storm is measured under, in this order in one
// run: none, the fixed rate discovery had by default before (100 connections/s, burst 200,
// at most 10 s of waiting, as PILOT_MAX_REQUESTS_PER_SECOND), and today's defaults
// (capacity: initial configs in flight bounded by the push throttle, the rest queued).
var stormModes = []struct {
	name string
	set  func(*server.Options)
}{
	{"admission=off", func(o *server.Options) { o.ConnectInFlight, o.ConnectRate = -1, 0 }},
	{"admission=fixed-rate", func(o *server.Options) {
		o.ConnectInFlight, o.ConnectRate, o.ConnectBurst, o.ConnectWait = -1, 100, 200, 10*time.Second
	}},
	{"admission=capacity", func(*server.Options) {}},
}

// stormSelected is the modes named in WASMESH_BENCH_STORM_MODES (e.g. "off,capacity"; all
// when unset).
func stormSelected() []string {
	return strings.Split(os.Getenv("WASMESH_BENCH_STORM_MODES"), ",")
}

// BenchmarkStorm: every proxy connects at once (a restart of discovery, or a rollout of
// the whole mesh) to discovery serving the scale's services, each client reconnecting
// after Envoy's jittered backoff (0.5 s base, 5 s max: the agent's bootstrap) while it is
// refused; reported: clients refused at least once, reconnections, and the seconds from
// the first dial until the last client holds its config, per admission mode. Scales from
// WASMESH_BENCH_STORM (default 1000x2000), protocols from WASMESH_BENCH_XDS (default
// delta); WASMESH_BENCH_STORM_ROUNDS repeats the modes, interleaved (default 1).
func BenchmarkStorm(b *testing.B) {
	spec := os.Getenv("WASMESH_BENCH_STORM")
	if spec == "" {
		spec = "1000x2000"
	}
	scales, err := ParseScales(spec)
	require.NoError(b, err)
	protocols, err := ParseProtocols(os.Getenv("WASMESH_BENCH_XDS"))
	require.NoError(b, err)
	rounds := 1
	if v := os.Getenv("WASMESH_BENCH_STORM_ROUNDS"); v != "" {
		_, err := fmt.Sscan(v, &rounds)
		require.NoError(b, err, "WASMESH_BENCH_STORM_ROUNDS=%q: want a number", v)
	}
	bin, err := LoaderBinary(b.TempDir())
	require.NoError(b, err)
	for _, delta := range protocols {
		for _, sc := range scales {
			for round := range rounds {
				for _, m := range stormModes {
					if sel := stormSelected(); sel[0] != "" && !slices.Contains(sel, strings.TrimPrefix(m.name, "admission=")) {
						continue
					}
					name := fmt.Sprintf("xds=%s/services=%d/proxies=%d/%s/round=%d", map[bool]string{true: "delta", false: "sotw"}[delta], sc.Services, sc.Proxies, m.name, round)
					b.Run(name, func(b *testing.B) { benchStorm(b, bin, sc, delta, m.set) })
				}
			}
		}
	}
}

func benchStorm(b *testing.B, bin string, sc Scale, delta bool, set func(*server.Options)) {
	dir := b.TempDir()
	require.NoError(b, os.WriteFile(filepath.Join(dir, "services.yaml"), []byte(ServiceEntries(sc.Services)), 0o644))
	opts := discovery.Options{ConfigDir: dir, GRPCAddr: "127.0.0.1:0", Debounce: push.DefaultDebounce(), Server: server.Defaults(),
		WorkloadGracePeriod: time.Minute, ShutdownGrace: time.Second}
	set(&opts.Server)
	if v := os.Getenv("WASMESH_BENCH_STORM_INFLIGHT"); v != "" && opts.Server.ConnectInFlight == 0 {
		_, err := fmt.Sscan(v, &opts.Server.ConnectInFlight)
		require.NoError(b, err)
	}
	d := runDiscovery(b, opts)
	for i := 0; i < b.N; i++ {
		loader, err := StartStorm(b.Context(), bin, d.GRPCAddr(), sc.Proxies, delta)
		require.NoError(b, err)
		s := loader.Synced
		loader.Stop()
		b.ReportMetric(float64(s.Refused), "refused")
		b.ReportMetric(float64(s.Retries), "retries")
		b.ReportMetric(s.After.Seconds(), "synced-s")
		require.Eventually(b, func() bool { return len(d.Server.Connections()) == 0 }, time.Minute, 10*time.Millisecond,
			"the clients' connections closed before the next storm")
	}
}

// runDiscovery runs discovery with opts until the benchmark ends and waits until it is
// ready. Warnings show (a send timeout, a NACK): a run that cut proxies measured something
// else.
func runDiscovery(b *testing.B, opts discovery.Options) *discoverytest.Server {
	return discoverytest.Run(b, opts, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}
