package e2e

import (
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/loadgen"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// Crashes at random moments under load: SIGKILL, as an OOM kill or a node fault, with no
// drain and no goodbye. Each test logs its seed; WASMESH_CRASH_SEED replays one.

// crashRand is the tests' source of random moments, seeded from the clock unless
// WASMESH_CRASH_SEED is set.
func crashRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := getenvUint(t, "WASMESH_CRASH_SEED"); s != 0 {
		seed = s
	}
	t.Logf("crash seed %d (WASMESH_CRASH_SEED=%d replays it)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed))
}

func getenvUint(t *testing.T, name string) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 64)
	require.NoError(t, err, "%s", name)
	return n
}

// randomMoment sleeps up to max, at random.
func randomMoment(r *rand.Rand, max time.Duration) {
	time.Sleep(time.Duration(r.Int64N(int64(max))))
}

// Discovery killed three times under load: the proxies keep serving on their last config
// while it is gone, resync when it is back, and no request fails.
func TestDiscoveryKilledUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	_, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)
	r := crashRand(t)

	g := steadyLoad(t, ctx, front.URL("/"), crashRate)
	waitServed(t, g, 100)
	for i := 0; i < 3; i++ {
		randomMoment(r, time.Second)
		m.KillDiscovery()
		waitServed(t, g, 100) // on the last config while discovery is away
		require.NoError(t, m.StartDiscovery(ctx))
		require.Eventually(t, func() bool { return connectedProxies(m) == 2 }, 30*time.Second, 50*time.Millisecond,
			"kill %d: both proxies reconnect", i+1)
	}
	// The resynced proxies take changes from the last discovery: a new backend is used.
	back2, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inClusters(front, back2.IP) }, 30*time.Second, 50*time.Millisecond,
		"the frontend's proxy receives the new endpoint")
	waitServed(t, g, 200)
	requireNoFailures(t, g)
}

// An agent killed: its proxy goes with it, the pod's endpoint leaves EDS, and the rest of
// the mesh serves on. Until the endpoint leaves, the frontend's proxy still picks it: a
// connection refused there is retried on a host not tried before (Istio's default retry
// policy), which saves the request unless every attempt picked the dead host again. Istio's
// default balancer, LEAST_REQUEST, prefers the host with fewer active requests, which the
// dead one always is, so a few requests may spend their attempts on it, as with Envoy: the
// proxy counts them (upstream_rq_retry_limit_exceeded). Only those and the requests in flight
// through the killed proxy may fail.
func TestAgentKilledUnderLoad(t *testing.T) {
	front, doomed, g, proxy := twoBackendsUnderLoad(t)
	inFlight := inFlightBound(g)
	exhausted, saved := retryOutcomes(t, front)
	doomed.KillAgent()
	require.Eventually(t, func() bool { return syscall.Kill(proxy, 0) != nil }, 10*time.Second, 10*time.Millisecond,
		"the proxy dies with its agent")
	require.Eventually(t, func() bool { return !inClusters(front, doomed.IP) }, 30*time.Second, 50*time.Millisecond,
		"the killed pod's endpoint leaves the frontend's EDS")
	atRemoval := g.Snapshot()
	waitServed(t, g, 400)
	res := g.Stop()
	exhaustedNow, savedNow := retryOutcomes(t, front)
	exhausted, saved = exhaustedNow-exhausted, savedNow-saved
	t.Logf("load: %s; failed before the endpoint left: %d; in flight at most %d; retries: %d requests saved, %d exhausted",
		res.String(), atRemoval.Failed, inFlight, saved, exhausted)
	assert.Equal(t, atRemoval.Failed, res.Failed, "no request failed once the endpoint was gone")
	assert.Positive(t, saved, "retries on another host saved requests sent to the dead endpoint")
	assert.LessOrEqual(t, int64(res.Failed), int64(inFlight)+exhausted,
		"only requests in flight through the killed proxy, or whose every attempt went to it, failed")
}

// retryOutcomes sums the pod proxy's outbound retry counters: requests whose retries were
// all used and failed (upstream_rq_retry_limit_exceeded), and requests a retry saved
// (upstream_rq_retry_success).
func retryOutcomes(t *testing.T, p *localmesh.Pod) (exhausted, saved int64) {
	t.Helper()
	for name, n := range proxyCounters(t, nilCtx(), p, `^cluster\.outbound.*\.upstream_rq_retry_(limit_exceeded|success)$`) {
		if strings.HasSuffix(name, "limit_exceeded") {
			exhausted += n
		} else {
			saved += n
		}
	}
	return exhausted, saved
}

// twoBackendsUnderLoad starts a frontend calling two backends under steady load, and
// returns at a random moment with the first backend and its proxy's pid, to crash.
func twoBackendsUnderLoad(t *testing.T) (front, doomed *localmesh.Pod, g *loadgen.Generator, proxy int) {
	t.Helper()
	m, ctx := startMesh(t, frontBack())
	doomed, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	_, err = m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err = m.AddPod(ctx, frontendPod(func(s *localmesh.PodSpec) {
		s.Annotations = map[string]string{"sidecar.istio.io/statsInclusionSuffixes": "upstream_rq_retry_limit_exceeded,upstream_rq_retry_success"}
	}))
	require.NoError(t, err)
	r := crashRand(t)
	g = steadyLoad(t, ctx, front.URL("/"), crashRate)
	waitServed(t, g, 200)
	proxy, err = doomed.ProxyPid()
	require.NoError(t, err)
	randomMoment(r, time.Second)
	return front, doomed, g, proxy
}

// inFlightBound bounds the requests a crash can catch in flight: the load's rate times its
// P99 latency so far (Little's law, on the safe side), and one more.
func inFlightBound(g *loadgen.Generator) int {
	res := g.Snapshot()
	return int(math.Ceil(crashRate*res.Quantile(0.99).Seconds())) + 1
}

const crashRate = 200 // requests/s of the crash tests' load

// A proxy killed: its agent restarts it within its retry budget and the pod serves again;
// only requests in flight through the killed proxy may fail, and, while it is down, those
// whose every attempt went to it (as in TestAgentKilledUnderLoad).
func TestProxyKilledUnderLoad(t *testing.T) {
	front, back, g, proxy := twoBackendsUnderLoad(t)
	inFlight := inFlightBound(g)
	exhausted, _ := retryOutcomes(t, front)
	require.NoError(t, syscall.Kill(proxy, syscall.SIGKILL))
	var again int
	var err error
	require.Eventually(t, func() bool {
		again, err = back.ProxyPid()
		return err == nil && again != proxy && restartEpoch(back) >= 0
	}, 30*time.Second, 20*time.Millisecond, "the agent starts a new proxy, which serves its admin API")
	assert.True(t, back.Running(), "the agent lives on")
	require.Eventually(t, func() bool { return inClusters(front, back.IP) && backendServes(back) }, 30*time.Second, 50*time.Millisecond,
		"the restarted proxy takes traffic again")
	waitServed(t, g, 200)
	res := g.Stop()
	exhaustedNow, _ := retryOutcomes(t, front)
	exhausted = exhaustedNow - exhausted
	t.Logf("load: %s; in flight at most %d; requests whose retries were exhausted: %d", res.String(), inFlight, exhausted)
	assert.LessOrEqual(t, int64(res.Failed), int64(inFlight)+exhausted,
		"only requests in flight through the killed proxy, or whose every attempt went to it, failed")
}

// backendServes says whether the pod's inbound listener answers (through its proxy).
func backendServes(p *localmesh.Pod) bool {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(p.URL("/healthz"))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}
