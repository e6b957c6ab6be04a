package kubemesh_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/testenv/echo"
	"github.com/wasmesh/wasmesh/testenv/kubemesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// The sample's sidecars have their identity from the CA (through their service-account
// token) and call each other in mutual TLS (checkIdentity). Its workloads change under
// steady traffic through the front end (productpage, which calls reviews, which calls
// ratings), by kubectl as an operator changes them, and no request fails: scaling reviews-v1 up (the new pods get traffic) and down, a rolling
// restart of reviews-v2 and ratings-v1, deleting a pod of reviews-v1, and applying a
// VirtualService that moves every request to reviews-v2 and back.
func TestSampleChangesUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, kubemesh.Options{})
	took := applySample(t, ctx, m)
	t.Logf("first successful request through the mesh %v after the sample was applied", took)
	front := m.FrontURL(ctx, "/")
	ns := kubemesh.SampleNamespace
	injected(t, m, ns)
	kubectl := func(t *testing.T, args ...string) {
		t.Helper()
		_, err := m.Kubectl(ctx, append([]string{"-n", ns}, args...)...)
		require.NoError(t, err)
	}
	rolledOut := func(t *testing.T, deployments ...string) {
		t.Helper()
		for _, d := range deployments {
			require.NoError(t, m.WaitRolledOut(ctx, ns, d))
		}
	}

	t.Run("workload identity and mutual TLS", func(t *testing.T) { checkIdentity(t, ctx, m) })

	t.Run("kubectl scale up and down", func(t *testing.T) {
		g := meshtest.SteadyLoad(t, ctx, front, 100)
		meshtest.WaitServed(t, g, 100)
		kubectl(t, "scale", "deployment/reviews-v1", "--replicas=3")
		rolledOut(t, "reviews-v1")
		require.Eventually(t, func() bool { return len(reviewsPods(t, front, "v1", 200)) == 3 }, time.Minute, 100*time.Millisecond,
			"the new reviews-v1 pods answer")
		kubectl(t, "scale", "deployment/reviews-v1", "--replicas=1")
		rolledOut(t, "reviews-v1")
		meshtest.WaitServed(t, g, 200)
		meshtest.RequireNoFailures(t, g)
	})

	t.Run("kubectl rollout restart", func(t *testing.T) {
		g := meshtest.SteadyLoad(t, ctx, front, 100)
		meshtest.WaitServed(t, g, 100)
		kubectl(t, "rollout", "restart", "deployment/reviews-v2", "deployment/ratings-v1")
		kubectl(t, "rollout", "status", "deployment/reviews-v2", "--timeout=3m")
		kubectl(t, "rollout", "status", "deployment/ratings-v1", "--timeout=3m")
		rolledOut(t, "reviews-v2", "ratings-v1")
		meshtest.WaitServed(t, g, 200)
		meshtest.RequireNoFailures(t, g)
	})

	t.Run("kubectl delete pod", func(t *testing.T) {
		kubectl(t, "scale", "deployment/reviews-v1", "--replicas=2")
		rolledOut(t, "reviews-v1")
		g := meshtest.SteadyLoad(t, ctx, front, 100)
		meshtest.WaitServed(t, g, 100)
		pods := reviewsPods(t, front, "v1", 200)
		require.NotEmpty(t, pods)
		kubectl(t, "delete", "pod", pods[0], "--wait=false")
		rolledOut(t, "reviews-v1")
		meshtest.WaitServed(t, g, 200)
		meshtest.RequireNoFailures(t, g)
		kubectl(t, "scale", "deployment/reviews-v1", "--replicas=1")
		rolledOut(t, "reviews-v1")
	})

	t.Run("kubectl apply of a VirtualService", func(t *testing.T) {
		g := meshtest.SteadyLoad(t, ctx, front, 100)
		meshtest.WaitServed(t, g, 100)
		s, err := m.Sample()
		require.NoError(t, err)
		orig, err := os.ReadFile(filepath.Join(s.ConfigDir, "reviews.yaml"))
		require.NoError(t, err)
		allV2 := strings.Replace(strings.Replace(string(orig), "weight: 80", "weight: 0", 1), "weight: 20", "weight: 100", 1)
		require.NotEqual(t, string(orig), allV2)
		edited := filepath.Join(t.TempDir(), "reviews.yaml")
		require.NoError(t, os.WriteFile(edited, []byte(allV2), 0o644))
		begin := time.Now()
		kubectl(t, "apply", "-f", edited)
		applied := time.Now()
		require.Eventually(t, func() bool { return onlyVersion(t, front, "v2", 20) }, 30*time.Second, 20*time.Millisecond,
			"every request reaches reviews-v2")
		t.Logf("20 requests in a row on reviews-v2 %v after kubectl apply began (kubectl itself took %v)",
			time.Since(begin).Round(time.Millisecond), applied.Sub(begin).Round(time.Millisecond))
		kubectl(t, "apply", "-f", filepath.Join(s.ConfigDir, "reviews.yaml"))
		require.Eventually(t, func() bool { return len(reviewsPods(t, front, "v1", 50)) > 0 }, 30*time.Second, 20*time.Millisecond,
			"reviews-v1 answers again")
		meshtest.WaitServed(t, g, 200)
		meshtest.RequireNoFailures(t, g)
	})
}

// reviewsAnswers sends n requests to the front end and returns who answered for reviews
// (version and pod) in the successful ones.
func reviewsAnswers(t *testing.T, front string, n int) []echo.Answer {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	var out []echo.Answer
	for range n {
		resp, err := c.Get(front)
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		var a echo.Answer
		if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(b, &a) != nil || len(a.Upstream) == 0 || a.Upstream[0].Answer == nil {
			continue
		}
		out = append(out, *a.Upstream[0].Answer)
	}
	return out
}

// reviewsPods are the reviews pods of version that answered n requests to the front end.
func reviewsPods(t *testing.T, front, version string, n int) []string {
	seen := map[string]bool{}
	var out []string
	for _, a := range reviewsAnswers(t, front, n) {
		if a.Version == version && !seen[a.Pod] {
			seen[a.Pod] = true
			out = append(out, a.Pod)
		}
	}
	return out
}

// onlyVersion reports whether n requests in a row were answered by reviews of version.
func onlyVersion(t *testing.T, front, version string, n int) bool {
	as := reviewsAnswers(t, front, n)
	for _, a := range as {
		if a.Version != version {
			return false
		}
	}
	return len(as) == n
}

// injected: every pod of the namespace got its sidecar from the injection webhook (the
// Deployments carry none): an istio-proxy container and the injector's status annotation.
func injected(t *testing.T, m *kubemesh.Mesh, ns string) {
	t.Helper()
	pods, err := m.Cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items)
	for _, p := range pods.Items {
		assert.Contains(t, p.Annotations, "sidecar.istio.io/status", "pod %s", p.Name)
		assert.True(t, slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" }),
			"pod %s has no sidecar", p.Name)
	}
}
