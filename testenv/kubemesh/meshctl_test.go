package kubemesh_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/testenv/kubemesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// meshctl reads a sidecar's admin API on Kubernetes as istioctl does, with a kubeconfig and
// no port-forward of the user's: client-go's port-forward through the API server and the
// node's kubelet API to the pod's port 15000. proxy-config prints the clusters it prints
// from the admin reached directly, and proxy-status compares the proxy's own config with
// discovery's through the same forward.
func TestMeshctlThroughAPortForward(t *testing.T) {
	m, ctx := startMesh(t, kubemesh.Options{})
	applySample(t, ctx, m)
	meshctl := meshctlBinary(t)
	ns := kubemesh.SampleNamespace
	pods, err := m.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=productpage"})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items)
	pod := pods.Items[0]

	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, meshctl, args...).CombinedOutput()
		return string(out), err
	}
	forwarded, err := run("proxy-config", "clusters", pod.Name, "-n", ns, "--kubeconfig", m.Cluster.Kubeconfig)
	require.NoError(t, err, "%s", forwarded)
	assert.Contains(t, forwarded, "SERVICE FQDN")
	assert.Contains(t, forwarded, "reviews."+ns+".svc.cluster.local", "the proxy's outbound cluster of reviews")
	direct, err := run("proxy-config", "clusters", "--admin", m.ProxyAdminURL(&pod, ""))
	require.NoError(t, err, "%s", direct)
	assert.Equal(t, direct, forwarded, "the same clusters as the admin read directly")

	byDot, err := run("proxy-config", "clusters", pod.Name+"."+ns, "--kubeconfig", m.Cluster.Kubeconfig)
	require.NoError(t, err, "%s", byDot)
	assert.Equal(t, forwarded, byDot, "<pod>.<namespace> names the same pod")

	status, err := run("proxy-status", pod.Name+"."+ns, "--kubeconfig", m.Cluster.Kubeconfig, "--discoveryAddress", discoveryAddrs(t, ctx, m))
	require.NoError(t, err, "%s", status)
	assert.NotContains(t, status, "is not compared", "the proxy's own config is read through the forward")
	assert.Contains(t, status, "SYNCED")

	out, err := run("proxy-config", "clusters", "no-such-pod", "-n", ns, "--kubeconfig", m.Cluster.Kubeconfig)
	require.Error(t, err)
	assert.Contains(t, out, `pod `+ns+`/no-such-pod: pods "no-such-pod" not found`)
}

// discoveryAddrs are discovery's replicas' debug ports (15014, on their pod IPs).
func discoveryAddrs(t *testing.T, ctx context.Context, m *kubemesh.Mesh) string {
	t.Helper()
	pods, err := m.DiscoveryPods(ctx)
	require.NoError(t, err)
	var addrs []string
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			addrs = append(addrs, net.JoinHostPort(p.Status.PodIP, "15014"))
		}
	}
	require.NotEmpty(t, addrs)
	return strings.Join(addrs, ",")
}

// meshctlBinary is $WASMESH_BIN_DIR's meshctl (make build's), else one built from this
// checkout for the test.
func meshctlBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("WASMESH_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "meshctl")); err == nil {
			return filepath.Join(dir, "meshctl")
		}
	}
	bin := filepath.Join(t.TempDir(), "meshctl")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/meshctl")
	cmd.Dir = filepath.Join(meshtest.Root(), "controlplane")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "building meshctl: %s", out)
	return bin
}
