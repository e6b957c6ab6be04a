package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// podSpec is a pod the tests make: no kubelet runs, so its status (address, readiness) is
// set by hand, as the kubelet would.
type podSpec struct {
	name, node, ip      string
	labels              map[string]string
	ports               map[string]int32 // named container ports
	hostname, subdomain string
	ready               bool
}

func createNode(t *testing.T, kc kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	_, err := kc.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func createPod(t *testing.T, kc kubernetes.Interface, ns string, p podSpec) {
	t.Helper()
	ctx := context.Background()
	c := corev1.Container{Name: "app", Image: "app"}
	for n, port := range p.ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: n, ContainerPort: port})
	}
	pod, err := kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: p.labels},
		Spec: corev1.PodSpec{NodeName: p.node, ServiceAccountName: "app", Hostname: p.hostname, Subdomain: p.subdomain,
			Containers: []corev1.Container{c}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	setPodStatus(t, kc, pod, p.ip, p.ready)
}

func setPodStatus(t *testing.T, kc kubernetes.Interface, pod *corev1.Pod, ip string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}
	_, err := kc.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func setPodReady(t *testing.T, kc kubernetes.Interface, ns, name string, ready bool) {
	t.Helper()
	pod, err := kc.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	setPodStatus(t, kc, pod, pod.Status.PodIP, ready)
}

// annotate changes only an annotation of an object: its resourceVersion, nothing the mesh
// reads.
func annotate(t *testing.T, patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) error, name string) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"test/touched":%q}}}`, time.Now().Format(time.RFC3339Nano))
	require.NoError(t, patch(context.Background(), name, types.MergePatchType, []byte(body), metav1.PatchOptions{}))
}

// sentinel creates a Service in ns and waits for the source to publish it: every change
// made before it has been published by then (one source publishes in order).
func sentinel(t *testing.T, kc kubernetes.Interface, r *running, ns, name string) {
	t.Helper()
	_, err := kc.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 1}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	host := hostIn(name, ns)
	r.rec.wait(t, time.Minute, "the sentinel "+host, func(r *recorder) bool { return r.services[host] != nil })
}

func patchService(kc kubernetes.Interface, ns string) func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) error {
	return func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) error {
		_, err := kc.CoreV1().Services(ns).Patch(ctx, name, pt, data, opts, sub...)
		return err
	}
}

func patchPod(kc kubernetes.Interface, ns string) func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) error {
	return func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) error {
		_, err := kc.CoreV1().Pods(ns).Patch(ctx, name, pt, data, opts, sub...)
		return err
	}
}

func patchSlice(kc kubernetes.Interface, ns string) func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) error {
	return func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) error {
		_, err := kc.DiscoveryV1().EndpointSlices(ns).Patch(ctx, name, pt, data, opts, sub...)
		return err
	}
}
