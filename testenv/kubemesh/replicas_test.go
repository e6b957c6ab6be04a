package kubemesh_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/webhook/webhooktest"
	"github.com/wasmesh/wasmesh/testenv/kubemesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// testLease is discovery's lease in these tests: a killed leader is replaced within about
// 7 s instead of the manifests' 30 s.
const testLease = 5 * time.Second

// Two discovery replicas, as the manifests deploy them, behind the istiod Service (the
// service proxy), under steady traffic through the sample:
//   - the replica serving most proxies is killed (SIGKILL): every proxy reconnects, the
//     killed replica's to the other (one that reconnects late may reach the killed replica
//     again once the node has restarted it, as the Service routes to any ready endpoint);
//     the node restarts the killed container, which is ready again; one replica
//     leads (a killed leader's restarted container takes its Lease back at once: it holds
//     it under its pod's name, as in Kubernetes), and it does the leader's singleton work;
//   - the leader's pod is deleted (kubectl delete pod): it hands its Lease over on SIGTERM,
//     another replica leads and does the singleton work, the proxies it served reconnect.
//
// No request fails.
func TestDiscoveryReplicaKilledUnderLoad(t *testing.T) {
	m, ctx := startMesh(t, kubemesh.Options{LeaseDuration: testLease})
	applySample(t, ctx, m)
	proxies := samplePods(t, ctx, m)
	g := meshtest.SteadyLoad(t, ctx, m.FrontURL(ctx, "/"), 100)
	meshtest.WaitServed(t, g, 100)

	reps := waitReplicas(t, ctx, m, "every proxy on one replica, one leader", func(reps []kubemesh.Replica) error {
		return servedOnce(reps, proxies)
	})
	slices.SortFunc(reps, func(a, b kubemesh.Replica) int { return len(b.Proxies) - len(a.Proxies) })
	victim, survivor := reps[0], reps[1]
	t.Logf("killing %s (%d proxies, leading %v); %s has %d; connections through the service proxy: %v",
		victim.Pod, len(victim.Proxies), victim.Leader.Leading, survivor.Pod, len(survivor.Proxies), m.XDS.Active())
	require.NoError(t, m.KillDiscovery(ctx, victim.Pod))
	killed := time.Now()
	reps = waitReplicas(t, ctx, m, "every proxy to reconnect, the killed replica's to "+survivor.Pod, func(reps []kubemesh.Replica) error {
		return reconnected(reps, victim, survivor, proxies)
	})
	t.Logf("every proxy reconnected %v after %s was killed: %s", time.Since(killed).Round(time.Millisecond), victim.Pod, describe(reps))
	meshtest.WaitServed(t, g, 200)
	reps = waitReplicas(t, ctx, m, "the killed replica to be restarted and ready", func(reps []kubemesh.Replica) error {
		for _, r := range reps {
			if r.Pod == victim.Pod && (!r.Ready || r.Restarts <= victim.Restarts || len(m.XDS.Ready()) != 2) {
				return fmt.Errorf("%s: ready %v, %d restarts; the service proxy has %v", r.Pod, r.Ready, r.Restarts, m.XDS.Ready())
			}
		}
		return oneLeader(reps)
	})
	t.Logf("%s restarted and ready %v after it was killed; the leader is %s", victim.Pod, time.Since(killed).Round(time.Millisecond), leaderOf(reps))
	webhooktest.OverwriteCABundle(t, m.Cluster, "the leader restores the webhook's caBundle")

	// The leader's pod goes.
	lead := leaderOf(reps)
	_, err := m.Kubectl(ctx, "delete", "pod", "-n", kubemesh.DiscoveryNamespace, lead, "--wait=false")
	require.NoError(t, err)
	deleted := time.Now()
	reps = waitReplicas(t, ctx, m, "another replica to lead, every proxy on a replica still there", func(reps []kubemesh.Replica) error {
		if err := oneLeader(reps); err != nil {
			return err
		}
		if leaderOf(reps) == lead {
			return fmt.Errorf("%s still leads", lead)
		}
		return servedBy(reps, proxies, lead)
	})
	t.Logf("%s leads %v after the leader %s was deleted", leaderOf(reps), time.Since(deleted).Round(time.Millisecond), lead)
	webhooktest.OverwriteCABundle(t, m.Cluster, "the new leader restores the webhook's caBundle")
	meshtest.WaitServed(t, g, 200)
	meshtest.RequireNoFailures(t, g)
}

