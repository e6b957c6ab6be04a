package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
)

// objects decodes every manifest strictly into Kubernetes' own types (an unknown or
// misspelt field is an error naming the file), by "Kind/name".
func objects(t *testing.T) map[string]runtime.Object {
	t.Helper()
	ms, err := Manifests()
	require.NoError(t, err)
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	out := map[string]runtime.Object{}
	for _, m := range ms {
		r := utilyaml.NewYAMLReader(bufioReader(m.Data))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, m.Name)
			obj, gvk, err := decoder.Decode(doc, nil, nil)
			require.NoError(t, err, m.Name)
			name := obj.(interface{ GetName() string }).GetName()
			key := gvk.Kind + "/" + name
			require.NotContains(t, out, key, m.Name)
			out[key] = obj
		}
	}
	return out
}

func object[T runtime.Object](t *testing.T, objs map[string]runtime.Object, key string) T {
	t.Helper()
	o, ok := objs[key].(T)
	require.True(t, ok, "no %s among the manifests (%v)", key, keysOf(objs))
	return o
}

func keysOf(objs map[string]runtime.Object) []string {
	var out []string
	for k := range objs {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestManifestsAreWhatTheIssueAsksFor(t *testing.T) {
	objs := objects(t)
	assert.Equal(t, []string{
		"ClusterRole/istiod-clusterrole-istio-system", "ClusterRoleBinding/istiod-clusterrole-istio-system",
		"ConfigMap/istio", "ConfigMap/istio-sidecar-injector", "Deployment/istiod",
		"MutatingWebhookConfiguration/istio-sidecar-injector", "Namespace/istio-system", "PodDisruptionBudget/istiod",
		"Role/istiod", "RoleBinding/istiod", "Service/istiod", "ServiceAccount/istiod",
		"ValidatingWebhookConfiguration/istio-validator-istio-system",
	}, keysOf(objs))
	for key, o := range objs {
		if ns := o.(interface{ GetNamespace() string }).GetNamespace(); ns != "" {
			assert.Equal(t, "istio-system", ns, key)
		}
	}

	// The mesh config is Istio's shape and discovery reads it (unknown fields are errors).
	cm := object[*corev1.ConfigMap](t, objs, "ConfigMap/istio")
	m, err := mesh.Parse("ConfigMap istio, key mesh", []byte(cm.Data["mesh"]))
	require.NoError(t, err)
	assert.Equal(t, "istiod.istio-system.svc:15012", m.GetDefaultConfig().GetDiscoveryAddress())

	d := object[*appsv1.Deployment](t, objs, "Deployment/istiod")
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	assert.EqualValues(t, 2, *d.Spec.Replicas)
	assert.Equal(t, "istiod", pod.ServiceAccountName)
	assert.Equal(t, DefaultImage, c.Image)
	assert.Contains(t, c.Args, "--registries=Kubernetes")
	// --meshConfig names the ConfigMap's key where its volume is mounted.
	mount := mountOf(t, pod, c, "istio")
	assert.Contains(t, c.Args, "--meshConfig="+mount+"/mesh")
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	assert.Equal(t, map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}, env)
	require.NotNil(t, c.ReadinessProbe)
	require.NotNil(t, c.ReadinessProbe.HTTPGet)
	assert.Equal(t, "/ready", c.ReadinessProbe.HTTPGet.Path)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	assert.Equal(t, map[string]int32{"tls-xds": 15012, "http-monitoring": 15014, "https-webhook": 15017}, ports)
	assert.Equal(t, int32(15014), ports[c.ReadinessProbe.HTTPGet.Port.String()])
	// No plaintext xDS: discovery refuses it on anything but loopback.
	assert.False(t, slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--grpcAddr") }), c.Args)
	assert.Contains(t, c.Args, "--httpAddr=:15014")

	checkServiceAndBudget(t, objs, d, ports)
	checkInjector(t, objs, pod, c)
}

// checkInjector: the injector's ConfigMap is Istio's shape, discovery reads it where the
// Deployment mounts it, and the MutatingWebhookConfiguration sends pod creations to /inject,
// refusing them while no replica answers.
func checkInjector(t *testing.T, objs map[string]runtime.Object, pod corev1.PodSpec, c corev1.Container) {
	cm := object[*corev1.ConfigMap](t, objs, "ConfigMap/istio-sidecar-injector")
	cfg, err := inject.ParseConfig([]byte(cm.Data[inject.ConfigFile]), []byte(cm.Data[inject.ValuesFile]))
	require.NoError(t, err)
	assert.Equal(t, inject.PolicyEnabled, cfg.Policy)
	assert.Equal(t, "docker.io/wasmesh", cfg.Values.Global.Hub)
	assert.Contains(t, c.Args, "--injectConfigDir="+mountOf(t, pod, c, "istio-sidecar-injector"))

	mwc := object[*admissionv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration/istio-sidecar-injector")
	require.Len(t, mwc.Webhooks, 2)
	for _, wh := range mwc.Webhooks {
		assert.Nil(t, wh.ClientConfig.CABundle, "discovery writes the caBundle")
		assert.Equal(t, admissionv1.ServiceReference{Namespace: "istio-system", Name: "istiod", Path: ptr(inject.Path), Port: ptr(int32(443))}, *wh.ClientConfig.Service)
		assert.Equal(t, admissionv1.Fail, *wh.FailurePolicy)
		assert.Equal(t, admissionv1.SideEffectClassNone, *wh.SideEffects)
		require.Len(t, wh.Rules, 1)
		assert.Equal(t, []admissionv1.OperationType{admissionv1.Create}, wh.Rules[0].Operations)
		assert.Equal(t, []string{"pods"}, wh.Rules[0].Resources)
	}
}

// checkServiceAndBudget: the Service and the PodDisruptionBudget select the Deployment's pods,
// and every Service port reaches a container port.
func checkServiceAndBudget(t *testing.T, objs map[string]runtime.Object, d *appsv1.Deployment, ports map[string]int32) {
	podLabels := d.Spec.Template.Labels
	svc := object[*corev1.Service](t, objs, "Service/istiod")
	for k, v := range svc.Spec.Selector {
		assert.Equal(t, v, podLabels[k], "Service selector %s", k)
	}
	got := map[string]string{}
	for _, p := range svc.Spec.Ports {
		target := p.TargetPort.String()
		if n, ok := ports[target]; ok {
			target = "pod " + target + " " + itoa(n)
		}
		got[p.Name] = itoa(p.Port) + " -> " + target
	}
	assert.Equal(t, map[string]string{
		"https-dns":       "15012 -> pod tls-xds 15012",
		"http-monitoring": "15014 -> pod http-monitoring 15014",
		"https-webhook":   "443 -> pod https-webhook 15017",
	}, got)
	pdb := object[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget/istiod")
	assert.Equal(t, 1, pdb.Spec.MinAvailable.IntValue())
	for k, v := range pdb.Spec.Selector.MatchLabels {
		assert.Equal(t, v, podLabels[k], "PodDisruptionBudget selector %s", k)
	}
	assert.Less(t, pdb.Spec.MinAvailable.IntValue(), int(*d.Spec.Replicas), "a budget as large as the replicas blocks every drain")
}

func mountOf(t *testing.T, pod corev1.PodSpec, c corev1.Container, configMap string) string {
	t.Helper()
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == configMap {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name {
					return m.MountPath
				}
			}
		}
	}
	t.Fatalf("ConfigMap %s is not mounted", configMap)
	return ""
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// istioKinds reads the generated CRDs: each served kind's group and plural.
func istioKinds(t *testing.T) map[string][2]string {
	t.Helper()
	file, err := IstioCRDFile(".")
	require.NoError(t, err)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	crds, err := CRDs(data, ServedKinds())
	require.NoError(t, err)
	out := map[string][2]string{}
	r := utilyaml.NewYAMLReader(bufioReader(crds))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		u := &unstructured.Unstructured{}
		require.NoError(t, u.UnmarshalJSON(mustJSON(t, doc)))
		kind, _, _ := unstructured.NestedString(u.Object, "spec", "names", "kind")
		group, _, _ := unstructured.NestedString(u.Object, "spec", "group")
		plural, _, _ := unstructured.NestedString(u.Object, "spec", "names", "plural")
		out[kind] = [2]string{group, plural}
	}
	return out
}

// The CRDs are Istio's, of exactly the kinds discovery watches, and the webhook's rules and
// the status rules name each of them (a kind added to the source fails here until they do;
// the cluster test checks what the rules grant).
func TestCRDsAndRulesFollowTheKindsDiscoveryWatches(t *testing.T) {
	kinds := istioKinds(t)
	require.Len(t, kinds, len(ServedKinds()))
	for _, k := range ServedKinds() {
		require.Contains(t, kinds, k)
	}
	objs := objects(t)
	vwc := object[*admissionv1.ValidatingWebhookConfiguration](t, objs, "ValidatingWebhookConfiguration/istio-validator-istio-system")
	require.Len(t, vwc.Webhooks, 1)
	wh := vwc.Webhooks[0]
	assert.Nil(t, wh.ClientConfig.CABundle, "discovery writes the caBundle; a manifest value would be applied over it")
	assert.Equal(t, admissionv1.ServiceReference{Namespace: "istio-system", Name: "istiod", Path: ptr("/validate"), Port: ptr(int32(443))}, *wh.ClientConfig.Service)
	assert.Equal(t, admissionv1.Ignore, *wh.FailurePolicy)
	hooked := map[[2]string]bool{}
	for _, r := range wh.Rules {
		assert.ElementsMatch(t, []admissionv1.OperationType{admissionv1.Create, admissionv1.Update}, r.Operations)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				hooked[[2]string{g, res}] = true
			}
		}
	}
	cr := object[*rbacv1.ClusterRole](t, objs, "ClusterRole/istiod-clusterrole-istio-system")
	for kind, gr := range kinds {
		assert.True(t, hooked[gr], "the webhook validates %s (%v)", kind, gr)
		assert.True(t, grants(cr.Rules, gr[0], gr[1], "watch"), "ClusterRole watches %s", kind)
		assert.True(t, grants(cr.Rules, gr[0], gr[1]+"/status", "patch"), "ClusterRole patches the status of %s", kind)
	}
	assert.Len(t, hooked, len(kinds), "the webhook validates only the kinds discovery watches")
}

