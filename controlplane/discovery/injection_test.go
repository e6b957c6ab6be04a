package discovery_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/deploy"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/discovery/discoverytest"
	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

// discovery serves sidecar injection as the manifests configure it: it keeps the caBundle of
// the MutatingWebhookConfiguration, injects a pod created in a namespace with injection on
// with the image of its injector values and the proxy config of its mesh config, and takes
// a new values file without a restart (a bad one is logged and the last good one stays).
func TestInjectionOnKubernetes(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{})
	ctx := context.Background()
	for _, ns := range []string{"istio-system", "shop"} {
		labels := map[string]string{}
		if ns == "shop" {
			labels["istio-injection"] = "enabled"
		}
		_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	dir := t.TempDir()
	injectDir := filepath.Join(dir, "inject")
	require.NoError(t, os.Mkdir(injectDir, 0o755))
	writeValues := func(v string) { // at once, as the kubelet swaps a ConfigMap's files
		tmp := filepath.Join(dir, "values.tmp")
		require.NoError(t, os.WriteFile(tmp, []byte(v), 0o644))
		require.NoError(t, os.Rename(tmp, filepath.Join(injectDir, inject.ValuesFile)))
	}
	writeValues("global: {hub: registry.local/one, tag: v1}\n")
	meshFile := filepath.Join(dir, "mesh")
	require.NoError(t, os.WriteFile(meshFile, []byte("defaultConfig: {discoveryAddress: 'discovery.test:15010'}\n"), 0o644))

	d := discoverytest.Run(t, discovery.Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Server: server.Defaults(), ShutdownGrace: time.Second, MeshConfigFile: meshFile,
		Debounce: discoverytest.Debounce,
		Kube:     c.Config, Namespace: "istio-system",
		Webhook: discovery.WebhookOptions{Addr: "127.0.0.1:0", Hosts: []string{"127.0.0.1"}, Injection: true,
			InjectConfigDir: injectDir, InjectorConfigName: webhook.DefaultMutatingConfig, NativeSidecars: inject.NativeFalse},
	}, slog.New(slog.DiscardHandler))

	mwc := mutatingConfig(t, "https://"+d.WebhookAddr()+inject.Path)
	_, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		got, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, mwc.Name, metav1.GetOptions{})
		return err == nil && len(got.Webhooks[0].ClientConfig.CABundle) > 0 && len(got.Webhooks[1].ClientConfig.CABundle) > 0
	}, time.Minute, 20*time.Millisecond, "discovery writes the caBundle of the injector's webhooks")

	pods := 0
	proxyOf := func() *corev1.Container {
		t.Helper()
		pods++
		name := fmt.Sprintf("pod-%d", pods)
		p, err := c.Client.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		for i := range p.Spec.Containers {
			if p.Spec.Containers[i].Name == inject.ProxyContainer {
				return &p.Spec.Containers[i]
			}
		}
		t.Fatalf("pod %s stored without a sidecar", name)
		return nil
	}
	proxy := proxyOf()
	assert.Equal(t, "registry.local/one/proxyv2:v1", proxy.Image)
	for _, e := range proxy.Env {
		if e.Name == "PROXY_CONFIG" {
			assert.Contains(t, e.Value, `"discoveryAddress":"discovery.test:15010"`)
		}
	}

	writeValues("global: {hub: registry.local/two, tag: v2}\n")
	require.Eventually(t, func() bool {
		return proxyOf().Image == "registry.local/two/proxyv2:v2"
	}, time.Minute, 100*time.Millisecond, "new values apply without a restart")
	rejected := func() float64 {
		return counterValue(t, d.Reg, "wasmesh_injector_config_reloads_total", "rejected")
	}
	before := rejected()
	writeValues("global: {proxy: {statusPort: -1}}\n")
	require.Eventually(t, func() bool { return rejected() > before }, time.Minute, 20*time.Millisecond, "the bad values file is read")
	assert.Equal(t, "registry.local/two/proxyv2:v2", proxyOf().Image, "a bad values file leaves the last good one in force")
}

// mutatingConfig is deploy's MutatingWebhookConfiguration calling url.
func mutatingConfig(t *testing.T, url string) *admissionregistrationv1.MutatingWebhookConfiguration {
	ms, err := deploy.Manifests()
	require.NoError(t, err)
	for _, m := range ms {
		if strings.Contains(m.Name, "mutatingwebhookconfiguration") {
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			require.NoError(t, yaml.UnmarshalStrict(m.Data, &mwc))
			for i := range mwc.Webhooks {
				mwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(url)}
			}
			return &mwc
		}
	}
	t.Fatal("no MutatingWebhookConfiguration among deploy's manifests")
	return nil
}

// counterValue is the value of the counter of family name whose one label has value
// (0 before its first increment).
func counterValue(t *testing.T, reg prometheus.Gatherer, name, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
