package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	sup    *supervisor.Supervisor
	admin  *admin.Client
	reg    *prometheus.Registry
	starts string
	done   chan error
	cancel context.CancelFunc
}

// start runs a supervisor over the test proxy with the given knobs (environment).
func start(t *testing.T, retry supervisor.Retry, env ...string) *rig {
	t.Helper()
	ip := proxytest.Loopback(t, 15000, 15020, 15021, 15090)
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts")
	ac := admin.New(ip+":15000", time.Second)
	t.Cleanup(ac.Close)
	p, err := envoyproc.New(envoyproc.Config{
		BinaryPath: proxyBinary, ConfigPath: dir,
		DrainDuration: time.Second, ParentShutdownDuration: time.Second,
		ServiceCluster: "test.test", ServiceNode: "sidecar~" + ip + "~test.test~test.svc.cluster.local",
		LogLevel: "warning", Bootstrap: proxytest.Bootstrap(ip), Admin: ac, ReadyPoll: 20 * time.Millisecond,
		Env:    append([]string{"TESTPROXY_STARTS_FILE=" + starts}, env...),
		Stdout: io.Discard, Stderr: io.Discard,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	sup := supervisor.New(p, retry, slog.New(slog.NewTextHandler(testWriter{t}, nil)), reg)
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{sup: sup, admin: ac, reg: reg, starts: starts, done: make(chan error, 1), cancel: cancel}
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

type startRec struct {
	epoch int
	pid   int
	at    time.Time
}

func (r *rig) startsSeen(t *testing.T) []startRec {
	b, err := os.ReadFile(r.starts)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	var out []startRec
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		e, _ := strconv.Atoi(f[0])
		pid, _ := strconv.Atoi(f[1])
		ns, _ := strconv.ParseInt(f[2], 10, 64)
		out = append(out, startRec{e, pid, time.Unix(0, ns)})
	}
	return out
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

func (r *rig) live(epoch int) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		si, err := r.admin.ServerInfo(ctx)
		return err == nil && si.State == "LIVE" && si.CommandLineOptions.RestartEpoch == epoch
	}
}

func TestRestartWithBackoffRestoresBudget(t *testing.T) {
	proxytest.RequireKnobs(t)
	failFile := filepath.Join(t.TempDir(), "fail")
	require.NoError(t, os.WriteFile(failFile, []byte("3"), 0o644))
	retry := supervisor.Retry{MaxRetries: 5, InitialInterval: 30 * time.Millisecond}
	r := start(t, retry, "TESTPROXY_FAIL_FILE="+failFile, "TESTPROXY_CONFIG_ON_START=1")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))

	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond, "the fourth start comes up")
	starts := r.startsSeen(t)
	require.Len(t, starts, 4, "three failed starts and one good one")
	for i := 1; i < len(starts); i++ {
		assert.Equal(t, 0, starts[i].epoch, "after an error every epoch is aborted and the chain restarts at 0")
		gap := starts[i].at.Sub(starts[i-1].at)
		min := retry.InitialInterval << (i - 1)
		assert.GreaterOrEqual(t, gap, min, "retry %d waits at least %v (exponential backoff)", i, min)
	}
	require.Eventually(t, func() bool { return r.gauge(t, "wasmesh_agent_proxy_retry_budget") == 5 },
		5*time.Second, 10*time.Millisecond, "a live epoch restores the budget")

	// A crash after that is retried from a full budget again.
	code, _, err := r.admin.Do(context.Background(), "POST", "/testproxy/exit?code=7")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool { return len(r.startsSeen(t)) == 5 }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return r.gauge(t, "wasmesh_agent_proxy_retry_budget") == 5 },
		5*time.Second, 10*time.Millisecond)
}

func TestSpentBudgetEndsWithError(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, supervisor.Retry{MaxRetries: 3, InitialInterval: 5 * time.Millisecond}, "TESTPROXY_EXIT_CODE=2")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	select {
	case err := <-r.done:
		require.ErrorIs(t, err, supervisor.ErrBudgetExhausted)
		assert.Contains(t, err.Error(), "exit status 2")
		r.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("supervisor kept retrying")
	}
	assert.Len(t, r.startsSeen(t), 4, "one start and three retries")
}

func TestNewConfigStartsNextEpochWhileOldDrains(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, supervisor.DefaultRetry(), "TESTPROXY_CONFIG_ON_START=1")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"), "the same config again")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2"))

	require.Eventually(t, r.live(1), 10*time.Second, 10*time.Millisecond, "epoch 1 takes over the admin")
	starts := r.startsSeen(t)
	require.Len(t, starts, 2, "the repeated config started nothing")
	assert.Equal(t, 1, starts[1].epoch)
	assert.True(t, alive(starts[0].pid), "epoch 0 is still draining when epoch 1 is live")
	require.Eventually(t, func() bool { return !alive(starts[0].pid) }, 10*time.Second, 20*time.Millisecond,
		"epoch 0 exits after the parent shutdown time")
	assert.True(t, r.live(1)(), "epoch 1 keeps serving")
	assert.Equal(t, float64(1), r.gauge(t, "wasmesh_agent_proxy_epoch"))
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

// While a new epoch initializes beside a live one, the supervisor says a hot restart is
// under way; it stops saying so once the new epoch is live.
func TestHotRestartingUntilTheNewEpochIsLive(t *testing.T) {
	proxytest.RequireKnobs(t)
	r := start(t, supervisor.DefaultRetry(), "TESTPROXY_CONFIG_ON_START=1", "TESTPROXY_CHILD_INIT=700ms")
	require.NoError(t, r.sup.Apply(context.Background(), "certs-v1"))
	require.Eventually(t, r.live(0), 10*time.Second, 10*time.Millisecond)
	assert.False(t, r.sup.HotRestarting(), "one live epoch: no hot restart")

	require.NoError(t, r.sup.Apply(context.Background(), "certs-v2"))
	require.Eventually(t, r.sup.HotRestarting, 5*time.Second, 5*time.Millisecond,
		"epoch 1 initializes while epoch 0 serves")
	assert.False(t, r.live(1)(), "epoch 1 is not live yet")
	require.Eventually(t, r.live(1), 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return !r.sup.HotRestarting() }, 5*time.Second, 5*time.Millisecond,
		"epoch 1 is live: the hot restart is over")
}
