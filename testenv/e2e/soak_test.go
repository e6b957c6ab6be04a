package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// The soak: the mesh under steady load with churn, for WASMESH_SOAK_DURATION (make soak
// DURATION=30m; make test runs a short one). Every second a config change (a header the
// frontend's route adds to backend calls: an RDS push); every 30 s a backend scaled down
// (graceful stop) and up (a new pod); every 5 minutes a certificate rotation of the
// frontend, which hot-restarts its proxy. The old epoch lives on for the agent's
// parentShutdownDuration (drainDuration plus 15 s: 60 s by default, as Istio's), sharing
// the pod's connections with the new one; a run shorter than ten minutes rotates once, 3 s
// in, with a 2 s drain (ProxyConfig on the frontend), so that the old epoch is gone before
// the second fifth and the live proxy is compared with itself carrying all the load. It
// asserts that no request fails, that every process alive from the first fifth to the end
// keeps its memory, goroutines and descriptors flat after warm-up (the second fifth of the
// run against the last), and that discovery's push convergence P99 stays steady.

const (
	soakRate        = 300
	soakDefault     = 150 * time.Second
	soakSample      = 2 * time.Second
	soakScaleEvery  = 30 * time.Second
	soakRotateEvery = 5 * time.Minute
	// A short run's one rotation, and the frontend's drain then: its old epoch is gone
	// 3+2+15 s in, before the second fifth of the shortest run (2 min) starts at 24 s.
	soakShortRotateAt = 3 * time.Second
	soakShortDrain    = 2 * time.Second
	soakGrowth        = 0.10 // allowed growth, second fifth to last
	soakRSSFloor      = 2 << 20
	soakCountFloor    = 10 // goroutines, descriptors other than sockets
	// Connection pools keep, idle, as many connections as the most requests ever in flight
	// (Envoy's and Istio's upstream idle timeout is an hour), so a pod's sockets follow
	// the load's peaks: up to soakPoolRoom more sockets are allowed, the load's most
	// requests in flight (meshrunner.StartLoad's 32) times the connections one of them
	// holds in the frontend's proxy (in from the client, to the app, in from the app, to
	// a backend), and soakGoroutinesPerConn goroutines for each new one. A connection
	// kept to a pod that is gone is a leak, checked apart (checkNoStaleConnections).
	soakPoolRoom          = 32 * 4
	soakGoroutinesPerConn = 2
	soakConvergeRoom      = 2.0
)

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("WASMESH_SOAK_DURATION")
	if v == "" {
		return soakDefault
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "WASMESH_SOAK_DURATION")
	require.GreaterOrEqual(t, d, 2*time.Minute, "WASMESH_SOAK_DURATION: a shorter soak has no fifth after a hot restart's old epoch is gone")
	return d
}

// soakRoute is the config changed every second: the frontend's route to the backend adds a
// header with the revision.
func soakRoute(rev int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend, namespace: default}
spec:
  hosts: [backend.default.svc.cluster.local]
  http:
  - headers: {request: {set: {x-soak-rev: "%d"}}}
    route: [{destination: {host: backend.default.svc.cluster.local}}]
