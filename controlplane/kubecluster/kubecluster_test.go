package kubecluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The control plane is real: the service-account controller makes each namespace's
// default ServiceAccount, and the EndpointSlice controller turns a ready pod behind a
// Service into an endpoint.
func TestControllersMakeServiceAccountsAndEndpointSlices(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{ControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc := c.Client

	require.Eventually(t, func() bool {
		_, err := kc.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}, time.Minute, 100*time.Millisecond, "the default ServiceAccount\n%s", c.LogTail("kube-controller-manager", 2000))

	_, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := kc.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = kc.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		slices, err := kc.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
		if err != nil {
			return false
		}
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if len(ep.Addresses) == 1 && ep.Addresses[0] == "10.1.0.7" && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					return true
				}
			}
		}
		return false
	}, time.Minute, 100*time.Millisecond, "an EndpointSlice with the pod's address\n%s", c.LogTail("kube-controller-manager", 2000))
}

// The API server can be stopped and started again on the same port and data.
func TestAPIServerRestarts(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	c.StopAPIServer()
	_, err = c.Client.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{})
	require.Error(t, err, "the API server is down")
	require.NoError(t, c.StartAPIServer(ctx))
	_, err = c.Client.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{})
	require.NoError(t, err, "what was stored before the restart is there after it")
}