// servedBy is nil when every proxy has one stream, to any replica but those in gone.
func servedBy(reps []kubemesh.Replica, proxies int, gone ...string) error {
	seen := map[string]int{}
	for _, r := range reps {
		if slices.Contains(gone, r.Pod) {
			continue
		}
		for _, p := range r.Proxies {
			seen[p]++
		}
	}
	if len(seen) != proxies {
		return fmt.Errorf("%d proxies of %d connected (replicas: %v)", len(seen), proxies, describe(reps))
	}
	for p, n := range seen {
		if n != 1 {
			return fmt.Errorf("proxy %s has %d streams", p, n)
		}
	}
	return nil
}

// reconnected is nil when every proxy has one stream, to survivor or to victim's restarted
// container (never to the killed one, which may still answer for a moment), and at least
// one of victim's proxies moved to survivor rather than waiting for victim to come back.
func reconnected(reps []kubemesh.Replica, victim, survivor kubemesh.Replica, proxies int) error {
	moved := false
	for _, r := range reps {
		if r.Pod == victim.Pod && r.Restarts <= victim.Restarts && len(r.Proxies) > 0 {
			return fmt.Errorf("%s, not restarted yet, still answers for %d proxies", r.Pod, len(r.Proxies))
		}
		if r.Pod == survivor.Pod {
			moved = slices.ContainsFunc(r.Proxies, func(p string) bool { return slices.Contains(victim.Proxies, p) })
		}
	}
	if !moved {
		return fmt.Errorf("none of %s's proxies has reached %s (replicas: %v)", victim.Pod, survivor.Pod, describe(reps))
	}
	return servedBy(reps, proxies)
}

// oneLeader is nil when exactly one replica leads and every replica that answers says so.
func oneLeader(reps []kubemesh.Replica) error {
	var leaders []string
	for _, r := range reps {
		if r.Leader.Leading {
			leaders = append(leaders, r.Pod)
		}
	}
	if len(leaders) != 1 {
		return fmt.Errorf("leaders: %v", leaders)
	}
	for _, r := range reps {
		if r.Leader.Identity != "" && r.Leader.Leader != leaders[0] {
			return fmt.Errorf("%s sees %q lead, not %s", r.Pod, r.Leader.Leader, leaders[0])
		}
	}
	return nil
}

// leaderOf is the replica that leads ("" if none does).
func leaderOf(reps []kubemesh.Replica) string {
	for _, r := range reps {
		if r.Leader.Leading {
			return r.Pod
		}
	}
	return ""
}

func describe(reps []kubemesh.Replica) string {
	var b strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&b, "%s: ready %v, leading %v, %d proxies; ", r.Pod, r.Ready, r.Leader.Leading, len(r.Proxies))
	}
	return b.String()
}

// servedOnce is nil when there are two ready replicas, one leading, and every proxy has a
// stream to exactly one of them.
func servedOnce(reps []kubemesh.Replica, proxies int) error {
	if len(reps) != 2 || !reps[0].Ready || !reps[1].Ready {
		return fmt.Errorf("want two ready replicas: %s", describe(reps))
	}
	if err := oneLeader(reps); err != nil {
		return err
	}
	return servedBy(reps, proxies)
}

// waitReplicas waits until cond holds for the replicas, and returns them.
func waitReplicas(t *testing.T, ctx context.Context, m *kubemesh.Mesh, what string, cond func([]kubemesh.Replica) error) []kubemesh.Replica {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		reps, err := m.Replicas(ctx)
		if err == nil {
			if err = cond(reps); err == nil {
				return reps
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (%v)", what, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// samplePods is the number of the sample's pods, each with a proxy.
func samplePods(t *testing.T, ctx context.Context, m *kubemesh.Mesh) int {
	t.Helper()
	pods, err := m.Cluster.Client.CoreV1().Pods(kubemesh.SampleNamespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, pods.Items)
	return len(pods.Items)
}
