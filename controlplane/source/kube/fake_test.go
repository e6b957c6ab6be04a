package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiofake "istio.io/client-go/pkg/clientset/versioned/fake"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// fakeCluster is a source on client-go's fake clientsets: no API server, for what needs
// many objects fast. Every Istio kind is served.
type fakeCluster struct {
	kube  *kubefake.Clientset
	istio *istiofake.Clientset
	src   *Source
	rec   *recorder
}

func startFake(t testing.TB, kubeObjs, istioObjs []runtime.Object) *fakeCluster {
	t.Helper()
	// The fake clientsets cannot stream a list (Istio's generated informers do not tell the
	// reflector so): list and watch instead.
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
	f := &fakeCluster{kube: kubefake.NewClientset(kubeObjs...), istio: istiofake.NewSimpleClientset(istioObjs...), rec: newRecorder()}
	disc := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
	byGV := map[string]*metav1.APIResourceList{}
	for _, k := range istioKinds {
		l := byGV[k.apiVersion()]
		if l == nil {
			l = &metav1.APIResourceList{GroupVersion: k.apiVersion()}
			byGV[k.apiVersion()] = l
			disc.Resources = append(disc.Resources, l)
		}
		l.APIResources = append(l.APIResources, metav1.APIResource{Name: k.resource, Kind: string(k.kind), Namespaced: true})
	}
	src, err := newSource(Options{Log: newTestLogger(t)}, f.kube, f.istio, nil)
	require.NoError(t, err)
	f.src = src
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, f.rec) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	f.rec.wait(t, 2*time.Minute, "synced", func(r *recorder) bool { return r.synced })
	return f
}

// podsBehindService makes a Service web in ns "shop" with n ready pods, listed by the
// EndpointSlice controller's way: slices of up to 100 endpoints.
func podsBehindService(n int) []runtime.Object {
	objs := []runtime.Object{&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}}
	var slice *discoveryv1.EndpointSlice
	for i := range n {
		ip := fmt.Sprintf("10.%d.%d.%d", 1+i/65536, (i/256)%256, i%256)
		name := fmt.Sprintf("web-%d", i)
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{ServiceAccountName: "web"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		})
		if i%100 == 0 {
			slice = &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("web-%05d", i/100), Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			}
			objs = append(objs, slice)
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: name}})
	}
	return objs
}

func virtualServices(n int) []runtime.Object {
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, &networkingv1.VirtualService{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vs-%d", i), Namespace: "shop"},
			Spec: networkingv1alpha3.VirtualService{Hosts: []string{fmt.Sprintf("svc-%d", i)}, Http: []*networkingv1alpha3.HTTPRoute{{
				Route: []*networkingv1alpha3.HTTPRouteDestination{{Destination: &networkingv1alpha3.Destination{Host: fmt.Sprintf("svc-%d", i)}}},
			}}},
		})
	}
	return objs
}

// 10,000 pods behind one Service and 10,000 VirtualServices: the initial state is one
// batch (one event of each kind, the host's endpoints computed once), not one event per
// object; work that grew with the square of the objects would not finish in time.
func TestTenThousandObjectsOfOneKindPublishOnce(t *testing.T) {
	const n = 10000
	f := startFake(t, podsBehindService(n), virtualServices(n))
	evs := f.rec.since(0)
	var calls []string
	for _, e := range evs {
		calls = append(calls, e.call)
	}
	require.Equal(t, []string{"configs", "services", "endpoints", "workloads", "synced"}, calls)
	require.Len(t, evs[0].configs.Updated, n)
	require.Len(t, evs[1].services.Updated, 1)
	require.Equal(t, "web.shop.svc.cluster.local", evs[2].endpoints.Host)
	require.Len(t, evs[2].endpoints.Endpoints, n)
	require.Len(t, evs[3].workloads.Updated, n)
	require.Len(t, f.src.Status(), n)

	// Everything queued again, as a relist would: nothing differs, nothing is published.
	mark := f.rec.mark()
	f.src.touchAll()
	f.sentinel(t)
	require.Equal(t, []string{"services +sentinel.shop.svc.cluster.local"}, eventStrings(f.rec.since(mark)))
}

// sentinel creates a Service and waits for it: every change queued before it has been
// published by then.
func (f *fakeCluster) sentinel(t testing.TB) {
	t.Helper()
	_, err := f.kube.CoreV1().Services("shop").Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sentinel", Namespace: "shop"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.9.9"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	f.rec.wait(t, time.Minute, "the sentinel service", func(r *recorder) bool { return r.services["sentinel.shop.svc.cluster.local"] != nil })
}

func eventStrings(evs []event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.String())
	}
	return out
}

// touchAll queues every object the informers hold, as a relist's updates would.
func (s *Source) touchAll() {
	for _, ix := range []struct {
		res resource
		i   interface{ ListKeys() []string }
	}{{resService, s.listers.services}, {resPod, s.listers.pods}, {resNode, s.listers.nodes}, {resNamespace, s.listers.namespaces}} {
		for _, k := range ix.i.ListKeys() {
			ns, name := splitKey(k)
			s.q.add(ref{res: ix.res, ns: ns, name: name})
		}
	}
	for kind, w := range s.watched {
		for _, k := range w.informer.GetIndexer().ListKeys() {
			ns, name := splitKey(k)
			s.q.add(ref{res: resConfig, kind: kind, ns: ns, name: name})
		}
	}
}

func splitKey(k string) (string, string) {
	for i := range k {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return "", k
}

var _ = config.VirtualService