`, rev)
}

// procSample is one reading of one process.
type procSample struct {
	at         time.Duration
	rss        int64
	fds        int
	sockets    int
	goroutines int // -1: not read
}

func TestSoak(t *testing.T) {
	d := soakDuration(t)
	m, ctx := startMeshFor(t, frontBack(), d+3*time.Minute)
	require.NoError(t, m.WriteConfig("soak-route.yaml", soakRoute(0)))
	var backends, gone []*localmesh.Pod
	for i := 0; i < 2; i++ {
		b, err := m.AddPod(ctx, backendPod())
		require.NoError(t, err)
		backends = append(backends, b)
	}
	rotateEvery, nextRotate := soakRotateEvery, soakRotateEvery
	var frontOpts []func(*localmesh.PodSpec)
	if d < 2*soakRotateEvery {
		rotateEvery, nextRotate = d, soakShortRotateAt
		frontOpts = append(frontOpts, func(s *localmesh.PodSpec) {
			s.Annotations = map[string]string{"proxy.istio.io/config": "drainDuration: " + soakShortDrain.String()}
		})
	}
	front, err := m.AddPod(ctx, frontendPod(frontOpts...))
	require.NoError(t, err)
	g := steadyLoad(t, ctx, front.URL("/"), soakRate)
	waitServed(t, g, soakRate)

	begin := time.Now()
	samples := map[string][]procSample{} // by name@pid, or a pod's live proxy
	var convergence [][]bucket           // discovery's histogram at each fifth's start, and the end
	var mu sync.Mutex
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the readings, every soakSample
		defer wg.Done()
		for next := 0; sctx.Err() == nil; time.Sleep(soakSample) {
			at := time.Since(begin)
			if fifth := int(at * 5 / d); fifth >= next && next <= 4 {
				h, err := convergenceBuckets(sctx, m)
				if err == nil {
					mu.Lock()
					convergence = append(convergence, h)
					mu.Unlock()
					next = fifth + 1
				}
			}
			for _, p := range m.Processes() {
				// A pod's proxy is a new process at each hot restart: it is judged as the
				// pod's live proxy, whichever epoch that is.
				key := fmt.Sprintf("%s@%d", p.Name, p.Pid)
				if strings.HasSuffix(p.Name, "/proxy") {
					key = p.Name + " (live)"
				}
				s := procSample{at: at, goroutines: -1}
				st, err := localmesh.ReadProcStats(p.Pid)
				if err != nil {
					continue // gone meanwhile
				}
				s.rss, s.fds, s.sockets = st.RSS, st.FDs, st.Sockets
				if p.Goroutines != nil {
					if n, err := p.Goroutines(sctx); err == nil {
						s.goroutines = n
					}
				}
				mu.Lock()
				samples[key] = append(samples[key], s)
				mu.Unlock()
			}
		}
	}()

	changes, scales, rotations := 0, 0, 0
	nextScale := soakScaleEvery
	for tick := time.NewTicker(time.Second); time.Since(begin) < d; <-tick.C {
		changes++
		require.NoError(t, m.WriteConfig("soak-route.yaml", soakRoute(changes)))
		switch at := time.Since(begin); {
		case at >= nextScale:
			nextScale += soakScaleEvery
			scales++
			down := backends[0]
			require.NoError(t, down.Stop(ctx), "scale down %s", down.Spec.Name)
			gone = append(gone, down)
			b, err := m.AddPod(ctx, backendPod())
			require.NoError(t, err, "scale up")
			backends = append(backends[1:], b)
		case at >= nextRotate:
			nextRotate += rotateEvery
			rotations++
			require.NoError(t, front.RotateCertificates())
		}
	}
	stop()
	wg.Wait()
	h, err := convergenceBuckets(ctx, m)
	require.NoError(t, err)
	convergence = append(convergence, h)
	res := g.Stop()
	t.Logf("soak %v at %d requests/s: %d config changes, %d scale-downs/ups, %d certificate rotations; load: %s",
		d, soakRate, changes, scales, rotations, res.String())
	assert.Zero(t, res.Failed, "failed requests: %s", res.String())
	assert.Positive(t, scales)
	assert.Positive(t, rotations)
	checkFlat(t, samples, d)
	checkNoStaleConnections(t, m, gone)
	checkConvergenceSteady(t, convergence)
}

// checkFlat compares, for every process alive from the first fifth of the run to its last
// (a process started later is still warming up in the second), the mean of each reading
// in the second fifth and in the last; growth is allowed up to soakGrowth, or a floor
// for short runs, whose fifths are seconds long (one collection moves RSS by megabytes),
// and for sockets and the goroutines that serve them, the room of connection pools.
func checkFlat(t *testing.T, samples map[string][]procSample, d time.Duration) {
	t.Helper()
	names := make([]string, 0, len(samples))
	for n := range samples {
		names = append(names, n)
	}
	sort.Strings(names)
	var compared int
	for _, n := range names {
		second, last := fifthMeans(samples[n], d, 1), fifthMeans(samples[n], d, 4)
		if samples[n][0].at*5 >= d || second.n == 0 || last.n == 0 {
			continue // not alive through the run (scaled, or a hot restart's epoch)
		}
		compared++
		t.Logf("%-28s rss %6.1f -> %6.1f MiB, other fds %5.1f -> %5.1f, sockets %5.1f -> %5.1f, goroutines %6.1f -> %6.1f", n,
			second.rss/(1<<20), last.rss/(1<<20), second.fds-second.sockets, last.fds-last.sockets,
			second.sockets, last.sockets, second.goroutines, last.goroutines)
		flat := func(what string, a, b, floor float64) {
			assert.LessOrEqual(t, b-a, math.Max(a*soakGrowth, floor), "%s: %s grew from %.1f to %.1f", n, what, a, b)
		}
		flat("resident memory", second.rss, last.rss, soakRSSFloor)
		flat("descriptors other than sockets", second.fds-second.sockets, last.fds-last.sockets, soakCountFloor)
		flat("sockets", second.sockets, last.sockets, soakPoolRoom)
		if second.goroutines >= 0 && last.goroutines >= 0 {
			flat("goroutines", second.goroutines, last.goroutines,
				soakCountFloor+soakGoroutinesPerConn*math.Max(0, last.sockets-second.sockets))
		}
	}
	assert.GreaterOrEqual(t, compared, 4, "processes alive through the run (discovery, the frontend's agent, app and live proxy)")
}

// checkNoStaleConnections asserts that no process of the mesh still has a connection to
// a pod that was scaled down: pools let go of connections to a host that left.
func checkNoStaleConnections(t *testing.T, m *localmesh.Mesh, gone []*localmesh.Pod) {
	t.Helper()
	for _, p := range m.Processes() {
		peers, err := localmesh.TCPPeers(p.Pid)
		if err != nil {
			continue // gone meanwhile
		}
		for _, g := range gone {
			assert.Zero(t, peers[g.IP], "%s@%d keeps %d connections to %s (%s), scaled down", p.Name, p.Pid, peers[g.IP], g.IP, g.Spec.Name)
		}
	}
}

type means struct {
	n                             int
	rss, fds, sockets, goroutines float64
}

// fifthMeans averages the samples taken in fifth k (0-based) of a run of d.
func fifthMeans(ss []procSample, d time.Duration, k int) means {
	var m means
	var gn int
	var g float64
	for _, s := range ss {
		if int(s.at*5/d) != k {
			continue
		}
		m.n++
		m.rss += float64(s.rss)
		m.fds += float64(s.fds)
		m.sockets += float64(s.sockets)
		if s.goroutines >= 0 {
			gn++
			g += float64(s.goroutines)
		}
	}
	if m.n > 0 {
		m.rss /= float64(m.n)
		m.fds /= float64(m.n)
		m.sockets /= float64(m.n)
	}
	m.goroutines = -1
	if gn > 0 {
		m.goroutines = g / float64(gn)
	}
	return m
}

// bucket is one cumulative bucket of a Prometheus histogram.
type bucket struct {
	le    float64
	count float64
}

// convergenceBuckets reads discovery's pilot_proxy_convergence_time histogram, its
// cumulative buckets in order, +Inf last.
func convergenceBuckets(ctx context.Context, m *localmesh.Mesh) ([]bucket, error) {
	page, err := getURL(m.DiscoveryURL("/metrics"))
	if err != nil {
		return nil, err
	}
	metrics, err := localmesh.ParseMetrics(page)
	if err != nil {
		return nil, err
	}
	series := metrics.Series("pilot_proxy_convergence_time", nil)
	if len(series) != 1 {
		return nil, fmt.Errorf("discovery has %d pilot_proxy_convergence_time series, want 1", len(series))
	}
	var out []bucket
	for le, n := range series[0].Buckets {
		out = append(out, bucket{le: le, count: float64(n)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].le < out[j].le })
	return append(out, bucket{le: math.Inf(1), count: series[0].Value}), nil
}

// p99Between is the P99 (a bucket's upper bound) of the observations between two readings.
func p99Between(a, b []bucket) (float64, float64) {
	total := b[len(b)-1].count - a[len(a)-1].count
	for i := range b {
		if b[i].count-a[i].count >= 0.99*total {
			return b[i].le, total
		}
	}
	return math.Inf(1), total
}

// checkConvergenceSteady compares the push convergence P99 of the second fifth with the
// last: steady means within soakConvergeRoom (about one bucket).
func checkConvergenceSteady(t *testing.T, readings [][]bucket) {
	t.Helper()
	require.GreaterOrEqual(t, len(readings), 6, "a reading at each fifth's start and the end")
	second, n2 := p99Between(readings[1], readings[2])
	last, n5 := p99Between(readings[4], readings[5])
	t.Logf("push convergence P99: %gs in the second fifth (%v pushes), %gs in the last (%v pushes)", second, n2, last, n5)
	require.Positive(t, n2)
	require.Positive(t, n5)
	assert.LessOrEqual(t, last, soakConvergeRoom*second, "push convergence P99 grew")
}
