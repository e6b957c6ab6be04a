package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// One object of each kind the source watches, as a user writes them (__NS__ is replaced by the
// test's namespace).
const everyKind = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: __NS__, labels: {app: reviews}}
spec:
  hosts: [reviews.__NS__.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP, targetPort: 8080}]
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: __NS__}
spec: {address: 10.3.0.1, labels: {app: reviews}, ports: {http: 8081}, serviceAccount: reviews, locality: r1/z1}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: __NS__, annotations: {owner: team-a}}
spec:
  hosts: [reviews]
  http:
  - match: [{uri: {prefix: /v2}}]
    route: [{destination: {host: reviews, subset: v2}}]
    timeout: 2.5s
    retries: {attempts: 3, perTryTimeout: 500ms, retryOn: 5xx}
  - route: [{destination: {host: reviews, subset: v1}, weight: 100}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: __NS__}
spec:
  host: reviews
  trafficPolicy:
    connectionPool: {tcp: {maxConnections: 10, connectTimeout: 1s}}
    outlierDetection: {consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: __NS__}
spec:
  egress: [{hosts: ["./*", "istio-system/*"]}]
  outboundTrafficPolicy: {mode: REGISTRY_ONLY}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua, namespace: __NS__}
spec:
  workloadSelector: {labels: {app: reviews}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_INBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: "function envoy_on_request(h) end"}
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: telemetry, namespace: __NS__}
spec:
  url: file:///etc/istio/extensions/telemetry.wasm
  phase: STATS
  priority: 10
  failStrategy: FAIL_OPEN
  pluginConfig: {metrics: [{name: requests_total}], max_label_sets_per_metric: 1000}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: namespace, namespace: __NS__}
spec:
  metrics:
  - overrides:
    - match: {metric: REQUEST_COUNT, mode: CLIENT_AND_SERVER}
      tagOverrides:
        request_path: {value: request.url_path}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: reviews, namespace: __NS__}
spec:
  selector: {matchLabels: {app: reviews}}
  mtls: {mode: STRICT}
  portLevelMtls:
    9080: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews, namespace: __NS__}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/__NS__/sa/productpage"]}}]
    to: [{operation: {methods: [GET]}}]
`

// apply creates (or replaces the spec of) the objects of a YAML file through the API
// server, as kubectl would.
func apply(t *testing.T, cfg *rest.Config, doc string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	ctx := context.Background()
	for _, d := range strings.Split(doc, "\n---\n") {
		var obj map[string]any
		require.NoError(t, yaml.Unmarshal([]byte(d), &obj))
		u := &unstructured.Unstructured{Object: obj}
		res := dyn.Resource(gvrOf(t, u.GetKind())).Namespace(u.GetNamespace())
		cur, err := res.Get(ctx, u.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = res.Create(ctx, u, metav1.CreateOptions{})
		case err == nil:
			cur.Object["spec"] = u.Object["spec"]
			_, err = res.Update(ctx, cur, metav1.UpdateOptions{})
		}
		require.NoError(t, err, "applying %s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
	}
}

func gvrOf(t *testing.T, kind string) schema.GroupVersionResource {
	t.Helper()
	k := findKind(config.Kind(kind))
	require.NotNil(t, k, kind)
	return schema.GroupVersionResource{Group: k.group, Version: k.version, Resource: k.resource}
}

// Every kind applied to the API server becomes the config the directory parser makes of
// the same YAML.
func TestEveryIstioKindAsTheDirectoryParsesIt(t *testing.T) {
	c := sharedCluster(t)
	ns := namespace(t, c, nil)
	r := startSource(t, c, Options{})
	doc := strings.ReplaceAll(everyKind, "__NS__", ns)
	apply(t, c.Config, doc)
	docs := config.ParseFile("every-kind.yaml", []byte(doc))
	require.Len(t, docs, len(DefaultIstioKinds()))
	for _, d := range docs {
		require.Nil(t, d.Err)
		want := d.Config
		r.rec.wait(t, time.Minute, want.Key().String(), func(r *recorder) bool { return r.configs[want.Key()] != nil })
		got := r.rec.configOf(want.Key())
		assert.True(t, got.Equal(want), "%s: got %v\nwant %v", want.Key(), got.Spec, want.Spec)
		assert.True(t, proto.Equal(got.Spec, want.Spec), want.Key().String())
		assert.Equal(t, "kubernetes: "+want.Key().String(), got.Source)
		assert.False(t, got.Created.IsZero(), "%s: the object's creationTimestamp", want.Key())
	}
	assert.Equal(t, "team-a", r.rec.configOf(config.Key{Kind: config.VirtualService, Namespace: ns, Name: "reviews"}).Annotations["owner"])
	for _, st := range r.src.Status() {
		if st.Namespace == ns {
			assert.Equal(t, StatusApplied, st.Status, "%+v", st)
		}
	}
}

// waitObject returns once cond holds for the object, watching it (no polling).
func waitObject(t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns, name, what string, cond func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := dyn.Resource(gvr).Namespace(ns)
	cur, err := res.Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	if cond(cur) {
		return cur
	}
	w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: cur.GetResourceVersion()})
	require.NoError(t, err)
	defer w.Stop()
	for ev := range w.ResultChan() {
		if u, ok := ev.Object.(*unstructured.Unstructured); ok {
			cur = u
			if cond(u) {
				return u
			}
		}
	}
	t.Fatalf("%s/%s: %s: not within a minute; last status: %v", ns, name, what, cur.Object["status"])
	return nil
}

// schemaMessage finds the writer's condition message and whether IST0106 is listed.
func schemaMessage(u *unstructured.Unstructured) (message string, listed bool, generation string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == conditionAccepted && m["reason"] == reasonSchemaInvalid {
			message, _ = m["message"].(string)
			generation = fmt.Sprint(m["observedGeneration"])
		}
	}
	msgs, _, _ := unstructured.NestedSlice(u.Object, "status", "validationMessages")
	for _, v := range msgs {
		m, _ := v.(map[string]any)
		if typ, _ := m["type"].(map[string]any); typ["code"] == messageCodeSchema && m["level"] == "ERROR" {
			listed = true
		}
	}
	return message, listed, generation
}

const goodVS = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: __NS__}
spec:
  hosts: [reviews]
  http: [{route: [{destination: {host: reviews, subset: ROUTE}}]}]
`

