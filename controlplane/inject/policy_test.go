package inject

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Istio's precedence: host network and ignored namespaces first, then the pod's label, its
// annotation, the never and always selectors, the policy; offline, the policy is enabled
// and the selectors are not read.
func TestInjectionPrecedence(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
policy: disabled
neverInjectSelector:
- matchLabels: {job: batch}
alwaysInjectSelector:
- matchExpressions: [{key: tier, operator: In, values: [front]}]
- matchLabels: {job: batch}
`), nil)
	require.NoError(t, err)
	enabled := DefaultConfig()
	for _, c := range []struct {
		name        string
		cfg         *Config
		ns          string
		labels      map[string]string
		annotations map[string]string
		host        bool
		offline     bool
		inject      bool
		reason      string
		warnings    int
	}{
		{name: "policy enabled", cfg: enabled, ns: "shop", inject: true},
		{name: "policy disabled", cfg: cfg, ns: "shop", reason: "the injection policy is disabled and the pod does not ask for a sidecar"},
		{name: "label true over a disabled policy", cfg: cfg, ns: "shop", labels: map[string]string{"sidecar.istio.io/inject": "true"}, inject: true},
		{name: "label false", cfg: enabled, ns: "shop", labels: map[string]string{"sidecar.istio.io/inject": "false"}, reason: "the pod's label sidecar.istio.io/inject is false"},
		{name: "annotation false", cfg: enabled, ns: "shop", annotations: map[string]string{"sidecar.istio.io/inject": "false"}, reason: "the pod's annotation sidecar.istio.io/inject is false"},
		{name: "the label wins over the annotation", cfg: enabled, ns: "shop", labels: map[string]string{"sidecar.istio.io/inject": "true"},
			annotations: map[string]string{"sidecar.istio.io/inject": "false"}, inject: true},
		{name: "a word neither true nor false is warned about", cfg: enabled, ns: "shop", labels: map[string]string{"sidecar.istio.io/inject": "yes"}, inject: true, warnings: 1},
		{name: "never selector before always", cfg: cfg, ns: "shop", labels: map[string]string{"job": "batch"}, reason: "the pod's labels match neverInjectSelector[0]"},
		{name: "always selector", cfg: cfg, ns: "shop", labels: map[string]string{"tier": "front"}, inject: true},
		{name: "the pod's word before the selectors", cfg: cfg, ns: "shop", labels: map[string]string{"job": "batch", "sidecar.istio.io/inject": "true"}, inject: true},
		{name: "host network", cfg: enabled, ns: "shop", host: true, labels: map[string]string{"sidecar.istio.io/inject": "true"}, reason: "the pod uses the host's network"},
		{name: "kube-system", cfg: enabled, ns: "kube-system", labels: map[string]string{"sidecar.istio.io/inject": "true"}, reason: "namespace kube-system is never injected"},
		{name: "offline ignores the policy", cfg: cfg, ns: "shop", offline: true, inject: true},
		{name: "offline ignores the selectors", cfg: cfg, ns: "shop", offline: true, labels: map[string]string{"job": "batch"}, inject: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			meta := &metav1.ObjectMeta{Labels: c.labels, Annotations: c.annotations}
			d := required(c.cfg, meta, &corev1.PodSpec{HostNetwork: c.host}, c.ns, c.offline)
			assert.Equal(t, c.inject, d.inject)
			assert.Equal(t, c.reason, d.reason)
			assert.Len(t, d.warnings, c.warnings)
		})
	}
}

// The injector's configuration: unknown fields and values that would break every pod are
// refused naming the file and the field; Istio's templates are refused saying why.
func TestParseConfigErrors(t *testing.T) {
	for _, c := range []struct{ config, values, want string }{
		{"policy: sometimes", "", `config: policy "sometimes": want enabled or disabled`},
		{"polcy: enabled", "", `config: json: unknown field "polcy"`},
		{"templates: {sidecar: '{{ .Values }}'}", "", "config: templates: wasmesh's sidecar template is built in (Go code); the values configure it"},
		{"defaultTemplates: [sidecar, spire]", "", `config: defaultTemplates: "spire": the sidecar template is the only one (it is built in)`},
		{"neverInjectSelector: [{matchExpressions: [{key: a, operator: Sometimes}]}]", "", "config: neverInjectSelector[0]: "},
		{"", "global: {proxy: {statusPort: 70000}}", "values: global.proxy.statusPort: 70000 is not a port"},
		{"", "global: {imagePullPolicy: Sometimes}", `values: global.imagePullPolicy: "Sometimes": want Always, IfNotPresent or Never`},
		{"", "global: {proxy: {imgae: x}}", `values: json: unknown field "imgae"`},
		{"", "global: {nativeSidecars: maybe}", `values: "maybe": want true, false or auto`},
		{"", "global: {pilotCertProvider: kubernetes}", `values: global.pilotCertProvider: "kubernetes": want istiod or none (the agent supports no other)`},
	} {
		_, err := ParseConfig([]byte(c.config), []byte(c.values))
		require.Error(t, err, "%s %s", c.config, c.values)
		assert.Contains(t, err.Error(), c.want)
	}
	_, err := ParseConfig(nil, []byte("global: {tag: 1.30}"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "YAML reads it as the number 1.3 (a trailing 0 is lost): quote it as written", "YAML has lost the tag's 0 already")
	cfg, err := ParseConfig(nil, []byte("global: {tag: 2, proxy: {image: proxyv2}}"))
	require.NoError(t, err)
	assert.Equal(t, Scalar("2"), cfg.Values.Global.Tag, "a whole number is a tag")
}

// Native sidecars: the injector's default (its detection), the values' true or false over
// it, the pod's annotation over both.
func TestNativeSidecarPrecedence(t *testing.T) {
	pod := func(annotations map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop", Annotations: annotations},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	}
	native := func(values string, detected bool, annotations map[string]string) bool {
		cfg, err := ParseConfig(nil, []byte(values))
		require.NoError(t, err)
		res, err := Inject(cfg, nil, Input{Pod: pod(annotations), NativeSidecars: detected})
		require.NoError(t, err)
		return findContainer(res.Pod, ProxyContainer).RestartPolicy != nil
	}
	assert.True(t, native("", true, nil))
	assert.False(t, native("", false, nil))
	assert.True(t, native("global: {nativeSidecars: auto}", true, nil))
	assert.False(t, native("global: {nativeSidecars: false}", true, nil))
	assert.True(t, native("global: {nativeSidecars: true}", false, nil))
	assert.False(t, native("global: {nativeSidecars: true}", true, map[string]string{"sidecar.istio.io/nativeSidecar": "false"}))
	assert.True(t, native("global: {nativeSidecars: false}", false, map[string]string{"sidecar.istio.io/nativeSidecar": "true"}))
}
