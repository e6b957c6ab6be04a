package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The files of the injector's configuration, as Istio's istio-sidecar-injector ConfigMap
// holds them (its keys, mounted as files of one directory).
const (
	ConfigFile = "config"
	ValuesFile = "values"
)

// Policy is the injection policy of the namespaces the webhook is called for: Istio's
// "enabled" injects unless the pod opts out, "disabled" only pods that opt in.
type Policy string

// The policies.
const (
	PolicyEnabled  Policy = "enabled"
	PolicyDisabled Policy = "disabled"
)

// Config is the injector's configuration: the "config" key of Istio's
// istio-sidecar-injector ConfigMap (policy, selectors, injected annotations) and its
// "values" key (the documented subset of Istio's Helm values the template reads). The
// template itself is Go code: Istio's templates, defaultTemplates and aliases are refused.
type Config struct {
	Policy Policy `json:"policy,omitempty"`
	// NeverInjectSelector and AlwaysInjectSelector decide a pod that says nothing itself
	// (no sidecar.istio.io/inject label or annotation): the first match among the never
	// selectors leaves it alone, else the first among the always selectors injects it.
	NeverInjectSelector  []metav1.LabelSelector `json:"neverInjectSelector,omitempty"`
	AlwaysInjectSelector []metav1.LabelSelector `json:"alwaysInjectSelector,omitempty"`
	// InjectedAnnotations are added to every injected pod.
	InjectedAnnotations map[string]string `json:"injectedAnnotations,omitempty"`
	// DefaultTemplates may only name Istio's "sidecar": the one template there is.
	DefaultTemplates []string `json:"defaultTemplates,omitempty"`

	Values Values `json:"-"`
}

// Values is the subset of Istio's Helm values the template reads (global.* and
// sidecarInjectorWebhook.*), plus wasmesh's own fields, marked so.
type Values struct {
	Global                 GlobalValues  `json:"global"`
	SidecarInjectorWebhook WebhookValues `json:"sidecarInjectorWebhook"`
}

// GlobalValues are Istio's global values.
type GlobalValues struct {
	// Hub and Tag complete an image name without "/" (Istio's hub/image:tag).
	Hub             string            `json:"hub,omitempty"`
	Tag             Scalar            `json:"tag,omitempty"`
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	Proxy           ProxyValues       `json:"proxy"`
	ProxyInit       ProxyInitValues   `json:"proxy_init"`
	Logging         struct {
		// Level is the agent's --log_output_level (default "default:info").
		Level string `json:"level,omitempty"`
	} `json:"logging"`
	MultiCluster struct {
		ClusterName string `json:"clusterName,omitempty"` // ISTIO_META_CLUSTER_ID (default Kubernetes)
	} `json:"multiCluster"`
	MeshID  string `json:"meshID,omitempty"`  // ISTIO_META_MESH_ID (default the trust domain)
	Network string `json:"network,omitempty"` // ISTIO_META_NETWORK
	// IstioNamespace is discovery's namespace, in the default CA address (istio-system).
	IstioNamespace string `json:"istioNamespace,omitempty"`
	// CAAddress is the sidecar's CA_ADDR (default istiod.<istioNamespace>.svc:15012, the
	// istiod Service's TLS port, where discovery serves xDS and its CA).
	CAAddress string `json:"caAddress,omitempty"`
	// PilotCertProvider is the sidecar's PILOT_CERT_PROVIDER: istiod (the default: the
	// mesh root, the ConfigMap istio-ca-root-cert, is mounted) or none (the agent requests
	// no certificate; nothing mounted).
	PilotCertProvider string `json:"pilotCertProvider,omitempty"`
	// TrustDomain is the sidecar's TRUST_DOMAIN when the mesh config has none.
	TrustDomain string `json:"trustDomain,omitempty"`
	SDS         struct {
		Token struct {
			// Aud is the audience of the projected service-account token istio-token,
			// the credential discovery checks by TokenReview (istio-ca).
			Aud string `json:"aud,omitempty"`
		} `json:"token"`
	} `json:"sds"`
	// NativeSidecars (wasmesh) runs the proxy as a Kubernetes native sidecar (an init
	// container with restartPolicy Always): true, false, or auto (Istio's
	// ENABLE_NATIVE_SIDECARS: when every node's kubelet is 1.33 or later). Empty: what the
	// injector was started with (discovery's ENABLE_NATIVE_SIDECARS, default auto).
	NativeSidecars NativeMode `json:"nativeSidecars,omitempty"`
}

