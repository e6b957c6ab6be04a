package inject

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// identityPod injects a plain pod with the values given and returns it and its proxy.
func identityPod(t *testing.T, values string) (*corev1.Pod, *corev1.Container) {
	t.Helper()
	cfg, err := ParseConfig(nil, []byte(values))
	require.NoError(t, err)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reviews-1", Namespace: "bookinfo", Labels: map[string]string{"app": "reviews"}},
		Spec: corev1.PodSpec{ServiceAccountName: "reviews", Containers: []corev1.Container{{Name: "app", Image: "reviews"}}}}
	res, err := Inject(cfg, goldenMesh(t), Input{Pod: pod, Namespace: pod.Namespace, Workload: WorkloadOfPod(pod)})
	require.NoError(t, err)
	require.NotNil(t, res.Pod, res.Skipped)
	proxy := findContainer(res.Pod, ProxyContainer)
	require.NotNil(t, proxy)
	return res.Pod, proxy
}

func volumeNamed(pod *corev1.Pod, name string) *corev1.Volume {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return &pod.Spec.Volumes[i]
		}
	}
	return nil
}

func mountsOf(c *corev1.Container) map[string]string {
	out := map[string]string{}
	for _, m := range c.VolumeMounts {
		out[m.MountPath] = m.Name
	}
	return out
}

func envOf(c *corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		out[e.Name] = e.Value
	}
	return out
}

// The sidecar's identity, as Istio's template gives it: the projected service-account
// token for the CA's audience at /var/run/secrets/tokens/istio-token (the agent's
// KubernetesTokenFile), the mesh root's ConfigMap at /var/run/secrets/istio (root-cert.pem,
// the agent's CA_ROOT_CA default), the SDS socket's directory, CA_ADDR (istiod's Service,
// port 15012), PILOT_CERT_PROVIDER and TRUST_DOMAIN, and the tlsMode label auto mTLS reads.
func TestIdentityMounts(t *testing.T) {
	pod, proxy := identityPod(t, "")
	tok := volumeNamed(pod, "istio-token")
	require.NotNil(t, tok, "no istio-token volume")
	require.NotNil(t, tok.Projected)
	require.Len(t, tok.Projected.Sources, 1)
	sat := tok.Projected.Sources[0].ServiceAccountToken
	require.NotNil(t, sat)
	assert.Equal(t, "istio-ca", sat.Audience)
	assert.Equal(t, "istio-token", sat.Path)
	require.NotNil(t, sat.ExpirationSeconds)
	assert.Equal(t, int64(43200), *sat.ExpirationSeconds)
	root := volumeNamed(pod, "istiod-ca-cert")
	require.NotNil(t, root, "no mesh root volume")
	require.NotNil(t, root.ConfigMap)
	assert.Equal(t, "istio-ca-root-cert", root.ConfigMap.Name)
	for _, name := range []string{"workload-socket", "credential-socket", "workload-certs"} {
		v := volumeNamed(pod, name)
		require.NotNil(t, v, name)
		assert.NotNil(t, v.EmptyDir, name)
	}
	assert.Equal(t, map[string]string{
		"/var/run/secrets/workload-spiffe-uds":         "workload-socket",
		"/var/run/secrets/credential-uds":              "credential-socket",
		"/var/run/secrets/workload-spiffe-credentials": "workload-certs",
		"/var/run/secrets/istio":                       "istiod-ca-cert",
		"/var/lib/istio/data":                          "istio-data",
		"/etc/istio/proxy":                             "istio-envoy",
		"/var/run/secrets/tokens":                      "istio-token",
		"/etc/istio/pod":                               "istio-podinfo",
	}, mountsOf(proxy))
	env := envOf(proxy)
	assert.Equal(t, "istiod", env["PILOT_CERT_PROVIDER"])
	assert.Equal(t, "istiod.istio-system.svc:15012", env["CA_ADDR"])
	assert.Equal(t, "cluster.local", env["TRUST_DOMAIN"], "the mesh config's trust domain")
	assert.Equal(t, "istio", pod.Labels["security.istio.io/tlsMode"])
}

// The values change what the identity needs: caAddress and istioNamespace the CA address,
// the audience the token's, pilotCertProvider none drops the mesh root (as Istio's template
// mounts it only for istiod).
func TestIdentityValues(t *testing.T) {
	_, proxy := identityPod(t, "global: {istioNamespace: mesh}")
	assert.Equal(t, "istiod.mesh.svc:15012", envOf(proxy)["CA_ADDR"])
	pod, proxy := identityPod(t, "global: {caAddress: 127.0.0.1:4321, pilotCertProvider: none, sds: {token: {aud: other}}}")
	env := envOf(proxy)
	assert.Equal(t, "127.0.0.1:4321", env["CA_ADDR"])
	assert.Equal(t, "none", env["PILOT_CERT_PROVIDER"])
	assert.Nil(t, volumeNamed(pod, "istiod-ca-cert"))
	assert.NotContains(t, mountsOf(proxy), "/var/run/secrets/istio")
	assert.Equal(t, "other", volumeNamed(pod, "istio-token").Projected.Sources[0].ServiceAccountToken.Audience)
}