func grants(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func TestWriteNamesTheImageAndReplacesTheDirectory(t *testing.T) {
	file, err := IstioCRDFile(".")
	require.NoError(t, err)
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "stale.yaml"), []byte("kind: Stale\n"), 0o644))
	require.NoError(t, Write(dir, data, Options{Image: "registry.example/discovery:v1"}))
	ms, err := Manifests()
	require.NoError(t, err)
	var want []string
	for _, m := range ms {
		want = append(want, m.Name)
	}
	got, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	for i := range got {
		got[i] = filepath.Base(got[i])
	}
	assert.Equal(t, append(want, CRDFile), got, "the manifests in apply order, then the CRDs; nothing stale")
	dep, err := os.ReadFile(filepath.Join(dir, "40-deployment.yaml"))
	require.NoError(t, err)
	assert.Contains(t, string(dep), "image: registry.example/discovery:v1\n")
	assert.NotContains(t, string(dep), DefaultImage)

	_, err = CRDs(data, []string{"VirtualService", "NoSuchKind"})
	assert.ErrorContains(t, err, `no CRD of kind "NoSuchKind"`)
}

func ptr[T any](v T) *T { return &v }

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

func mustJSON(t *testing.T, doc []byte) []byte {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	require.NoError(t, err)
	return js
}