// ProxyValues are Istio's global.proxy values.
type ProxyValues struct {
	// Image is the sidecar image: a full reference (with a "/"), or a name completed with
	// hub and tag. Default wasmesh/proxyv2 (agent/Dockerfile's image).
	Image string `json:"image,omitempty"`
	// AgentPath (wasmesh) is the agent binary inside the image, the sidecar's command
	// (default /usr/local/bin/agent).
	AgentPath string `json:"agentPath,omitempty"`
	// BinaryPath (wasmesh) is the proxy binary inside the image, the agent's --binaryPath
	// (default none: ProxyConfig binaryPath, else the agent's /usr/local/bin/envoy);
	// /usr/local/bin/meshproxy for agent/Dockerfile's meshproxy image.
	BinaryPath        string `json:"binaryPath,omitempty"`
	LogLevel          string `json:"logLevel,omitempty"`          // --proxyLogLevel (warning)
	ComponentLogLevel string `json:"componentLogLevel,omitempty"` // --proxyComponentLogLevel (misc:error)
	ClusterDomain     string `json:"clusterDomain,omitempty"`     // cluster.local
	Privileged        bool   `json:"privileged,omitempty"`
	// StatusPort is the agent's status port unless the pod or ProxyConfig says otherwise
	// (15020; 0 turns the readiness probe and probe rewriting off).
	StatusPort                   *int32 `json:"statusPort,omitempty"`
	ReadinessInitialDelaySeconds *int32 `json:"readinessInitialDelaySeconds,omitempty"` // 0
	ReadinessPeriodSeconds       *int32 `json:"readinessPeriodSeconds,omitempty"`       // 15
	ReadinessFailureThreshold    *int32 `json:"readinessFailureThreshold,omitempty"`    // 4
	StartupProbe                 struct {
		Enabled          *bool  `json:"enabled,omitempty"`          // true
		FailureThreshold *int32 `json:"failureThreshold,omitempty"` // 600
	} `json:"startupProbe"`
	// Resources of the sidecar unless the pod's sidecar.istio.io/proxyCPU... annotations
	// say (requests 100m, 128Mi; limits 2000m, 1024Mi).
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
	// HoldApplicationUntilProxyStarts is the default of ProxyConfig's field of that name.
	HoldApplicationUntilProxyStarts *bool `json:"holdApplicationUntilProxyStarts,omitempty"`
	// Lifecycle replaces the sidecar's lifecycle the template would give it, in every pod.
	Lifecycle *corev1.Lifecycle `json:"lifecycle,omitempty"`
	// PreStopSleepSeconds (wasmesh) is the preStop sleep that keeps a held proxy running
	// while the application stops (15, seed 004's).
	PreStopSleepSeconds *int64 `json:"preStopSleepSeconds,omitempty"`
	// Traffic capture of istio-init (REDIRECT), unless the pod's traffic.sidecar.istio.io
	// annotations say.
	IncludeIPRanges      string `json:"includeIPRanges,omitempty"`     // *
	ExcludeIPRanges      string `json:"excludeIPRanges,omitempty"`     // none
	IncludeInboundPorts  string `json:"includeInboundPorts,omitempty"` // *
	ExcludeInboundPorts  string `json:"excludeInboundPorts,omitempty"`
	IncludeOutboundPorts string `json:"includeOutboundPorts,omitempty"`
	ExcludeOutboundPorts string `json:"excludeOutboundPorts,omitempty"`
}

// ProxyInitValues are Istio's global.proxy_init values.
type ProxyInitValues struct {
	// Image runs istio-init's istio-iptables. The sidecar image has no iptables, so the
	// default is Istio's own proxyv2, whose istio-iptables installs the REDIRECT rules.
	Image string `json:"image,omitempty"`
}

// WebhookValues are Istio's sidecarInjectorWebhook values.
type WebhookValues struct {
	// RewriteAppHTTPProbe sends the application's probes through the agent (true).
	RewriteAppHTTPProbe *bool `json:"rewriteAppHTTPProbe,omitempty"`
}

