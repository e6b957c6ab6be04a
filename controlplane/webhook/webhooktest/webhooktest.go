// Package webhooktest helps test discovery's webhook and singleton work against a real API
// server: Istio's validating webhook configuration, objects the validator refuses, and
// checks that the leader keeps the caBundle and writes statuses.
package webhooktest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

const (
	// Namespace is discovery's in the tests; Denied begins the API server's message for an
	// object the webhook refused; WeightField is the field a negative weight is refused on.
	Namespace   = "istio-system"
	Denied      = `admission webhook "validation.istio.io" denied the request: `
	WeightField = "spec.http[0].route[0].weight"
	wait        = time.Minute
	tick        = 20 * time.Millisecond
)

// VirtualServices are networking.istio.io/v1 VirtualServices.
var VirtualServices = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}

// ValidatingConfig is Istio's validating webhook configuration (the istiod chart's rules),
// named webhook.DefaultValidatingConfig, calling url, its caBundle empty until discovery
// patches it.
func ValidatingConfig(url string, policy admissionregistrationv1.FailurePolicyType) *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhook.DefaultValidatingConfig},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "validation.istio.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url)},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"security.istio.io", "networking.istio.io", "telemetry.istio.io", "extensions.istio.io"},
					APIVersions: []string{"*"}, Resources: []string{"*"}},
			}},
			FailurePolicy:           ptr.To(policy),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To(int32(10)),
		}},
	}
}

// Setup creates discovery's namespace and demo, and in demo the VirtualService "broken"
// (a negative weight) before any webhook judges it: the Kubernetes source rejects it and
// the leader writes why on it. It returns demo's VirtualServices.
func Setup(t *testing.T, c *kubecluster.Cluster) dynamic.ResourceInterface {
	t.Helper()
	ctx := context.Background()
	for _, n := range []string{Namespace, "demo"} {
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	vs := dynamic.NewForConfigOrDie(c.Config).Resource(VirtualServices).Namespace("demo")
	_, err := vs.Create(ctx, VirtualService("broken", -5), metav1.CreateOptions{})
	require.NoError(t, err)
	return vs
}

// VirtualService routes to backend.demo with weight (0: none; negative: refused).
func VirtualService(name string, weight int) *unstructured.Unstructured {
	dest := map[string]any{"destination": map[string]any{"host": "backend.demo.svc.cluster.local"}}
	if weight != 0 {
		dest["weight"] = weight
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": name, "namespace": "demo"},
		"spec":     map[string]any{"hosts": []any{"backend.demo.svc.cluster.local"}, "http": []any{map[string]any{"route": []any{dest}}}},
	}}
}

// YAML is an object as kubectl reads it (JSON is YAML).
func YAML(t *testing.T, u *unstructured.Unstructured) string {
	b, err := json.Marshal(u.Object)
	require.NoError(t, err)
	return string(b)
}

// CABundle is the caBundle of the configuration's webhook.
func CABundle(t *testing.T, c *kubecluster.Cluster) []byte {
	vwc, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), webhook.DefaultValidatingConfig, metav1.GetOptions{})
	require.NoError(t, err)
	return vwc.Webhooks[0].ClientConfig.CABundle
}

// CASecret is the shared CA's certificate (nil before there is one).
func CASecret(t *testing.T, c *kubecluster.Cluster) []byte {
	s, err := c.Client.CoreV1().Secrets(Namespace).Get(context.Background(), webhook.DefaultCASecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	require.NoError(t, err)
	return s.Data[webhook.CACertKey]
}

// WaitCABundlePatched waits until the configuration trusts the shared CA.
func WaitCABundlePatched(t *testing.T, c *kubecluster.Cluster, why string) {
	t.Helper()
	require.Eventually(t, func() bool { b := CABundle(t, c); return len(b) > 0 && bytes.Equal(b, CASecret(t, c)) }, wait, tick, why)
}

// OverwriteCABundle puts another CA's certificate in the configuration, as someone
// re-applying the manifests would, and waits until discovery has put the shared CA back.
func OverwriteCABundle(t *testing.T, c *kubecluster.Cluster, why string) {
	t.Helper()
	ctx := context.Background()
	vwcs := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	other, err := os.ReadFile(c.CAFile())
	require.NoError(t, err)
	vwc, err := vwcs.Get(ctx, webhook.DefaultValidatingConfig, metav1.GetOptions{})
	require.NoError(t, err)
	vwc.Webhooks[0].ClientConfig.CABundle = other
	_, err = vwcs.Update(ctx, vwc, metav1.UpdateOptions{})
	require.NoError(t, err)
	WaitCABundlePatched(t, c, why)
}

// StatusMessage is the message of the Accepted=False condition discovery's leader wrote on
// a VirtualService ("" without one).
func StatusMessage(t *testing.T, vs dynamic.ResourceInterface, name string) string {
	u, err := vs.Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Accepted" && m["status"] == "False" {
			msg, _ := m["message"].(string)
			return msg
		}
	}
	return ""
}

// WaitStatusWritten waits until the leader has written why "broken" is rejected.
func WaitStatusWritten(t *testing.T, vs dynamic.ResourceInterface, why string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(StatusMessage(t, vs, "broken"), WeightField) }, wait, tick, why)
}

// WipeStatus clears the status of "broken" and waits until the leader writes it again.
func WipeStatus(t *testing.T, vs dynamic.ResourceInterface, why string) {
	t.Helper()
	u, err := vs.Get(context.Background(), "broken", metav1.GetOptions{})
	require.NoError(t, err)
	u.Object["status"] = map[string]any{}
	_, err = vs.UpdateStatus(context.Background(), u, metav1.UpdateOptions{})
	require.NoError(t, err)
	WaitStatusWritten(t, vs, why)
}

// ServesCertTrustedBy checks that the webhook at addr serves a certificate the bundle
// trusts for 127.0.0.1, the address the configuration calls.
func ServesCertTrustedBy(t *testing.T, addr string, bundle []byte) {
	t.Helper()
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(bundle))
	require.Eventually(t, func() bool {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			return false
		}
		return conn.Close() == nil
	}, wait, tick, "the webhook's certificate is signed by the shared CA")
}

// OneCASecret checks that discovery's namespace holds one Secret, the CA's.
func OneCASecret(t *testing.T, c *kubecluster.Cluster) {
	t.Helper()
	secrets, err := c.Client.CoreV1().Secrets(Namespace).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, secrets.Items, 1, "one CA Secret")
	require.Equal(t, webhook.DefaultCASecret, secrets.Items[0].Name)
}

// LeaseHolder is who holds discovery's Lease.
func LeaseHolder(t *testing.T, c *kubecluster.Cluster, lease string) string {
	l, err := c.Client.CoordinationV1().Leases(Namespace).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}
