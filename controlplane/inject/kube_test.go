package inject

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	meshconfig "istio.io/api/mesh/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/deploy"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

// injectingCluster is a real API server calling the injection webhook as the manifests
// configure it (deploy's MutatingWebhookConfiguration, its Service replaced by this
// server's URL), served over TLS by the webhook server with a generated certificate whose
// CA the caBundle patcher writes into the configuration.
type injectingCluster struct {
	*kubecluster.Cluster
	webhook *Webhook
}

func startInjectingCluster(t testing.TB, m *meshconfig.MeshConfig) *injectingCluster {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	log := slog.New(slog.DiscardHandler)
	certs, err := webhook.NewGeneratedCerts(webhook.GenerateOptions{Client: c.Client, Namespace: "istio-system", Hosts: []string{"127.0.0.1"}, Log: log})
	require.NoError(t, err)
	srv, err := webhook.New(webhook.Options{Addr: "127.0.0.1:0", Certs: certs, Log: log})
	require.NoError(t, err)
	w, err := NewWebhook(WebhookOptions{Mesh: func() *meshconfig.MeshConfig { return m }, Log: log})
	require.NoError(t, err)
	srv.HandleAdmission(Path, w.Admit)
	patcher, err := webhook.NewCABundlePatcher(webhook.PatcherOptions{Client: c.Client, Kind: webhook.Mutating, Name: webhook.DefaultMutatingConfig, Certs: certs, Log: log})
	require.NoError(t, err)
	go func() { _ = certs.Run(ctx) }()
	go func() { _ = srv.Run(ctx, time.Second) }()
	go patcher.Run(ctx)

	mwc := manifestConfig(t)
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + srv.Addr() + Path)}
	}
	_, err = c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhook.DefaultMutatingConfig, metav1.GetOptions{})
		return err == nil && len(got.Webhooks[0].ClientConfig.CABundle) > 0 && bytes.Equal(got.Webhooks[1].ClientConfig.CABundle, certs.CABundle())
	}, time.Minute, 20*time.Millisecond, "the patcher writes the CA into both webhooks")
	return &injectingCluster{Cluster: c, webhook: w}
}

// manifestConfig is deploy's MutatingWebhookConfiguration.
func manifestConfig(t testing.TB) *admissionregistrationv1.MutatingWebhookConfiguration {
	ms, err := deploy.Manifests()
	require.NoError(t, err)
	for _, m := range ms {
		if strings.Contains(m.Name, "mutatingwebhookconfiguration") {
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			require.NoError(t, yaml.UnmarshalStrict(m.Data, &mwc))
			return &mwc
		}
	}
	t.Fatal("no MutatingWebhookConfiguration among deploy's manifests")
	return nil
}

