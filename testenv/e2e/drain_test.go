package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// 4. Seed 002's 503s: a back-end pod stopped while traffic flows (SIGTERM → the agent takes
// it out of load balancing, then drains) fails no request, and its endpoint leaves every
// proxy's EDS.
func TestScaleDownUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, frontBack())
	b1, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	b2, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return inClusters(front, b1.IP) && inClusters(front, b2.IP) }, 30*time.Second, 20*time.Millisecond)

	g := steadyLoad(t, ctx, front.URL("/"), 200)
	waitServed(t, g, 100)
	require.NoError(t, b1.Stop(ctx))
	waitServed(t, g, 100)
	requireNoFailures(t, g)
	require.Eventually(t, func() bool { return !inClusters(front, b1.IP) && inClusters(front, b2.IP) }, 30*time.Second, 50*time.Millisecond,
		"the stopped pod's endpoint leaves the frontend proxy's EDS")
}

// 5. A rolling restart: the new pod is ready before the old one is stopped; in both drain
// modes no request fails.
func TestRollingRestart(t *testing.T) {
	for name, env := range map[string][]string{
		"fixed drain duration":            nil,
		"exit on zero active connections": {"EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true", "MINIMUM_DRAIN_DURATION=1s"},
	} {
		t.Run(name, func(t *testing.T) {
			m, ctx := startMesh(t, frontBack())
			old, err := m.AddPod(ctx, backendPod(func(s *localmesh.PodSpec) { s.Env = env }))
			require.NoError(t, err)
			front, err := m.AddPod(ctx, frontendPod())
			require.NoError(t, err)

			g := steadyLoad(t, ctx, front.URL("/"), 200)
			waitServed(t, g, 100)
			next, err := m.AddPod(ctx, backendPod(func(s *localmesh.PodSpec) { s.Env = env }))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return inClusters(front, next.IP) }, 30*time.Second, 20*time.Millisecond)
			begin := time.Now()
			require.NoError(t, old.Stop(ctx))
			t.Logf("old pod stopped in %v", time.Since(begin).Round(time.Millisecond))
			waitServed(t, g, 100)
			requireNoFailures(t, g)
		})
	}
}

var _ = context.Background
