package workloadcert

import (
	"context"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wasmesh/wasmesh/agent/caclient"
	"github.com/wasmesh/wasmesh/agent/csr"
	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
)

// The CA in these tests is the agent's in-test stand-in (internal/testca: Istio's
// certificate API over real TLS); discovery's real CA is tested in controlplane.

// fakeClock hands every wait to the test, which sees its duration and ends it.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits chan fakeWait
}

type fakeWait struct {
	d    time.Duration
	at   time.Time // the clock when the wait began
	fire chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now(), waits: make(chan fakeWait, 16)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	w := fakeWait{d: d, at: c.Now(), fire: make(chan time.Time, 1)}
	c.waits <- w
	return w.fire
}

// next waits for the rotator to wait, then lets that time pass.
func (c *fakeClock) next(t *testing.T) time.Duration {
	t.Helper()
	return c.end(t, func(w fakeWait) time.Time { return w.at.Add(w.d) }).d
}

// end waits for the rotator to wait, sets the clock to to(wait) and ends the wait.
func (c *fakeClock) end(t *testing.T, to func(fakeWait) time.Time) fakeWait {
	t.Helper()
	w := c.waiting(t)
	c.mu.Lock()
	c.now = to(w)
	now := c.now
	c.mu.Unlock()
	w.fire <- now
	return w
}

// waiting is the rotator's next wait, begun and not ended.
func (c *fakeClock) waiting(t *testing.T) fakeWait {
	t.Helper()
	select {
	case w := <-c.waits:
		return w
	case <-time.After(10 * time.Second):
		t.Fatal("the rotator never waited")
		return fakeWait{}
	}
}

type rig struct {
	ca        *testca.CA
	clock     *fakeClock
	reg       *prometheus.Registry
	log       *proxytest.Output
	published chan *Bundle
	rot       *Rotator
	served    *Served
}

// newRig runs a rotator against a test CA; tweak, if set, changes its configuration (the
// CA client is the one for the CA and token given).
func newRig(t *testing.T, lifetime time.Duration, tweak func(c *RotatorConfig, ca *testca.CA, token string)) *rig {
	ca := testca.Start(t, lifetime)
	token := ca.Allow(t, "tok", "cluster.local", "default", "reviews")
	r := &rig{ca: ca, clock: newFakeClock(), reg: prometheus.NewRegistry(), log: &proxytest.Output{}, published: make(chan *Bundle, 16)}
	r.served = NewServed(r.reg, r.clock.Now)
	client, err := caclient.New(caclient.Config{Address: ca.Addr, RootFile: ca.RootFile, ServerName: testca.ServerName,
		TokenFile: token, ClientCertificate: r.served.TLSCertificate})
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	id, err := csr.SPIFFEID("cluster.local", "default", "reviews")
	require.NoError(t, err)
	c := RotatorConfig{CA: client, Identity: id, TTL: lifetime, Clock: r.clock, Served: r.served,
		Registry: r.reg, Log: slog.New(slog.NewTextHandler(r.log, nil)), Backoff: Backoff{Initial: time.Second, Max: 4 * time.Second}}
	if tweak != nil {
		tweak(&c, ca, token)
	}
	r.rot, err = NewRotator(c)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.rot.Run(ctx, func(b *Bundle) { r.published <- b }) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *rig) nextBundle(t *testing.T) *Bundle {
	t.Helper()
	select {
	case b := <-r.published:
		return b
	case <-time.After(10 * time.Second):
		t.Fatal("no certificate published")
		return nil
	}
}

func TestRotationAtHalfTheLifetime(t *testing.T) {
	r := newRig(t, time.Hour, nil)
	first := r.nextBundle(t)
	assert.Equal(t, "spiffe://cluster.local/ns/default/sa/reviews", first.Leaf.URIs[0].String())
	assert.Equal(t, r.ca.RootPEM, first.Roots, "ROOTCA is the CA's root, the last of the chain")
	assert.NotContains(t, string(first.CertChain), string(r.ca.RootPEM), "the served chain leaves the root out")

	waited := r.clock.next(t)
	half := first.Leaf.NotAfter.Sub(first.Leaf.NotBefore) / 2
	assert.True(t, first.Leaf.NotBefore.Add(half).Equal(r.clock.Now()), "renewed with half the lifetime left")
	assert.Greater(t, waited, 29*time.Minute)
	second := r.nextBundle(t)
	assert.NotEqual(t, first.Leaf.SerialNumber, second.Leaf.SerialNumber)
	assert.NotEqual(t, first.Key, second.Key, "a new key each rotation")
	calls := r.ca.Calls()
	require.Len(t, calls, 2)
	assert.Nil(t, calls[0].ClientCert)
	require.NotNil(t, calls[1].ClientCert, "the renewal presents the current certificate")
	assert.Equal(t, first.Leaf.SerialNumber, calls[1].ClientCert.SerialNumber)
	assert.Equal(t, time.Hour, calls[0].Validity, "SECRET_TTL asked for")
	assert.Equal(t, 2.0, testutil.ToFloat64(r.rot.attempts.WithLabelValues("ok")))
	assert.Same(t, second, r.served.Current())
}

// A certificate due at once does not make the rotator ask the CA in a loop.
func TestCertificateDueAtOnceRenewedAfterTheFirstBackoff(t *testing.T) {
	r := newRig(t, time.Second, nil)
	r.nextBundle(t)
	assert.Equal(t, time.Second, r.clock.next(t), "Backoff.Initial")
	r.nextBundle(t)
}

