package supervisor_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/envoyproc"
	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/supervisor"
)

var proxyBinary string

func TestMain(m *testing.M) { os.Exit(proxytest.Main(m, &proxyBinary)) }

type rig struct {
	sup       *supervisor.Supervisor
	admin     *admin.Client
	reg       *prometheus.Registry
	proxy     *recorder
	dir       string
	discovery *proxytest.Discovery
	stderr    *proxytest.Output // the proxies' logs
	log       *proxytest.Output // the supervisor's
	done      chan error
	cancel    context.CancelFunc
}

// setup is how a rig's proxy starts.
type setup struct {
	retry supervisor.Retry
	// badBootstraps is how many epochs, from the first, get a bootstrap meshproxy rejects
	// (they exit with an error at once).
	badBootstraps int
	// badStart, when set, is the one start (1 for the first) whose bootstrap is rejected.
	badStart int
}

// start runs a supervisor over meshproxy, configured by a discovery of the test's own.
func start(t *testing.T, s setup) *rig {
	t.Helper()
	ip := proxytest.Loopback(t, 15000, 15020, 15021, 15090)
	dir := t.TempDir()
	disc := proxytest.StartDiscovery(t)
	disc.Configure(proxytest.Config{})
	render, rendered := proxytest.Bootstrap(ip, disc.Addr()), 0
	var renderMu sync.Mutex
	stderr := &proxytest.Output{}
	ac := admin.New(ip+":15000", time.Second)
	t.Cleanup(ac.Close)
	baseID := proxytest.BaseID()
	p, err := envoyproc.New(envoyproc.Config{
		BinaryPath: proxyBinary, ConfigPath: dir,
		DrainDuration: time.Second, ParentShutdownDuration: time.Second,
		ServiceCluster: "test.test", ServiceNode: "sidecar~" + ip + "~test.test~test.svc.cluster.local",
		LogLevel: "warning", BaseID: &baseID, Admin: ac, ReadyPoll: 20 * time.Millisecond,
		Bootstrap: func() ([]byte, error) {
			renderMu.Lock()
			defer renderMu.Unlock()
			if rendered++; rendered <= s.badBootstraps || rendered == s.badStart {
				return []byte("{not a bootstrap"), nil
			}
			return render()
		},
		Stdout: io.Discard, Stderr: stderr,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	rec := &recorder{Proxy: p}
	reg := prometheus.NewRegistry()
	log := &proxytest.Output{}
	sup := supervisor.New(rec, s.retry, slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, log), nil)), reg)
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{sup: sup, admin: ac, reg: reg, proxy: rec, dir: dir, discovery: disc, stderr: stderr, log: log,
		done: make(chan error, 1), cancel: cancel}
	go func() { r.done <- sup.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("supervisor did not stop")
		}
	})
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// recorder is the supervisor's proxy: envoyproc's, noting when each epoch started,
// whether it was reported live to the supervisor, and whether its process ended.
type recorder struct {
	*envoyproc.Proxy
	mu   sync.Mutex
	runs []run
}

type run struct {
	epoch        int
	at, exitedAt time.Time
	live, exited bool
}

func (r *recorder) Run(abort context.Context, config string, epoch int, ready func()) error {
	r.mu.Lock()
	i := len(r.runs)
	r.runs = append(r.runs, run{epoch: epoch, at: time.Now()})
	r.mu.Unlock()
	err := r.Proxy.Run(abort, config, epoch, func() {
		ready()
		r.mu.Lock()
		r.runs[i].live = true
		r.mu.Unlock()
	})
	r.mu.Lock()
	r.runs[i].exited, r.runs[i].exitedAt = true, time.Now()
	r.mu.Unlock()
	return err
}

// starts returns the epochs started so far, in order.
func (r *recorder) starts() []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]run(nil), r.runs...)
}

