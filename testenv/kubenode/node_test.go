package kubenode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/testenv/echo"
	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

// One control plane (with the controller manager and the scheduler) and one node serve
// every subtest; each subtest has a namespace of its own.
func TestNodeOnARealControlPlane(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{ControllerManager: true, Scheduler: true})
	bin := echoBinDir(t)
	opts := kubenode.Options{BinDir: bin}
	if inNetns() {
		opts.PodNet = "198.18" // see TestMain
	}
	n := startNode(t, c, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := &env{t: t, cluster: c, kc: c.Client, node: n, ctx: ctx}
	e.waitFor(time.Minute, "the node to be registered Ready, with its lease", func() error {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}) {
			return fmt.Errorf("node not Ready: %v", node.Status.Conditions)
		}
		var lease *coordinationv1.Lease
		lease, err = c.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name(), metav1.GetOptions{})
		if err == nil && (lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != n.Name()) {
			err = fmt.Errorf("lease held by %v", lease.Spec.HolderIdentity)
		}
		return err
	})

	t.Run("DeploymentBehindAService", func(t *testing.T) { testDeployment(e.namespace(t, "deploy")) })
	t.Run("EnvironmentAndFiles", func(t *testing.T) { testEnvironment(e.namespace(t, "files")) })
	t.Run("StartAndStopOrder", func(t *testing.T) { testOrder(e.namespace(t, "order")) })
	t.Run("GracePeriodEndsInSIGKILL", func(t *testing.T) { testGracePeriod(e.namespace(t, "grace")) })
	t.Run("RestartPolicies", func(t *testing.T) { testRestarts(e.namespace(t, "restarts")) })
	t.Run("UnknownImage", func(t *testing.T) { testUnknownImage(e.namespace(t, "images")) })
	t.Run("MissingConfigMap", func(t *testing.T) { testMissingConfigMap(e.namespace(t, "late")) })
	t.Run("Probes", func(t *testing.T) { testProbes(e.namespace(t, "probes")) })
	t.Run("ProcessesDieWithTheNode", func(t *testing.T) { testNodeDeath(e.namespace(t, "death")) })
	t.Run("CloseLeavesNothing", func(t *testing.T) { testClose(e.namespace(t, "close"), bin) })
}

// A Deployment of echo behind a Service: two processes, Ready, in the Service's
// EndpointSlice, answering on their pod IPs; scaling down stops a process.
func testDeployment(e *env) {
	t := e.t
	labels := map[string]string{"app": "web"}
	_, err := e.kc.CoreV1().Services(e.ns).Create(e.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: labels,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	replicas := int32(2)
	_, err = e.kc.AppsV1().Deployments(e.ns).Create(e.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: int64p(5),
				Containers: []corev1.Container{{Name: "web", Image: "wasmesh/echo:latest",
					Args: []string{"--listen=$(POD_IP):8080", "--service=web"},
					Env: []corev1.EnvVar{
						{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
						{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}}}}}}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	pods := e.waitReplicas(2)
	for _, p := range pods {
		procs := e.processesOf(p.Name)
		require.Len(t, procs, 1, "pod %s runs one process", p.Name)
		assert.Equal(t, pid(t, &p, "web"), procs[0])
		assert.Equal(t, "echo", filepath.Base(commandOf(procs[0])[0]))
		answer := get(t, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/")
		assert.Equal(t, p.Name, answer.Pod, "the pod's own process answers on its pod IP")
		assert.Equal(t, "web", answer.Service)
	}
	e.checkEndpoints("web", pods)

	// Scaling down stops one pod's process; the other keeps serving.
	_, err = e.kc.AppsV1().Deployments(e.ns).Patch(e.ctx, "web", types.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	var gone, kept corev1.Pod
	e.waitFor(time.Minute, "one pod to be deleted", func() error {
		for _, p := range pods {
			if cur, err := e.kc.CoreV1().Pods(e.ns).Get(e.ctx, p.Name, metav1.GetOptions{}); err != nil || cur.DeletionTimestamp != nil {
				gone = p
			} else {
				kept = p
			}
		}
		if gone.Name == "" {
			return fmt.Errorf("no pod deleted")
		}
		return nil
	})
	e.waitGone(gone.Name)
	assert.Equal(t, kept.Name, get(t, "http://"+net.JoinHostPort(kept.Status.PodIP, "8080")+"/").Pod)
	e.checkEndpoints("web", []corev1.Pod{kept})

	require.NoError(t, e.kc.AppsV1().Deployments(e.ns).Delete(e.ctx, "web", metav1.DeleteOptions{}))
	e.waitGone(kept.Name)
}

// waitReplicas waits for n running, Ready pods of the app=web Deployment.
func (e *env) waitReplicas(n int) []corev1.Pod {
	var pods []corev1.Pod
	e.waitFor(2*time.Minute, fmt.Sprintf("%d Ready replicas", n), func() error {
		list, err := e.kc.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		pods = list.Items
		if len(pods) != n {
			return fmt.Errorf("%d pods", len(pods))
		}
		for i := range pods {
			if err := ready(&pods[i]); err != nil {
				return fmt.Errorf("%w: %s", err, statusSummary(&pods[i]))
			}
		}
		return nil
	})
	return pods
}

// checkEndpoints waits until the Service's EndpointSlices hold exactly the pods' IPs,
// where the pods' IPs can be in an EndpointSlice (see TestMain).
func (e *env) checkEndpoints(service string, pods []corev1.Pod) {
	if !inNetns() {
		msg := "EndpointSlice check skipped: the pods have loopback IPs, which the API server refuses in EndpointSlices (no network namespace for the tests)"
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			e.t.Error(msg)
		}
		e.t.Log(msg)
		return
	}
	e.waitEndpoints(service, pods)
}

// waitEndpoints waits until the Service's EndpointSlices hold exactly the pods' IPs, ready.
func (e *env) waitEndpoints(service string, pods []corev1.Pod) {
	var want []string
	for _, p := range pods {
		want = append(want, p.Status.PodIP)
	}
	slices.Sort(want)
	e.waitFor(time.Minute, "the EndpointSlice to hold "+fmt.Sprint(want), func() error {
		list, err := e.kc.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return err
		}
		var got []string
		var seen []string
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				seen = append(seen, fmt.Sprintf("%v ready=%v", ep.Addresses, ep.Conditions.Ready))
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					got = append(got, ep.Addresses...)
				}
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("ready endpoints %v; %d slices with %v", got, len(list.Items), seen)
		}
		return nil
	})
}

func get(t *testing.T, url string) echo.Answer {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	var a echo.Answer
	require.NoError(t, json.Unmarshal(b, &a), "%s", b)
	return a
}
