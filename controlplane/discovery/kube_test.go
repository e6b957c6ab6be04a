package discovery_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// discovery serving from a real API server: a Service, its pods and the EndpointSlices the
// real controller makes become a cluster with endpoints; a VirtualService applied with the
// API changes the routes proxies get, and a broken one is reported with its field while the
// last good stays.
func TestDiscoveryServesKubernetes(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{ControllerManager: true}, "VirtualService")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kc := c.Client
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kc.CoreV1().ServiceAccounts("demo").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}, time.Minute, 50*time.Millisecond, "the namespace's default ServiceAccount")
	_, err = kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kc.CoreV1().Services("demo").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "backend"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 9081, TargetPort: intstr.FromInt32(8081)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod, err := kc.CoreV1().Pods("demo").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "backend-1", Labels: map[string]string{"app": "backend"}},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "echo"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.7", PodIPs: []corev1.PodIP{{IP: "10.1.0.7"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = kc.CoreV1().Pods("demo").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)

	e := start(t, nil, func(o *discovery.Options) { o.ConfigDir, o.Kube, o.KubeStatus = "", c.Config, true })
	const cluster = "outbound|9081||backend.demo.svc.cluster.local"
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, hasEndpointIP(cluster, "10.1.0.7"))
	wait(t, fe, has(adsc.RouteType, "9081"))

	vs := dynamic.NewForConfigOrDie(c.Config).Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}).Namespace("demo")
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": "backend", "namespace": "demo"},
		"spec": map[string]any{"hosts": []any{"backend.demo.svc.cluster.local"},
			"http": []any{map[string]any{"timeout": "7s", "route": []any{map[string]any{"destination": map[string]any{"host": "backend.demo.svc.cluster.local"}}}}}},
	}}
	_, err = vs.Create(ctx, obj, metav1.CreateOptions{})
	require.NoError(t, err)
	timeout := func(c *adsc.Client) time.Duration {
		var rc route.RouteConfiguration
		if !c.Resource(adsc.RouteType, "9081", &rc) {
			return 0
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if d := r.GetRoute().GetTimeout(); d != nil && strings.HasPrefix(vh.GetName(), "backend.demo") {
					return d.AsDuration()
				}
			}
		}
		return 0
	}
	wait(t, fe, func(c *adsc.Client) bool { return timeout(c) == 7*time.Second })

	// A VirtualService the schema admits but the validator refuses (a negative weight): the
	// last good stays in force, and the page says why, naming the field.
	cur, err := vs.Get(ctx, "backend", metav1.GetOptions{})
	require.NoError(t, err)
	cur.Object["spec"] = map[string]any{"hosts": []any{"backend.demo.svc.cluster.local"},
		"http": []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "backend.demo.svc.cluster.local"}, "weight": -5}}}}}
	_, err = vs.Update(ctx, cur, metav1.UpdateOptions{})
	require.NoError(t, err)
	var page struct {
		Objects []struct{ Kind, Namespace, Name, Status, Error string } `json:"objects"`
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + e.d.HTTPAddr() + "/debug/configz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &page) != nil {
			return false
		}
		for _, o := range page.Objects {
			if o.Name == "backend" && strings.HasPrefix(o.Status, "rejected") {
				return true
			}
		}
		return false
	}, time.Minute, 50*time.Millisecond, "the rejected VirtualService on /debug/configz")
	for _, o := range page.Objects {
		if o.Name == "backend" {
			assert.Equal(t, "rejected (last good kept)", o.Status)
			assert.Contains(t, o.Error, "weight")
		}
	}
	assert.Equal(t, 7*time.Second, timeout(fe), "the last good VirtualService stays in force")
}