func (r *rig) gauge(t *testing.T, name string) float64 {
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// live reports whether the newest start is epoch, the supervisor was told it is live,
// and its admin says so.
func (r *rig) live(epoch int) func() bool {
	return func() bool {
		s := r.proxy.starts()
		if len(s) == 0 || s[len(s)-1].epoch != epoch || !s[len(s)-1].live {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		si, err := r.admin.ServerInfo(ctx)
		return err == nil && si.State == "LIVE" && si.CommandLineOptions.RestartEpoch == epoch
	}
}

func TestRestartWithBackoffRestoresBudget(t *testing.T) {
	retry := supervisor.Retry{MaxRetries: 5, InitialInterval: 30 * time.Millisecond}
	// The first three starts get a bootstrap the proxy rejects: it exits with an error.
	r := start(t, setup{retry: retry, badBootstraps: 3})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))

	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond, "the fourth start comes up")
	starts := r.proxy.starts()
	require.Len(t, starts, 4, "three failed starts and one good one")
	assert.Equal(t, 3, strings.Count(r.stderr.String(), "meshproxy: bootstrap "), "each failed on its bootstrap:\n%s", r.stderr)
	for i := 1; i < len(starts); i++ {
		assert.Equal(t, 0, starts[i].epoch, "after an error every epoch is aborted and the chain restarts at 0")
		gap := starts[i].at.Sub(starts[i-1].at)
		min := retry.InitialInterval << (i - 1)
		assert.GreaterOrEqual(t, gap, min, "retry %d waits at least %v (exponential backoff)", i, min)
	}
	require.Eventually(t, func() bool { return r.gauge(t, "wasmesh_agent_proxy_retry_budget") == 5 },
		5*time.Second, 10*time.Millisecond, "a live epoch restores the budget")

	// A crash after that (the process is killed) is retried from a full budget again.
	pid, ok := proxytest.Processes(r.dir)[0]
	require.True(t, ok, "epoch 0's process runs")
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return len(r.proxy.starts()) == 5 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return r.gauge(t, "wasmesh_agent_proxy_retry_budget") == 5 },
		5*time.Second, 10*time.Millisecond)
}

func TestSpentBudgetEndsWithError(t *testing.T) {
	// Every start gets a bootstrap the proxy rejects: meshproxy, as Envoy, exits with 1.
	r := start(t, setup{retry: supervisor.Retry{MaxRetries: 3, InitialInterval: 5 * time.Millisecond}, badBootstraps: 100})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	select {
	case err := <-r.done:
		require.ErrorIs(t, err, supervisor.ErrBudgetExhausted)
		assert.Contains(t, err.Error(), "exit status 1", "the proxy's exit status is in the error")
		r.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("supervisor kept retrying")
	}
	assert.Len(t, r.proxy.starts(), 4, "one start and three retries")
	assert.Equal(t, 4, strings.Count(r.stderr.String(), "meshproxy: bootstrap "), "each failed on its bootstrap:\n%s", r.stderr)
}

func TestNewConfigStartsNextEpochWhileOldDrains(t *testing.T) {
	r := start(t, setup{retry: supervisor.DefaultRetry()})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"), "the same config again")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2"))

	require.Eventually(t, r.live(1), 10*time.Second, 10*time.Millisecond, "epoch 1 takes over the admin")
	starts := r.proxy.starts()
	require.Len(t, starts, 2, "the repeated config started nothing")
	assert.Equal(t, 1, starts[1].epoch)
	assert.False(t, starts[0].exited, "epoch 0 is still draining when epoch 1 is live")
	require.Eventually(t, func() bool { return r.proxy.starts()[0].exited }, 10*time.Second, 20*time.Millisecond,
		"epoch 0 exits after the parent shutdown time")
	assert.True(t, r.live(1)(), "epoch 1 keeps serving")
	assert.Equal(t, float64(1), r.gauge(t, "wasmesh_agent_proxy_epoch"))
}