// Jitter spreads renewals around half the lifetime, within its bound.
func TestRenewalJitter(t *testing.T) {
	r := newRig(t, time.Hour, func(c *RotatorConfig, _ *testca.CA, _ string) { c.GraceRatioJitter = 0.1 })
	var waits []time.Duration
	for range 8 {
		b := r.nextBundle(t)
		// Each wait ends at the CA's (real) time, so the next certificate is due ahead.
		w := r.clock.end(t, func(fakeWait) time.Time { return time.Now() })
		renewal := w.at.Add(w.d).Sub(b.Leaf.NotBefore)
		assert.GreaterOrEqual(t, renewal, b.Lifetime()*4/10, "not before 40 %% of the lifetime")
		assert.LessOrEqual(t, renewal, b.Lifetime()*6/10, "not after 60 %% of the lifetime")
		waits = append(waits, w.d)
	}
	assert.NotEqual(t, waits[0], waits[1], "spread (chance of equality ~0)")

	_, err := NewRotator(RotatorConfig{CA: r.rot.c.CA, Identity: r.rot.c.Identity, GraceRatioJitter: 0.5})
	assert.ErrorContains(t, err, "SECRET_GRACE_PERIOD_RATIO_JITTER 0.5")
}

func TestRefusedRenewalRetriedWithBackoffAndExpiryLogged(t *testing.T) {
	r := newRig(t, time.Hour, nil)
	first := r.nextBundle(t)
	denied := status.Error(codes.PermissionDenied, "identity mismatch")
	r.ca.FailNext(denied, denied, denied, denied, denied)
	r.clock.next(t) // to the refresh time
	var waits []time.Duration
	for range 5 {
		waits = append(waits, r.clock.next(t))
	}
	// 1 s, 2 s, 4 s, 4 s, 4 s, each ±10 %.
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second} {
		assert.InDelta(t, float64(want), float64(waits[i]), float64(want)/10+1, "wait %d", i)
	}
	second := r.nextBundle(t)
	assert.NotEqual(t, first.Leaf.SerialNumber, second.Leaf.SerialNumber)
	assert.Equal(t, 5.0, testutil.ToFloat64(r.rot.attempts.WithLabelValues("PermissionDenied")))
	assert.Contains(t, r.log.String(), "workload certificate renewal failed")
	assert.Contains(t, r.log.String(), "PermissionDenied")
	assert.NotContains(t, r.log.String(), "expires soon")
}

func TestNearExpiryIsLoudAndMeasured(t *testing.T) {
	r := newRig(t, time.Hour, nil)
	first := r.nextBundle(t)
	r.ca.FailNext(status.Error(codes.Unavailable, "down"))
	// The renewal comes late, 5 minutes before the end, as after a suspended machine.
	r.clock.end(t, func(fakeWait) time.Time { return first.Leaf.NotAfter.Add(-5 * time.Minute) })
	retry := r.clock.waiting(t) // the failure is reported before the retry's wait
	assert.Contains(t, r.log.String(), "expires soon and could not be renewed")
	assert.Equal(t, (5 * time.Minute).Seconds(), gauge(t, r.reg, "wasmesh_agent_cert_expiry_seconds"))
	retry.fire <- retry.at.Add(retry.d)
	r.nextBundle(t)
}

// An unreachable CA is retried with back-off until it can be reached.
func TestUnreachableCARetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	l.Close()
	var calls atomic.Int32
	r := newRig(t, time.Hour, func(c *RotatorConfig, ca *testca.CA, token string) {
		down, err := caclient.New(caclient.Config{Address: dead, RootFile: ca.RootFile, TokenFile: token})
		require.NoError(t, err)
		up, err := caclient.New(caclient.Config{Address: ca.Addr, RootFile: ca.RootFile, TokenFile: token})
		require.NoError(t, err)
		t.Cleanup(func() { down.Close(); up.Close() })
		c.CA = signerFunc(func(ctx context.Context, csr []byte, ttl time.Duration) ([]string, error) {
			if calls.Add(1) <= 3 {
				return down.Sign(ctx, csr, ttl)
			}
			return up.Sign(ctx, csr, ttl)
		})
	})
	var waits []time.Duration
	for range 3 {
		waits = append(waits, r.clock.next(t))
	}
	assert.Less(t, waits[0], waits[1])
	assert.Less(t, waits[1], waits[2])
	r.nextBundle(t)
	assert.Equal(t, 3.0, testutil.ToFloat64(r.rot.attempts.WithLabelValues("Unavailable")))
	assert.Contains(t, r.log.String(), "no workload certificate yet")
	assert.Contains(t, r.log.String(), dead, "the log names the CA")
}

type signerFunc func(ctx context.Context, csr []byte, ttl time.Duration) ([]string, error)

func (f signerFunc) Sign(ctx context.Context, csr []byte, ttl time.Duration) ([]string, error) {
	return f(ctx, csr, ttl)
}

func TestNoExpiryBeforeTheFirstCertificate(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewServed(reg, nil)
	assert.True(t, math.IsNaN(gauge(t, reg, "wasmesh_agent_cert_expiry_seconds")))
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestMeshRootsAreTrustedBesideTheCAs(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	old := testca.Start(t, time.Hour)
	meshRoots := filepath.Join(t.TempDir(), "root-cert.pem")
	require.NoError(t, os.WriteFile(meshRoots, append(append([]byte{}, old.RootPEM...), ca.RootPEM...), 0o644))
	merged := MergeRoots(ca.RootPEM, mustRead(t, meshRoots))
	assert.Equal(t, string(ca.RootPEM)+string(old.RootPEM), string(merged), "each root once, the CA's first")
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}
