package kube

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The API server stops and starts again: the informers recover by themselves, nothing is
// published for the outage (no delete, no relist churn), and a change made right after the
// restart arrives.
func TestAPIServerRestartLosesNothing(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{}, testCRDKinds...)
	kc := c.Client
	ctx := context.Background()
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = kc.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.4.0.1"}}},
	}
	slice, err = kc.DiscoveryV1().EndpointSlices("shop").Create(ctx, slice, metav1.CreateOptions{})
	require.NoError(t, err)
	apply(t, c.Config, strings.ReplaceAll(strings.ReplaceAll(goodVS, "__NS__", "shop"), "ROUTE", "v1"))
	r := startSource(t, c, Options{})
	host := hostIn("web", "shop")
	vsKey := config.Key{Kind: config.VirtualService, Namespace: "shop", Name: "reviews"}
	r.rec.wait(t, time.Minute, "state", func(r *recorder) bool { return len(r.endpoints[host]) == 1 && r.configs[vsKey] != nil })

	mark := r.rec.mark()
	c.StopAPIServer()
	r.logs.waitFor(t, time.Minute, "the outage logged", func(l logRecord) bool {
		return strings.HasPrefix(l.msg, "lost the Kubernetes API server") && l.attrs["server"] == c.Server()
	})
	require.NoError(t, c.StartAPIServer(ctx))
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.4.0.2"}})
	_, err = kc.DiscoveryV1().EndpointSlices("shop").Update(ctx, slice, metav1.UpdateOptions{})
	require.NoError(t, err)
	apply(t, c.Config, strings.ReplaceAll(strings.ReplaceAll(goodVS, "__NS__", "shop"), "ROUTE", "v2"))
	v2 := config.ParseFile("vs.yaml", []byte(strings.ReplaceAll(strings.ReplaceAll(goodVS, "__NS__", "shop"), "ROUTE", "v2")))[0].Config
	r.rec.wait(t, 2*time.Minute, "the changes made after the restart", func(r *recorder) bool {
		return len(r.endpoints[host]) == 2 && r.configs[vsKey].Equal(v2)
	})
	sentinel(t, kc, r, "shop", "sentinel-1")
	r.logs.waitFor(t, time.Minute, "the return logged", func(l logRecord) bool { return l.msg == "Kubernetes API server reachable again" })
	// The slice and the VirtualService are watched by different informers: either may come
	// first. The sentinel, made once both had arrived, comes last.
	events := eventStrings(r.rec.since(mark))
	require.Len(t, events, 3, "the changes, each once, and nothing for the outage: %v", events)
	assert.ElementsMatch(t, []string{"endpoints " + host + " (2)", "configs +" + vsKey.String()}, events[:2])
	assert.Equal(t, "services +"+hostIn("sentinel-1", "shop"), events[2])
}

// A kind whose CRD is not installed is skipped with one warning; the others are served and
// the source syncs; once the CRD is installed the kind is watched.
func TestMissingCRDSkippedThenWatched(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{}, "VirtualService")
	r := startSource(t, c, Options{IstioKinds: []config.Kind{config.VirtualService, config.Telemetry}})
	warned := func(l logRecord) bool {
		return strings.HasPrefix(l.msg, "Istio CRD not installed") && l.attrs["crd"] == "telemetries.telemetry.istio.io"
	}
	assert.Equal(t, 1, r.logs.count(warned))
	apply(t, c.Config, strings.ReplaceAll(strings.ReplaceAll(goodVS, "__NS__", "default"), "ROUTE", "v1"))
	r.rec.wait(t, time.Minute, "the VirtualService", func(r *recorder) bool {
		return r.configs[config.Key{Kind: config.VirtualService, Namespace: "default", Name: "reviews"}] != nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.InstallIstioCRDs(ctx, "Telemetry"))
	r.logs.waitFor(t, time.Minute, "Telemetry watched", func(l logRecord) bool {
		return strings.HasPrefix(l.msg, "Istio CRD installed") && l.attrs["kind"] == "Telemetry"
	})
	apply(t, c.Config, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: mesh, namespace: default}
spec: {metrics: [{overrides: [{match: {metric: REQUEST_SIZE}, disabled: true}]}]}`)
	r.rec.wait(t, time.Minute, "the Telemetry", func(r *recorder) bool {
		return r.configs[config.Key{Kind: config.Telemetry, Namespace: "default", Name: "mesh"}] != nil
	})
	assert.Equal(t, 1, r.logs.count(warned), "warned once")
}

// An API server nobody answers at: the source logs an error naming the address, keeps
// trying, does not sync, and stops cleanly.
func TestUnreachableAPIServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	host := "https://" + addr
	r := runSource(t, &rest.Config{Host: host, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, Options{})
	rec := r.logs.waitFor(t, time.Minute, "the error", func(l logRecord) bool {
		return l.msg == "Kubernetes API server unavailable; retrying"
	})
	assert.Equal(t, host, rec.attrs["server"])
	assert.Contains(t, rec.attrs["error"], addr)
	r.logs.waitFor(t, time.Minute, "a retry", func(l logRecord) bool { return l.attrs["attempt"] == "2" })
	assert.False(t, r.rec.isSynced())
}

// Without RBAC permission on a resource the source needs, the error names the resource and
// the verb, and the source does not claim to be synced.
func TestForbiddenResourceNamed(t *testing.T) {
	c := sharedCluster(t)
	ctx := context.Background()
	user := "limited-" + namespace(t, c, nil)
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "pods", "nodes", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"networking.istio.io", "extensions.istio.io", "telemetry.istio.io", "security.istio.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		// no endpointslices
	}
	_, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	r := runSource(t, cfg, Options{})
	rec := r.logs.waitFor(t, time.Minute, "forbidden", func(l logRecord) bool { return strings.HasPrefix(l.msg, "forbidden") })
	assert.Equal(t, "endpointslices.discovery.k8s.io", rec.attrs["resource"])
	assert.Contains(t, rec.msg, "list and watch endpointslices.discovery.k8s.io")
	assert.Contains(t, rec.attrs["error"], `cannot list resource "endpointslices"`)
	assert.False(t, r.rec.isSynced())
}