// Scalar is a value Helm users write as a string or a whole number (a tag of 2).
type Scalar string

// UnmarshalJSON takes a string or a whole number. A fractional number is refused: YAML reads
// a tag of 1.30 as the number 1.3, which would name another image.
func (s *Scalar) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = Scalar(str)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want a string or a number, got %s", b)
	}
	if _, err := n.Int64(); err != nil {
		return fmt.Errorf("YAML reads it as the number %s (a trailing 0 is lost): quote it as written", n)
	}
	*s = Scalar(n.String())
	return nil
}

// NativeMode says when the proxy is a native sidecar.
type NativeMode string

// The modes: Istio's ENABLE_NATIVE_SIDECARS values.
const (
	NativeAuto  NativeMode = "auto"
	NativeTrue  NativeMode = "true"
	NativeFalse NativeMode = "false"
)

// ParseNativeMode reads true, false or auto.
func ParseNativeMode(s string) (NativeMode, error) {
	switch m := NativeMode(strings.ToLower(strings.TrimSpace(s))); m {
	case NativeAuto, NativeTrue, NativeFalse:
		return m, nil
	}
	return "", fmt.Errorf("%q: want true, false or auto", s)
}

// UnmarshalJSON takes a boolean or one of the mode's strings.
func (m *NativeMode) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var err error
	switch x := v.(type) {
	case bool:
		*m = NativeMode(strconv.FormatBool(x))
	case string:
		*m, err = ParseNativeMode(x)
	default:
		err = fmt.Errorf("%s: want true, false or auto", b)
	}
	return err
}

// Defaults of the values: the images the project builds (agent/Dockerfile) and Istio's
// numbers.
const (
	DefaultHub       = "docker.io/wasmesh"
	DefaultTag       = "latest"
	DefaultImage     = "proxyv2"
	DefaultInitImage = "docker.io/istio/proxyv2:1.30.3"
	DefaultAgentPath = "/usr/local/bin/agent"
	// CertProviderIstiod and CertProviderNone are the PILOT_CERT_PROVIDER values the agent
	// supports.
	CertProviderIstiod = "istiod"
	CertProviderNone   = "none"
)

// DefaultConfig is the configuration without a ConfigMap: injection enabled where the
// webhook is called, the project's image, Istio's defaults.
func DefaultConfig() *Config {
	c := &Config{Policy: PolicyEnabled}
	c.Values.fillDefaults()
	return c
}

func (v *Values) fillDefaults() {
	g := &v.Global
	p := &g.Proxy
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&g.Hub, DefaultHub)
	if g.Tag == "" {
		g.Tag = DefaultTag
	}
	def(&g.Logging.Level, "default:info")
	def(&g.MultiCluster.ClusterName, "Kubernetes")
	def(&g.IstioNamespace, "istio-system")
	def(&g.CAAddress, "istiod."+g.IstioNamespace+".svc:15012")
	def(&g.PilotCertProvider, CertProviderIstiod)
	def(&g.SDS.Token.Aud, "istio-ca")
	def(&p.Image, DefaultImage)
	def(&p.AgentPath, DefaultAgentPath)
	def(&p.LogLevel, "warning")
	def(&p.ComponentLogLevel, "misc:error")
	def(&p.ClusterDomain, "cluster.local")
	def(&p.IncludeIPRanges, "*")
	def(&p.IncludeInboundPorts, "*")
	def(&g.ProxyInit.Image, DefaultInitImage)
	i32 := func(f **int32, d int32) {
		if *f == nil {
			*f = &d
		}
	}
	i32(&p.StatusPort, 15020)
	i32(&p.ReadinessInitialDelaySeconds, 0)
	i32(&p.ReadinessPeriodSeconds, 15)
	i32(&p.ReadinessFailureThreshold, 4)
	i32(&p.StartupProbe.FailureThreshold, 600)
	if p.StartupProbe.Enabled == nil {
		p.StartupProbe.Enabled = ptrTo(true)
	}
	if p.PreStopSleepSeconds == nil {
		p.PreStopSleepSeconds = ptrTo(int64(15))
	}
	if p.Resources == nil {
		p.Resources = &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2000m"), corev1.ResourceMemory: resource.MustParse("1024Mi")},
		}
	}
	if v.SidecarInjectorWebhook.RewriteAppHTTPProbe == nil {
		v.SidecarInjectorWebhook.RewriteAppHTTPProbe = ptrTo(true)
	}
}