// While a new epoch initializes beside a live one, the supervisor says a hot restart is
// under way; it stops saying so once the new epoch is live. Epoch 1 initializes until
// discovery answers it.
func TestHotRestartingUntilTheNewEpochIsLive(t *testing.T) {
	r := start(t, setup{retry: supervisor.DefaultRetry()})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	assert.False(t, r.sup.HotRestarting(), "one live epoch: no hot restart")

	r.discovery.HoldNewStreams()
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2"))
	require.Eventually(t, r.sup.HotRestarting, 5*time.Second, 5*time.Millisecond,
		"epoch 1 initializes while epoch 0 serves")
	assert.False(t, r.live(1)(), "epoch 1 is not live yet")
	r.discovery.Release()
	require.Eventually(t, r.live(1), 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return !r.sup.HotRestarting() }, 5*time.Second, 5*time.Millisecond,
		"epoch 1 is live: the hot restart is over")
}

// A proxy that exits on its own without an error (/quitquitquit) leaves nothing to
// supervise: Run ends with ErrProxyExited, and nothing is started again.
func TestAProxyThatQuitsEndsTheSupervisor(t *testing.T) {
	r := start(t, setup{retry: supervisor.DefaultRetry()})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, r.admin.Quit(ctx))
	select {
	case err := <-r.done:
		require.ErrorIs(t, err, supervisor.ErrProxyExited)
		r.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("the supervisor kept running")
	}
	assert.Len(t, r.proxy.starts(), 1)
}

// The default retry policy is pilot-agent's: 10 retries, the first after 200 ms.
func TestDefaultRetryIsPilotAgents(t *testing.T) {
	assert.Equal(t, supervisor.Retry{MaxRetries: 10, InitialInterval: 200 * time.Millisecond}, supervisor.DefaultRetry())
}

// An epoch that fails while an older one still serves takes the whole chain down; the retry
// waits until the aborted epochs are gone, then starts over from epoch 0 with the config
// in force.
func TestAFailedEpochRestartsTheChainOnceTheOthersAreGone(t *testing.T) {
	r := start(t, setup{retry: supervisor.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}, badStart: 2})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2")) // epoch 1 fails on its bootstrap
	require.Eventually(t, func() bool { return len(r.proxy.starts()) == 3 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	starts := r.proxy.starts()
	assert.Equal(t, []int{0, 1, 0}, []int{starts[0].epoch, starts[1].epoch, starts[2].epoch})
	require.True(t, starts[0].exited, "the first epoch was aborted")
	assert.False(t, starts[2].at.Before(starts[0].exitedAt), "epoch 0 starts again only once the aborted one is gone")
}

// A new config that arrives while a failed proxy waits for its retry starts the proxy at
// once; the retry, when its time comes, finds the config applied and starts nothing more.
func TestNewConfigDuringTheBackoffStartsOnce(t *testing.T) {
	r := start(t, setup{retry: supervisor.Retry{MaxRetries: 3, InitialInterval: 300 * time.Millisecond}, badBootstraps: 1})
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, func() bool { return r.gauge(t, "wasmesh_agent_proxy_retry_budget") == 2 },
		10*time.Second, 5*time.Millisecond, "the failed start spends one retry")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond, "the new config starts the proxy")
	require.Eventually(t, func() bool { return strings.Contains(r.log.String(), "desired configuration is already applied") },
		10*time.Second, 10*time.Millisecond, "the retry comes due")
	starts := r.proxy.starts()
	require.Len(t, starts, 2, "the failed start and the new config's; the retry started nothing")
	assert.False(t, starts[1].exited)
	assert.True(t, r.live(0)())
}

// The desired configuration is an opaque value: the empty one starts the proxy too.
func TestAnEmptyConfigStartsTheProxy(t *testing.T) {
	r := start(t, setup{retry: supervisor.DefaultRetry()})
	require.NoError(t, r.sup.Apply(context.Background(), ""))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	assert.Len(t, r.proxy.starts(), 1)
}