// namespace creates a namespace with the service accounts its pods name (no controller
// manager runs here to make "default").
func (c *injectingCluster) namespace(t testing.TB, name string, labels map[string]string) {
	ctx := context.Background()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	require.NoError(t, err)
	for _, sa := range []string{"default", "bookinfo-reviews"} {
		_, err := c.Client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// create creates pod (a dry run: stored nowhere, but admitted and defaulted as for real).
func (c *injectingCluster) create(pod *corev1.Pod, dryRun bool) (*corev1.Pod, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return c.Client.CoreV1().Pods(pod.Namespace).Create(context.Background(), pod.DeepCopy(), opts)
}

// admitted is what of a pod the API server admitted the test compares: its spec and its
// labels and annotations, as YAML. The service-account token volume the API server adds has
// a random name and comes before or after the sidecar's volumes (its admission plugin runs
// before the webhooks): its name is made one and the volumes and mounts are sorted.
func admitted(t *testing.T, p *corev1.Pod) string {
	spec := p.Spec.DeepCopy()
	sort.Slice(spec.Volumes, func(i, j int) bool { return spec.Volumes[i].Name < spec.Volumes[j].Name })
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list { // the token's mount, likewise, in a container the pod brings
			sort.Slice(c.VolumeMounts, func(i, j int) bool { return c.VolumeMounts[i].Name < c.VolumeMounts[j].Name })
		}
	}
	b, err := yaml.Marshal(map[string]any{"labels": p.Labels, "annotations": p.Annotations, "spec": spec})
	require.NoError(t, err)
	return tokenVolume.ReplaceAllString(string(b), "kube-api-access")
}

var tokenVolume = regexp.MustCompile(`kube-api-access-[a-z0-9]{5}`)

// Through the real API server, each golden case's pod created in a namespace with injection
// on comes back as the golden's injected pod does when created as it is (both defaulted by
// the API server alike); a skip case comes back without a sidecar; an error case is refused
// with the golden's message. Then: a pod is stored with the sidecar; the opt-outs and the
// namespaces' labels select as Istio's webhooks do; a bad annotation is refused by name.
func TestInjectionThroughTheAPIServer(t *testing.T) {
	c := startInjectingCluster(t, goldenMesh(t))
	namespaces := map[string]bool{}
	cases := goldenCases(t)
	for _, gc := range cases {
		namespaces[gc.pod.Namespace] = true
	}
	for ns := range namespaces {
		c.namespace(t, ns, map[string]string{"istio-injection": "enabled"})
	}
	for _, gc := range cases {
		t.Run(gc.name, func(t *testing.T) {
			want := readGolden(t, gc.name)
			got, err := c.create(gc.pod, true)
			switch {
			case want.Error != "":
				require.Error(t, err)
				assert.Contains(t, err.Error(), `admission webhook "namespace.sidecar-injector.istio.io" denied the request: sidecar injection of pod `)
				assert.Contains(t, err.Error(), strings.Split(want.Error, "\n")[0])
			case want.Skipped != "":
				require.NoError(t, err)
				assert.NotContains(t, got.Annotations, "sidecar.istio.io/status")
				require.Nil(t, findContainer(got, ProxyContainer))
			default:
				require.NoError(t, err)
				expected, err := c.create(want.Pod, true)
				require.NoError(t, err, "the golden pod itself is admitted")
				assert.Equal(t, admitted(t, expected), admitted(t, got))
			}
		})
	}
	t.Run("selection", func(t *testing.T) { testSelection(t, c) })
}

func plainPod(ns, name string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
}

// testSelection: which pods get a sidecar, stored for real.
func testSelection(t *testing.T, c *injectingCluster) {
	c.namespace(t, "on", map[string]string{"istio-injection": "enabled"})
	c.namespace(t, "off", map[string]string{"istio-injection": "disabled"})
	c.namespace(t, "silent", nil)
	for _, p := range []struct {
		pod    *corev1.Pod
		inject bool
	}{
		{plainPod("on", "plain", nil, nil), true},
		{plainPod("on", "label-false", map[string]string{"sidecar.istio.io/inject": "false"}, nil), false},
		{plainPod("on", "annotation-false", nil, map[string]string{"sidecar.istio.io/inject": "false"}), false},
		{plainPod("off", "label-true", map[string]string{"sidecar.istio.io/inject": "true"}, nil), false},
		{plainPod("silent", "plain", nil, nil), false},
		{plainPod("silent", "label-true", map[string]string{"sidecar.istio.io/inject": "true"}, nil), true},
	} {
		_, err := c.create(p.pod, false)
		require.NoError(t, err, "%s/%s", p.pod.Namespace, p.pod.Name)
		stored, err := c.Client.CoreV1().Pods(p.pod.Namespace).Get(context.Background(), p.pod.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, p.inject, findContainer(stored, ProxyContainer) != nil, "%s/%s stored with a sidecar", p.pod.Namespace, p.pod.Name)
		assert.Equal(t, p.inject, stored.Annotations["sidecar.istio.io/status"] != "", "%s/%s status annotation", p.pod.Namespace, p.pod.Name)
	}
	_, err := c.create(plainPod("silent", "bad", map[string]string{"sidecar.istio.io/inject": "true"},
		map[string]string{"sidecar.istio.io/proxyMemory": "a lot"}), false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `admission webhook "object.sidecar-injector.istio.io" denied the request: sidecar injection of pod silent/bad: `+
		`invalid value "a lot" for annotation sidecar.istio.io/proxyMemory`)
}

// BenchmarkWebhookLatency is the time the injection webhook adds to a pod's creation through
// the API server: dry-run creations of one pod in a namespace with injection on and in one
// without, alternating, each timed; p50 and p99 of each and of the difference of medians.
func BenchmarkWebhookLatency(b *testing.B) {
	c := startInjectingCluster(b, nil)
	c.namespace(b, "on", map[string]string{"istio-injection": "enabled"})
	c.namespace(b, "off", nil)
	pod := func(ns string) *corev1.Pod {
		p := plainPod(ns, "", map[string]string{"app": "web"}, nil)
		p.GenerateName = "web-"
		return p
	}
	var on, off []time.Duration
	b.ResetTimer()
	for range b.N {
		for _, ns := range []string{"on", "off"} {
			start := time.Now()
			got, err := c.create(pod(ns), true)
			d := time.Since(start)
			require.NoError(b, err)
			require.Equal(b, ns == "on", findContainer(got, ProxyContainer) != nil)
			if ns == "on" {
				on = append(on, d)
			} else {
				off = append(off, d)
			}
		}
	}
	pct := func(ds []time.Duration, p float64) float64 {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(on, 0.5), "injected-p50-ms")
	b.ReportMetric(pct(on, 0.99), "injected-p99-ms")
	b.ReportMetric(pct(off, 0.5), "plain-p50-ms")
	b.ReportMetric(pct(off, 0.99), "plain-p99-ms")
	b.ReportMetric(pct(on, 0.5)-pct(off, 0.5), "webhook-added-p50-ms")
}
