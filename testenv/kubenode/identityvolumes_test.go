package kubenode

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The volumes an injected sidecar's identity needs, against a real API server: the
// projected token istio-token (TokenRequest for the pod's service account, the audience and
// lifetime asked, bound to the pod; the same token until 80% of its life, then a new one, as
// the kubelet renews it) and the ConfigMap istio-ca-root-cert (a change reaches the file at
// the next sync, written atomically).
func TestIdentityVolumesFromTheAPIServer(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := "default"
	_, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "reviews"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	root := func(s string) map[string]string { return map[string]string{"root-cert.pem": s} }
	_, err = c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"},
		Data: root("root one")}, metav1.CreateOptions{})
	require.NoError(t, err)
	exp := int64(43200)
	pod, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reviews-1"},
		Spec: corev1.PodSpec{ServiceAccountName: "reviews", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "app", Image: "wasmesh/echo"}},
			Volumes: []corev1.Volume{
				{Name: "istio-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "istio-ca", ExpirationSeconds: &exp, Path: "istio-token"}}}}}},
				{Name: "istiod-ca-cert", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "istio-ca-root-cert"}}}},
			}}}, metav1.CreateOptions{})
	require.NoError(t, err)

	r := newPodRun(&Node{client: c.Client, podNet: "198.18", net: 200, dir: t.TempDir()}, pod, 1)
	require.Empty(t, r.badVolumes)
	tokenFile := filepath.Join(r.volumePaths["istio-token"], "istio-token")
	rootFile := filepath.Join(r.volumePaths["istiod-ca-cert"], "root-cert.pem")
	sync := func() (token, root string) {
		t.Helper()
		require.NoError(t, r.syncVolumes(ctx))
		tb, err := os.ReadFile(tokenFile)
		require.NoError(t, err)
		rb, err := os.ReadFile(rootFile)
		require.NoError(t, err)
		return string(tb), string(rb)
	}

	tok1, root1 := sync()
	assert.Equal(t, "root one", root1)
	claims := jwtClaims(t, tok1)
	assert.Equal(t, []any{"istio-ca"}, claims["aud"])
	assert.Equal(t, "system:serviceaccount:default:reviews", claims["sub"])
	assert.InDelta(t, 43200, claims["exp"].(float64)-claims["iat"].(float64), 1)
	bound, _ := claims["kubernetes.io"].(map[string]any)["pod"].(map[string]any)
	assert.Equal(t, map[string]any{"name": "reviews-1", "uid": string(pod.UID)}, bound, "bound to the pod")
	r.mu.Lock()
	refreshAt := r.tokens["istio-token/0"].refreshAt
	r.mu.Unlock()
	assert.WithinDuration(t, time.Now().Add(43200*time.Second*8/10), refreshAt, 10*time.Second, "renewed at 80% of its life")

	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
	require.NoError(t, err)
	cm.Data = root("root one\nroot two")
	_, err = c.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // a new token's iat differs
	tok2, root2 := sync()
	assert.Equal(t, "root one\nroot two", root2, "the ConfigMap's change reaches the file")
	assert.Equal(t, tok1, tok2, "the token is kept before 80% of its life")
	link, err := os.Readlink(filepath.Join(r.volumePaths["istiod-ca-cert"], "root-cert.pem"))
	require.NoError(t, err)
	assert.Equal(t, "..data/root-cert.pem", link, "written as the kubelet's atomic writer")

	r.mu.Lock()
	r.tokens["istio-token/0"] = token{value: r.tokens["istio-token/0"].value, refreshAt: time.Now().Add(-time.Second)}
	r.mu.Unlock()
	tok3, _ := sync()
	assert.NotEqual(t, tok1, tok3, "a new token once it is due")
	assert.Equal(t, []any{"istio-ca"}, jwtClaims(t, tok3)["aud"])
}

func jwtClaims(t *testing.T, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(tok, ".")
	require.Len(t, parts, 3, "a JWT")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal(b, &c))
	return c
}
