package inject

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	meshconfig "istio.io/api/mesh/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func podRequest(t *testing.T, pod *corev1.Pod, op admissionv1.Operation) *admissionv1.AdmissionRequest {
	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	return &admissionv1.AdmissionRequest{UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: op,
		Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw}}
}

func newTestWebhook(t *testing.T, m *meshconfig.MeshConfig, reg prometheus.Registerer) *Webhook {
	w, err := NewWebhook(WebhookOptions{Mesh: func() *meshconfig.MeshConfig { return m }, Registerer: reg})
	require.NoError(t, err)
	return w
}

// The webhook's answer, its patch applied to the pod it was sent, is the golden output:
// the injected pod, the pod unchanged (skipped), or a refusal with the golden's message.
func TestWebhookPatchGivesTheGolden(t *testing.T) {
	w := newTestWebhook(t, goldenMesh(t), nil)
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			req := podRequest(t, c.pod, admissionv1.Create)
			resp := w.Admit(context.Background(), req)
			res, injectErr := Inject(DefaultConfig(), goldenMesh(t), Input{Pod: c.pod, Namespace: c.pod.Namespace, Workload: WorkloadOfPod(c.pod)})
			if injectErr != nil {
				require.False(t, resp.Allowed)
				assert.Equal(t, int32(http.StatusUnprocessableEntity), resp.Result.Code)
				assert.Equal(t, "sidecar injection of pod "+c.pod.Namespace+"/"+podName(c.pod)+": "+injectErr.Error(), resp.Result.Message)
				return
			}
			require.True(t, resp.Allowed, "%+v", resp.Result)
			assert.Equal(t, res.Warnings, resp.Warnings)
			if res.Pod == nil {
				assert.Nil(t, resp.Patch, "a skipped pod is not patched")
				return
			}
			require.Equal(t, admissionv1.PatchTypeJSONPatch, *resp.PatchType)
			patch, err := jsonpatch.DecodePatch(resp.Patch)
			require.NoError(t, err)
			patched, err := patch.Apply(req.Object.Raw)
			require.NoError(t, err)
			var got corev1.Pod
			require.NoError(t, json.Unmarshal(patched, &got))
			assert.Equal(t, toYAML(t, res.Pod), toYAML(t, &got)) // quantities compare as written
		})
	}
}

// The patch touches only what injection changed: a field the API server sent in its own
// spelling and injection left alone gets no operation.
func TestWebhookPatchIsMinimal(t *testing.T) {
	w := newTestWebhook(t, goldenMesh(t), nil)
	raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"shop","uid":"u-1","labels":{"app":"p"}},
		"spec":{"restartPolicy":"Always","dnsPolicy":"ClusterFirst","containers":[{"name":"app","image":"busybox"}]},"status":{"phase":"Pending"}}`)
	resp := w.Admit(context.Background(), &admissionv1.AdmissionRequest{UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Operation: admissionv1.Create, Namespace: "shop", Object: runtime.RawExtension{Raw: raw}})
	require.True(t, resp.Allowed)
	var ops []patchOp
	require.NoError(t, json.Unmarshal(resp.Patch, &ops))
	var paths []string
	for _, op := range ops {
		paths = append(paths, op.Op+" "+op.Path)
	}
	assert.Equal(t, []string{"add /metadata/annotations", "replace /metadata/labels",
		"replace /spec/containers", "add /spec/initContainers", "add /spec/volumes"}, paths)
}

// Only pod creations are injected; updates, other kinds and a pod that does not decode are
// told apart, and counted as istiod counts them.
func TestWebhookRequests(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := newTestWebhook(t, nil, reg)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}

	resp := w.Admit(context.Background(), podRequest(t, pod, admissionv1.Update))
	assert.True(t, resp.Allowed)
	assert.Nil(t, resp.Patch, "an update is not injected")

	svc := podRequest(t, pod, admissionv1.Create)
	svc.Kind.Kind = "Service"
	assert.Nil(t, w.Admit(context.Background(), svc).Patch, "another kind is not injected")

	bad := podRequest(t, pod, admissionv1.Create)
	bad.Object.Raw = []byte(`{"spec":{"containers":"not a list"}}`)
	resp = w.Admit(context.Background(), bad)
	require.False(t, resp.Allowed)
	assert.Equal(t, int32(http.StatusBadRequest), resp.Result.Code)
	assert.Contains(t, resp.Result.Message, "the pod does not decode")

	resp = w.Admit(context.Background(), podRequest(t, pod, admissionv1.Create))
	require.True(t, resp.Allowed)
	assert.NotNil(t, resp.Patch)

	again := podRequest(t, pod, admissionv1.Create)
	injected, err := jsonpatch.DecodePatch(resp.Patch)
	require.NoError(t, err)
	again.Object.Raw, err = injected.Apply(again.Object.Raw)
	require.NoError(t, err)
	assert.Nil(t, w.Admit(context.Background(), again).Patch, "an injected pod is not injected twice")

	assert.Equal(t, 5.0, testutil.ToFloat64(w.requests))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.success))
	assert.Equal(t, 3.0, testutil.ToFloat64(w.skipped))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.failed.WithLabelValues("decode")))
	n, err := testutil.GatherAndCount(reg, "sidecar_injection_time_seconds")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// A new configuration applies from the next request.
func TestWebhookSetConfig(t *testing.T) {
	w := newTestWebhook(t, nil, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	require.NotNil(t, w.Admit(context.Background(), podRequest(t, pod, admissionv1.Create)).Patch)
	cfg, err := ParseConfig([]byte("policy: disabled"), nil)
	require.NoError(t, err)
	w.SetConfig(cfg)
	assert.Nil(t, w.Admit(context.Background(), podRequest(t, pod, admissionv1.Create)).Patch)
}

func toYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestEscapePointer(t *testing.T) {
	assert.Equal(t, "sidecar.istio.io~1status", escapePointer("sidecar.istio.io/status"))
	assert.Equal(t, "a~0b~1c", escapePointer("a~b/c"))
}