func ptrTo[T any](v T) *T { return &v }

// ParseConfig reads the ConfigMap's "config" and "values" texts (YAML or JSON; either may be
// empty) over the defaults. Unknown fields are errors naming the file and the field.
func ParseConfig(config, values []byte) (*Config, error) {
	c := &Config{}
	if err := strictYAML(ConfigFile, config, c); err != nil {
		return nil, err
	}
	if err := strictYAML(ValuesFile, values, &c.Values); err != nil {
		return nil, err
	}
	switch c.Policy {
	case "":
		c.Policy = PolicyEnabled
	case PolicyEnabled, PolicyDisabled:
	default:
		return nil, fmt.Errorf("%s: policy %q: want enabled or disabled", ConfigFile, c.Policy)
	}
	for _, t := range c.DefaultTemplates {
		if t != "sidecar" {
			return nil, fmt.Errorf("%s: defaultTemplates: %q: the sidecar template is the only one (it is built in)", ConfigFile, t)
		}
	}
	for i, sels := range [][]metav1.LabelSelector{c.NeverInjectSelector, c.AlwaysInjectSelector} {
		for j := range sels {
			if _, err := metav1.LabelSelectorAsSelector(&sels[j]); err != nil {
				return nil, fmt.Errorf("%s: %s[%d]: %w", ConfigFile, []string{"neverInjectSelector", "alwaysInjectSelector"}[i], j, err)
			}
		}
	}
	c.Values.fillDefaults()
	return c, c.Values.check()
}

// check refuses values that would make every injected pod broken.
func (v *Values) check() error {
	p := v.Global.Proxy
	if p.StatusPort != nil && (*p.StatusPort < 0 || *p.StatusPort > 65535) {
		return fmt.Errorf("%s: global.proxy.statusPort: %d is not a port", ValuesFile, *p.StatusPort)
	}
	if *p.PreStopSleepSeconds < 0 {
		return fmt.Errorf("%s: global.proxy.preStopSleepSeconds: %d is negative", ValuesFile, *p.PreStopSleepSeconds)
	}
	switch v.Global.PilotCertProvider {
	case CertProviderIstiod, CertProviderNone:
	default:
		return fmt.Errorf("%s: global.pilotCertProvider: %q: want istiod or none (the agent supports no other)", ValuesFile, v.Global.PilotCertProvider)
	}
	switch v.Global.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return fmt.Errorf("%s: global.imagePullPolicy: %q: want Always, IfNotPresent or Never", ValuesFile, v.Global.ImagePullPolicy)
	}
	return nil
}

// strictYAML decodes YAML or JSON into out; fields out does not have are errors.
func strictYAML(name string, data []byte, out any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("%s: invalid YAML: %w", name, err)
	}
	if string(js) == "null" {
		return nil
	}
	if err := rejectTemplates(name, js); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// rejectTemplates says why Istio's template fields are refused, rather than "unknown field".
func rejectTemplates(name string, js []byte) error {
	if name != ConfigFile {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil // the strict decode says what is wrong
	}
	for _, f := range []string{"templates", "aliases"} {
		if raw, ok := top[f]; ok && string(raw) != "null" && string(raw) != "{}" {
			return fmt.Errorf("%s: %s: wasmesh's sidecar template is built in (Go code); the values configure it", name, f)
		}
	}
	return nil
}

// LoadConfig reads dir/config and dir/values (a missing file is empty); no dir is
// DefaultConfig, a dir that is not there an error.
func LoadConfig(dir string) (*Config, error) {
	if dir == "" {
		return DefaultConfig(), nil
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("injector config: %s is not a directory (the istio-sidecar-injector ConfigMap's mount)", dir)
	}
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return b, err
	}
	cfg, err := read(ConfigFile)
	if err != nil {
		return nil, fmt.Errorf("injector config: %w", err)
	}
	vals, err := read(ValuesFile)
	if err != nil {
		return nil, fmt.Errorf("injector config: %w", err)
	}
	c, err := ParseConfig(cfg, vals)
	if err != nil {
		return nil, fmt.Errorf("injector config %s: %w", dir, err)
	}
	return c, nil
}