// tcp routes: the CRD schema admits them, the validator does not (only http routes are
// translated).
const badVS = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: NAME, namespace: __NS__}
spec:
  hosts: [reviews]
  tcp: [{route: [{destination: {host: reviews}}]}]
`

// An object the CRD admits but the validator rejects is reported, with the field named as
// the directory parser names it; the last good version of it stays in force (no delete is
// published); its status says so in Istio's shape once the writer is enabled; and fixed, it
// applies and its status is cleared.
func TestRejectedObjectKeepsLastGoodAndGetsStatus(t *testing.T) {
	c := sharedCluster(t)
	ns := namespace(t, c, nil)
	r := startSource(t, c, Options{}) // the status writer starts disabled
	vsGVR := gvrOf(t, "VirtualService")
	key := config.Key{Kind: config.VirtualService, Namespace: ns, Name: "reviews"}
	good := func(subset string) string {
		return strings.ReplaceAll(strings.ReplaceAll(goodVS, "__NS__", ns), "ROUTE", subset)
	}
	parsed := func(doc string) *config.Config {
		d := config.ParseFile("vs.yaml", []byte(doc))
		require.Nil(t, d[0].Err)
		return d[0].Config
	}
	apply(t, c.Config, good("v1"))
	v1 := parsed(good("v1"))
	r.rec.wait(t, time.Minute, "reviews v1", func(r *recorder) bool { return r.configs[key] != nil && r.configs[key].Equal(v1) })

	mark := r.rec.mark()
	bad := strings.ReplaceAll(strings.ReplaceAll(badVS, "__NS__", ns), "NAME", "reviews")
	apply(t, c.Config, bad)
	rejected := r.logs.waitFor(t, time.Minute, "reviews rejected", func(l logRecord) bool {
		return l.msg == "Istio config rejected" && l.attrs["config"] == key.String()
	})
	want := config.ParseFile("vs.yaml", []byte(bad))[0].Err
	require.NotNil(t, want)
	assert.Equal(t, "spec.tcp", want.Field)
	assert.Equal(t, "kubernetes: "+key.String()+": spec.tcp: "+want.Err.Error(), rejected.attrs["error"])
	assert.Equal(t, ObjectStatus{Kind: key.Kind, Namespace: ns, Name: "reviews", Status: StatusRejectedKept, Error: rejected.attrs["error"]}, statusOf(r.src, key))
	sentinel(t, c.Client, r, ns, "sentinel-1")
	assert.True(t, r.rec.configOf(key).Equal(v1), "the last good version stays in force")
	assert.Equal(t, []string{"services +" + hostIn("sentinel-1", ns)}, eventStrings(r.rec.since(mark)), "nothing published for the rejected version")
	u := waitObject(t, c.Config, vsGVR, ns, "reviews", "current", func(*unstructured.Unstructured) bool { return true })
	_, listed, _ := schemaMessage(u)
	assert.False(t, listed, "a disabled writer writes nothing")
	assert.Zero(t, r.src.writer.queued.Load(), "a disabled writer queues nothing (the sentinel's batch came after the rejection's)")

	// This replica leads: the outcome it holds is written.
	r.src.StatusWriter().SetEnabled(true)
	u = waitObject(t, c.Config, vsGVR, ns, "reviews", "status written", func(u *unstructured.Unstructured) bool {
		msg, listed, _ := schemaMessage(u)
		return listed && msg != ""
	})
	t.Logf("status written: %v", u.Object["status"])
	msg, _, gen := schemaMessage(u)
	assert.Equal(t, rejected.attrs["error"], msg)
	assert.Equal(t, fmt.Sprint(u.GetGeneration()), gen)

	// A new object that is wrong from the start: rejected, never published, status written.
	apply(t, c.Config, strings.ReplaceAll(strings.ReplaceAll(badVS, "__NS__", ns), "NAME", "broken"))
	waitObject(t, c.Config, vsGVR, ns, "broken", "status written", func(u *unstructured.Unstructured) bool {
		_, listed, _ := schemaMessage(u)
		return listed
	})
	brokenKey := config.Key{Kind: config.VirtualService, Namespace: ns, Name: "broken"}
	assert.Equal(t, StatusRejected, statusOf(r.src, brokenKey).Status)
	assert.Nil(t, r.rec.configOf(brokenKey))

	// Fixed: the new version applies and the status no longer carries the error.
	apply(t, c.Config, good("v2"))
	v2 := parsed(good("v2"))
	r.rec.wait(t, time.Minute, "reviews v2", func(r *recorder) bool { return r.configs[key].Equal(v2) })
	waitObject(t, c.Config, vsGVR, ns, "reviews", "status cleared", func(u *unstructured.Unstructured) bool {
		msg, listed, _ := schemaMessage(u)
		return !listed && msg == ""
	})
	assert.Equal(t, StatusApplied, statusOf(r.src, key).Status)
}

func statusOf(s *Source, key config.Key) ObjectStatus {
	for _, st := range s.Status() {
		if st.Kind == key.Kind && st.Namespace == key.Namespace && st.Name == key.Name {
			return st
		}
	}
	return ObjectStatus{}
}
