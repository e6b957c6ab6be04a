package kube

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Protocols as Istio's kube.ConvertProtocol picks them.
func TestPortProtocol(t *testing.T) {
	cases := []struct {
		port corev1.ServicePort
		want model.Protocol
	}{
		{corev1.ServicePort{Name: "http-web"}, model.HTTP},
		{corev1.ServicePort{Name: "HTTP2"}, model.HTTP2},
		{corev1.ServicePort{Name: "grpc"}, model.GRPC},
		{corev1.ServicePort{Name: "grpc-web"}, model.GRPCWeb},
		{corev1.ServicePort{Name: "grpc-web-x"}, model.GRPCWeb},
		{corev1.ServicePort{Name: "https"}, model.HTTPS},
		{corev1.ServicePort{Name: "tls-db"}, model.TLS},
		{corev1.ServicePort{Name: "mongo"}, model.Mongo},
		{corev1.ServicePort{Name: "redis-cache"}, model.Redis},
		{corev1.ServicePort{Name: "mysql"}, model.MySQL},
		{corev1.ServicePort{Name: "db"}, model.TCP},
		{corev1.ServicePort{Name: ""}, model.TCP},
		{corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolUDP}, model.UDP},
		{corev1.ServicePort{Name: "db", AppProtocol: ptr.To("http")}, model.HTTP},
		{corev1.ServicePort{Name: "http", AppProtocol: ptr.To("grpc")}, model.GRPC},
		{corev1.ServicePort{Name: "web", AppProtocol: ptr.To("kubernetes.io/h2c")}, model.HTTP2},
		{corev1.ServicePort{Name: "web", AppProtocol: ptr.To("kubernetes.io/ws")}, model.HTTP},
		{corev1.ServicePort{Name: "web", AppProtocol: ptr.To("kubernetes.io/wss")}, model.HTTPS},
		{corev1.ServicePort{Name: "http", AppProtocol: ptr.To("example.com/custom")}, model.TCP},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, portProtocol(c.port), "%+v", c.port)
	}
}

func TestServiceOf(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{annotationExportTo: " ., istio-system "}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00::1"}, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9091)},
				{Name: "http", Port: 80, TargetPort: intstr.FromString("web")},
			}},
	}
	assert.Equal(t, &model.Service{
		Hostname: "web.shop.svc.example.org", Namespace: "shop", Name: "web", Addresses: []string{"10.96.0.1", "fd00::1"},
		Ports:      []model.Port{{Name: "http", Port: 80, TargetPortName: "web", Protocol: model.HTTP}, {Name: "grpc", Port: 9090, TargetPort: 9091, Protocol: model.GRPC}},
		Resolution: model.ClientSideLB, ExportTo: []string{".", "istio-system"}, Labels: map[string]string{"app": "web"},
		WorkloadSelector: map[string]string{"app": "web"}, Source: "kubernetes: Service shop/web",
	}, serviceOf(svc, "example.org"))

	headless := svc.DeepCopy()
	headless.Spec.ClusterIP, headless.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	hs := serviceOf(headless, "cluster.local")
	assert.Equal(t, model.Passthrough, hs.Resolution)
	assert.Empty(t, hs.Addresses)

	ext := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "api.example.com", Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}}
	es := serviceOf(ext, "cluster.local")
	assert.Equal(t, model.DNSLB, es.Resolution)
	assert.True(t, es.MeshExternal)
	assert.Nil(t, es.WorkloadSelector)
	assert.Equal(t, []*model.Endpoint{{Address: "api.example.com", Port: 443, ServicePort: 443, Workload: "Service shop/api", Namespace: "shop"}},
		endpointsOf(ext, es, nil, endpointFacts{}))
}

// Health as Istio reads endpoint conditions: draining only for persistent sessions.
func TestEndpointHealth(t *testing.T) {
	plain := &corev1.Service{}
	sticky := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{labelPersistentSession: "cookie"}}}
	cond := func(ready, serving, terminating *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	}
	yes, no := ptr.To(true), ptr.To(false)
	assert.Equal(t, model.Healthy, endpointHealth(plain, cond(nil, nil, nil)))
	assert.Equal(t, model.Healthy, endpointHealth(plain, cond(yes, yes, no)))
	assert.Equal(t, model.Unhealthy, endpointHealth(plain, cond(no, no, no)))
	assert.Equal(t, model.Unhealthy, endpointHealth(plain, cond(no, yes, yes)))
	assert.Equal(t, model.Draining, endpointHealth(sticky, cond(no, yes, yes)))
	assert.Equal(t, model.Unhealthy, endpointHealth(sticky, cond(no, no, yes)))
	assert.Equal(t, model.Unhealthy, endpointHealth(sticky, cond(no, yes, no)))
}

// An address two slices list (while they are rebalanced) is one endpoint, its best health;
// an endpoint of a pod not known yet waits for the pod.
func TestEndpointsOfDeduplicatesAndWaitsForPods(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	ms := serviceOf(svc, "cluster.local")
	slice := func(name string, ready bool, pods ...string) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("other"), Port: ptr.To[int32](1)}}}
		for _, p := range pods {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.1.0." + p[len(p)-1:]},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: p}})
		}
		return sl
	}
	known := map[string]*podFacts{"web-1": {serviceAccount: "web", labels: map[string]string{"app": "web"}}, "web-2": {serviceAccount: "web"}}
	look := endpointFacts{pod: func(_, name string) *podFacts { return known[name] }, node: func(string) string { return "" }}
	eps := endpointsOf(svc, ms, []*discoveryv1.EndpointSlice{slice("b", true, "web-1"), slice("a", false, "web-1", "web-2", "web-3")}, look)
	assert.Equal(t, []*model.Endpoint{
		{Address: "10.1.0.1", Port: 8080, ServicePort: 80, Labels: map[string]string{"app": "web"}, ServiceAccount: "web", Health: model.Healthy, Workload: "Pod shop/web-1", Namespace: "shop"},
		{Address: "10.1.0.2", Port: 8080, ServicePort: 80, ServiceAccount: "web", Health: model.Unhealthy, Workload: "Pod shop/web-2", Namespace: "shop"},
	}, eps)
}
