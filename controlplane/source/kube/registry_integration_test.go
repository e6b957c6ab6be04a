package kube

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// A Service with several ports, one a named targetPort the pods resolve differently, its
// pods on a node with topology labels, and the EndpointSlices the real controller makes:
// the service, each pod's endpoint on each port with its labels, service account,
// locality and network, and the pods as workloads.
func TestServicePodsAndControllerSlices(t *testing.T) {
	c := sharedCluster(t)
	kc := c.Client
	ns := namespace(t, c, map[string]string{labelNetwork: "net-1"})
	node := ns + "-node"
	createNode(t, kc, node, map[string]string{labelRegion: "r1", labelZone: "z1", labelSubzone: "s1"})
	r := startSource(t, c, Options{})
	ctx := context.Background()

	_, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"tier": "front"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{
			{Name: "http-web", Port: 80, TargetPort: intstr.FromString("web")},
			{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090)},
			{Name: "db", Port: 3306, AppProtocol: ptr.To("mysql")},
			{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP},
		}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	createPod(t, kc, ns, podSpec{name: "web-1", node: node, ip: "10.1.1.1", labels: map[string]string{"app": "web"}, ports: map[string]int32{"web": 8080}, ready: true})
	createPod(t, kc, ns, podSpec{name: "web-2", node: node, ip: "10.1.1.2", labels: map[string]string{"app": "web", labelLocality: "r2.z2"}, ports: map[string]int32{"web": 8081}, ready: true})

	host := hostIn("web", ns)
	r.rec.wait(t, time.Minute, "8 endpoints of "+host, func(r *recorder) bool { return len(r.endpoints[host]) == 8 })
	svc := r.rec.serviceOf(host)
	require.NotNil(t, svc)
	assert.Equal(t, model.ClientSideLB, svc.Resolution)
	assert.Len(t, svc.Addresses, 1)
	assert.Equal(t, []model.Port{
		{Name: "dns", Port: 53, TargetPort: 5353, Protocol: model.UDP},
		{Name: "http-web", Port: 80, TargetPortName: "web", Protocol: model.HTTP},
		{Name: "db", Port: 3306, TargetPort: 3306, Protocol: model.MySQL},
		{Name: "grpc", Port: 9090, TargetPort: 9090, Protocol: model.GRPC},
	}, svc.Ports)
	assert.Equal(t, map[string]string{"app": "web"}, svc.WorkloadSelector)
	assert.Equal(t, map[string]string{"tier": "front"}, svc.Labels)

	type got struct {
		addr                string
		port, svcPort       uint32
		locality, network   string
		sa, workload        string
		health              model.Health
		app, zone, hostname string
	}
	var eps []got
	for _, e := range r.rec.endpointsOf(host) {
		eps = append(eps, got{e.Address, e.Port, e.ServicePort, e.Locality, e.Network, e.ServiceAccount, e.Workload, e.Health,
			e.Labels["app"], e.Labels[labelZone], e.Labels[labelHostname]})
	}
	w1, w2 := "Pod "+ns+"/web-1", "Pod "+ns+"/web-2"
	assert.Equal(t, []got{
		{"10.1.1.1", 5353, 53, "r1/z1/s1", "net-1", "app", w1, model.Healthy, "web", "z1", node},
		{"10.1.1.2", 5353, 53, "r2/z2", "net-1", "app", w2, model.Healthy, "web", "z2", node},
		{"10.1.1.1", 8080, 80, "r1/z1/s1", "net-1", "app", w1, model.Healthy, "web", "z1", node},
		{"10.1.1.2", 8081, 80, "r2/z2", "net-1", "app", w2, model.Healthy, "web", "z2", node},
		{"10.1.1.1", 3306, 3306, "r1/z1/s1", "net-1", "app", w1, model.Healthy, "web", "z1", node},
		{"10.1.1.2", 3306, 3306, "r2/z2", "net-1", "app", w2, model.Healthy, "web", "z2", node},
		{"10.1.1.1", 9090, 9090, "r1/z1/s1", "net-1", "app", w1, model.Healthy, "web", "z1", node},
		{"10.1.1.2", 9090, 9090, "r2/z2", "net-1", "app", w2, model.Healthy, "web", "z2", node},
	}, eps)

	r.rec.wait(t, time.Minute, "the pods as workloads", func(r *recorder) bool { return r.workloads[ns+"/web-2"] != nil })
	r.rec.mu.Lock()
	w := *r.rec.workloads[ns+"/web-1"]
	r.rec.mu.Unlock()
	// The pod's own labels (Kubernetes copies the node's topology labels onto bound pods).
	assert.Equal(t, "web", w.Labels["app"])
	w.Labels = nil
	assert.Equal(t, model.Workload{Name: "web-1", Namespace: ns, IPs: []string{"10.1.1.1"},
		ServiceAccount: "app", Ports: map[string]uint32{"web": 8080}, Locality: "r1/z1/s1", Health: model.Healthy}, w)

	// A pod that is no longer ready: its endpoints become unhealthy (the controller marks
	// them not ready), its workload too; the service itself does not change.
	mark := r.rec.mark()
	setPodReady(t, kc, ns, "web-1", false)
	r.rec.wait(t, time.Minute, "web-1 unhealthy", func(r *recorder) bool {
		for _, e := range r.endpoints[host] {
			if e.Address == "10.1.1.1" && e.Health != model.Unhealthy {
				return false
			}
		}
		return r.workloads[ns+"/web-1"].Health == model.Unhealthy
	})
	for _, e := range r.rec.since(mark) {
		assert.NotEqual(t, "services", e.call, "a readiness change published %s", e)
	}

	// The node moves to another zone: the endpoints of its pods follow (not web-2, whose
	// own label names its locality).
	_, err = kc.CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(`{"metadata":{"labels":{"`+labelZone+`":"z9"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	r.rec.wait(t, time.Minute, "web-1 in zone z9", func(r *recorder) bool {
		for _, e := range r.endpoints[host] {
			if (e.Address == "10.1.1.1") != (e.Locality == "r1/z9/s1") {
				return false
			}
		}
		return r.workloads[ns+"/web-1"].Locality == "r1/z9/s1"
	})
}

// A headless Service (clusterIP None) is Passthrough, without addresses, with an endpoint
// per pod; a StatefulSet-style pod (hostname, subdomain) gets its own DNS name in the slice.
func TestHeadlessService(t *testing.T) {
	c := sharedCluster(t)
	kc := c.Client
	ns := namespace(t, c, nil)
	node := ns + "-node"
	createNode(t, kc, node, nil) // the EndpointSlice controller lists only pods on a known node
	r := startSource(t, c, Options{})
	ctx := context.Background()
	_, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": "db"},
			Ports: []corev1.ServicePort{{Name: "tcp-pg", Port: 5432}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	for i, ip := range []string{"10.1.2.1", "10.1.2.2"} {
		name := "db-" + string(rune('0'+i))
		createPod(t, kc, ns, podSpec{name: name, node: node, ip: ip, labels: map[string]string{"app": "db"}, hostname: name, subdomain: "db", ready: true})
	}
	host := hostIn("db", ns)
	r.rec.wait(t, time.Minute, "2 endpoints of "+host, func(r *recorder) bool { return len(r.endpoints[host]) == 2 })
	svc := r.rec.serviceOf(host)
	assert.Equal(t, model.Passthrough, svc.Resolution)
	assert.Empty(t, svc.Addresses)
	eps := r.rec.endpointsOf(host)
	assert.Equal(t, []string{"10.1.2.1", "10.1.2.2"}, []string{eps[0].Address, eps[1].Address})
	assert.Equal(t, []uint32{5432, 5432}, []uint32{eps[0].Port, eps[1].Port})

	slices, err := kc.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=db"})
	require.NoError(t, err)
	var hostnames []string
	for _, sl := range slices.Items {
		for _, e := range sl.Endpoints {
			hostnames = append(hostnames, deref(e.Hostname))
		}
	}
	assert.ElementsMatch(t, []string{"db-0", "db-1"}, hostnames, "db-0.db.%s.svc.cluster.local is the pod's own name", ns)
}

// An ExternalName Service resolves by DNS to its external name, outside the mesh.
func TestExternalNameService(t *testing.T) {
	c := sharedCluster(t)
	ns := namespace(t, c, nil)
	r := startSource(t, c, Options{})
	_, err := c.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "api"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "api.example.com",
			Ports: []corev1.ServicePort{{Name: "https", Port: 443}, {Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	host := hostIn("api", ns)
	r.rec.wait(t, time.Minute, "endpoints of "+host, func(r *recorder) bool { return len(r.endpoints[host]) == 2 })
	svc := r.rec.serviceOf(host)
	assert.Equal(t, model.DNSLB, svc.Resolution)
	assert.True(t, svc.MeshExternal)
	for _, e := range r.rec.endpointsOf(host) {
		assert.Equal(t, "api.example.com", e.Address)
		assert.Equal(t, e.ServicePort, e.Port)
	}
}

// A change of an EndpointSlice publishes the endpoints of its host and nothing else; a
// change the mesh does not read (an annotation), or a relist of everything, publishes
// nothing; a deleted Service goes with its endpoints.
func TestSliceChangeAndChangesThatChangeNothing(t *testing.T) {
	c := sharedCluster(t)
	kc := c.Client
	ns := namespace(t, c, nil)
	node := ns + "-node"
	createNode(t, kc, node, nil)
	r := startSource(t, c, Options{})
	ctx := context.Background()
	// A Service without selector: its slice is managed by hand, as a mesh-external
	// controller would.
	_, err := kc.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "manual"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "manual-1", Labels: map[string]string{discoveryv1.LabelServiceName: "manual", discoveryv1.LabelManagedBy: "test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.2.0.1"}, NodeName: ptr.To(node)}},
	}
	slice, err = kc.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	require.NoError(t, err)
	createPod(t, kc, ns, podSpec{name: "bystander", node: node, ip: "10.2.0.9", labels: map[string]string{"app": "x"}, ready: true})
	host := hostIn("manual", ns)
	r.rec.wait(t, time.Minute, "the endpoint of "+host, func(r *recorder) bool {
		return len(r.endpoints[host]) == 1 && r.workloads[ns+"/bystander"] != nil
	})
	assert.Equal(t, "EndpointSlice "+ns+"/manual-1", r.rec.endpointsOf(host)[0].Workload)

	mark := r.rec.mark()
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.2.0.2"}})
	_, err = kc.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
	require.NoError(t, err)
	r.rec.wait(t, time.Minute, "2 endpoints of "+host, func(r *recorder) bool { return len(r.endpoints[host]) == 2 })
	assert.Equal(t, []string{"endpoints " + host + " (2)"}, eventStrings(r.rec.since(mark)), "a slice change publishes its host's endpoints only")

	mark = r.rec.mark()
	annotate(t, patchService(kc, ns), "manual")
	annotate(t, patchSlice(kc, ns), "manual-1")
	annotate(t, patchPod(kc, ns), "bystander")
	r.src.touchAll() // what a relist queues
	sentinel(t, kc, r, ns, "sentinel-1")
	assert.Equal(t, []string{"services +" + hostIn("sentinel-1", ns)}, eventStrings(r.rec.since(mark)),
		"changes the mesh does not read, and a relist, publish nothing")

	mark = r.rec.mark()
	require.NoError(t, kc.CoreV1().Services(ns).Delete(ctx, "manual", metav1.DeleteOptions{}))
	r.rec.wait(t, time.Minute, host+" gone", func(r *recorder) bool { return r.services[host] == nil && r.endpoints[host] == nil })
	assert.Equal(t, []string{"services -" + host, "endpoints " + host + " (0)"}, eventStrings(r.rec.since(mark))[:2])
}
