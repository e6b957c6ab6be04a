package inject

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"istio.io/api/annotation"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names the template gives what it adds (Istio's).
const (
	ProxyContainer = "istio-proxy"
	InitContainer  = "istio-init"
	// PodInfoDir is where the downward-API labels and annotations are mounted: the agent's
	// --podInfoDir (agent/podinfo.DefaultDir).
	PodInfoDir = "/etc/istio/pod"
	// ProxyConfigDir is where the agent writes the proxy's bootstrap (--configPath).
	ProxyConfigDir = "/etc/istio/proxy"
	// ReadinessPort is the proxy's readiness listener (/healthz/ready, routed to the agent).
	ReadinessPort = 15021
	// ProxyUID is the proxy's user and group, which REDIRECT's rules exempt from capture.
	ProxyUID = 1337
	// bootstrapOverrideDir holds the ConfigMap of sidecar.istio.io/bootstrapOverride.
	bootstrapOverrideDir = "/etc/istio/custom-bootstrap"
)

// The volumes the template adds, as Istio's template names them.
const (
	volumeEnvoy            = "istio-envoy"
	volumeData             = "istio-data"
	volumePodInfo          = "istio-podinfo"
	volumeBootstrap        = "custom-bootstrap-volume"
	volumeWorkloadSocket   = "workload-socket"
	volumeCredentialSocket = "credential-socket"
	volumeWorkloadCerts    = "workload-certs"
	volumeToken            = "istio-token"
	volumeMeshRoot         = "istiod-ca-cert"
)

// Where the proxy container has the identity volumes (Istio's paths, which the agent's
// defaults name).
const (
	// TokenDir holds istio-token, the projected service-account token whose audience is
	// the CA's (agent/sidecar.KubernetesTokenFile).
	TokenDir = "/var/run/secrets/tokens"
	// TokenFile is the token's name in TokenDir.
	TokenFile = "istio-token"
	// TokenExpirationSeconds is the token's requested lifetime (Istio's 12 hours; the
	// kubelet renews it before it ends).
	TokenExpirationSeconds = 43200
	// MeshRootDir holds root-cert.pem, the mesh root from the ConfigMap MeshRootConfigMap
	// (agent/sidecar.DefaultCARootFile, relative to the proxy's root).
	MeshRootDir = "/var/run/secrets/istio"
	// MeshRootConfigMap is the ConfigMap discovery publishes its root in, in every
	// namespace (controlplane/ca's rootcm.go).
	MeshRootConfigMap = "istio-ca-root-cert"
	// WorkloadSocketDir holds the agent's SDS socket (agent/sds.DefaultSocketPath).
	WorkloadSocketDir = "/var/run/secrets/workload-spiffe-uds"
	// CredentialSocketDir and WorkloadCertsDir are Istio's too: a credential socket and
	// workload certificates a pod may provide itself (empty here, as in Istio by default).
	CredentialSocketDir = "/var/run/secrets/credential-uds"
	WorkloadCertsDir    = "/var/run/secrets/workload-spiffe-credentials"
)

// plan is everything the template needs about one pod, decided before anything is built.
type plan struct {
	cfg  *Config
	mesh *meshconfig.MeshConfig
	pc   *meshconfig.ProxyConfig // effective: mesh defaultConfig, then proxy.istio.io/config
	pod  *corev1.Pod             // the input (read only)
	ns   string
	wl   Workload
	// mode is the interception mode: REDIRECT (istio-init's iptables) or NONE.
	mode string
	// native: the proxy is an init container with restartPolicy Always; hold: the proxy
	// comes first with a postStart that waits for it (never both).
	native, hold bool
	statusPort   int32 // 0: no status server probes
	lifecycle    *corev1.Lifecycle
	apps         []string // the application containers, in order
}

// annotationOr is the pod's annotation name, else def.
func (p *plan) annotationOr(name, def string) string {
	if v, ok := p.pod.Annotations[name]; ok {
		return v
	}
	return def
}

// image is the annotation's image if it is a full reference, else hub/name:tag for a name
// (Istio's rule), else the value itself.
func (p *plan) image(value string) string {
	if v := p.pod.Annotations[annotation.SidecarProxyImage.Name]; strings.Contains(v, "/") {
		return v
	}
	if strings.Contains(value, "/") {
		return value
	}
	g := p.cfg.Values.Global
	return g.Hub + "/" + value + ":" + string(g.Tag)
}

// proxyContainer is the istio-proxy container: `agent proxy sidecar` with the pod's
// identity in its environment.
func (p *plan) proxyContainer() (corev1.Container, error) {
	env, err := p.proxyEnv()
	if err != nil {
		return corev1.Container{}, err
	}
	c := corev1.Container{
		Name:            ProxyContainer,
		Image:           p.image(p.cfg.Values.Global.Proxy.Image),
		Command:         []string{p.cfg.Values.Global.Proxy.AgentPath},
		Args:            p.proxyArgs(),
		Ports:           []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090, Protocol: corev1.ProtocolTCP}},
		Env:             env,
		ImagePullPolicy: p.cfg.Values.Global.ImagePullPolicy,
		Lifecycle:       p.lifecycle,
		Resources:       p.resources(),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptrTo(p.cfg.Values.Global.Proxy.Privileged),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			Privileged:               ptrTo(p.cfg.Values.Global.Proxy.Privileged),
			ReadOnlyRootFilesystem:   ptrTo(true),
			RunAsGroup:               ptrTo(int64(ProxyUID)),
			RunAsNonRoot:             ptrTo(true),
			RunAsUser:                ptrTo(int64(ProxyUID)),
		},
		VolumeMounts: p.proxyMounts(),
	}
	if p.native {
		c.RestartPolicy = ptrTo(corev1.ContainerRestartPolicyAlways)
	}
	if p.statusPort != 0 {
		p.addProbes(&c)
	}
	if v, ok := p.pod.Annotations[annotation.SidecarUserVolumeMount.Name]; ok {
		mounts, err := userVolumeMounts(v)
		if err != nil {
			return c, annotationError(annotation.SidecarUserVolumeMount.Name, v, err)
		}
		c.VolumeMounts = append(c.VolumeMounts, mounts...)
	}
	return c, nil
}

// proxyMounts are the proxy's mounts, in Istio's order: the SDS socket's directory, the
// credential socket's and workload certificates' (empty), the mesh root (with the istiod
// certificate provider), the agent's data, the bootstrap override, the bootstrap's
// directory (which holds the XDS socket), the CA token and the pod's labels and annotations.
func (p *plan) proxyMounts() []corev1.VolumeMount {
	ms := []corev1.VolumeMount{
		{Name: volumeWorkloadSocket, MountPath: WorkloadSocketDir},
		{Name: volumeCredentialSocket, MountPath: CredentialSocketDir},
		{Name: volumeWorkloadCerts, MountPath: WorkloadCertsDir},
	}
	if p.cfg.Values.Global.PilotCertProvider == CertProviderIstiod {
		ms = append(ms, corev1.VolumeMount{Name: volumeMeshRoot, MountPath: MeshRootDir})
	}
	ms = append(ms, corev1.VolumeMount{Name: volumeData, MountPath: "/var/lib/istio/data"})
	if _, ok := p.pod.Annotations[annotation.SidecarBootstrapOverride.Name]; ok {
		ms = append(ms, corev1.VolumeMount{Name: volumeBootstrap, MountPath: bootstrapOverrideDir})
	}
	return append(ms,
		corev1.VolumeMount{Name: volumeEnvoy, MountPath: ProxyConfigDir},
		corev1.VolumeMount{Name: volumeToken, MountPath: TokenDir},
		corev1.VolumeMount{Name: volumePodInfo, MountPath: PodInfoDir})
}

// proxyArgs are the agent's flags: where the template mounts what it reads and writes, so
// that they hold wherever the mounts are (the local node rewrites mount paths in them).
func (p *plan) proxyArgs() []string {
	px := p.cfg.Values.Global.Proxy
	args := []string{"proxy", "sidecar",
		"--proxyLogLevel=" + p.annotationOr(annotation.SidecarLogLevel.Name, px.LogLevel),
		"--proxyComponentLogLevel=" + p.annotationOr(annotation.SidecarComponentLogLevel.Name, px.ComponentLogLevel),
		"--log_output_level=" + p.annotationOr(annotation.SidecarAgentLogLevel.Name, p.cfg.Values.Global.Logging.Level),
		"--configPath=" + ProxyConfigDir,
		"--podInfoDir=" + PodInfoDir,
	}
	if px.BinaryPath != "" {
		args = append(args, "--binaryPath="+px.BinaryPath)
	}
	if p.statusPort != 0 {
		args = append(args, "--statusPort="+strconv.Itoa(int(p.statusPort)))
	}
	if ports, ok := p.pod.Annotations[annotation.SidecarStatusReadinessApplicationPorts.Name]; ok && strings.TrimSpace(ports) != "" {
		args = append(args, "--applicationPorts="+strings.ReplaceAll(ports, " ", ""))
	}
	return args
}

// fieldEnv is an environment variable from the downward API.
func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

// proxyEnv is the agent's environment, in Istio's order: the pod's identity through the
// downward API, PROXY_CONFIG, node metadata (ISTIO_META_*), then ProxyConfig's
// proxyMetadata (EXIT_ON_ZERO_ACTIVE_CONNECTIONS, MINIMUM_DRAIN_DURATION, ...).
func (p *plan) proxyEnv() ([]corev1.EnvVar, error) {
	pcJSON, err := proxyConfigJSON(p.pc)
	if err != nil {
		return nil, err
	}
	ports, err := podPorts(&p.pod.Spec)
	if err != nil {
		return nil, err
	}
	g := p.cfg.Values.Global
	env := []corev1.EnvVar{
		{Name: "PILOT_CERT_PROVIDER", Value: g.PilotCertProvider},
		{Name: "CA_ADDR", Value: g.CAAddress},
		fieldEnv("POD_NAME", "metadata.name"),
		fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("INSTANCE_IP", "status.podIP"),
		fieldEnv("SERVICE_ACCOUNT", "spec.serviceAccountName"),
		fieldEnv("HOST_IP", "status.hostIP"),
		{Name: "PROXY_CONFIG", Value: pcJSON},
		{Name: "ISTIO_META_POD_PORTS", Value: ports},
		{Name: "ISTIO_META_APP_CONTAINERS", Value: strings.Join(p.apps, ",")},
		// The Go runtime collects harder near the container's memory limit.
		{Name: "GOMEMLIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
			Resource: "limits.memory", Divisor: resource.MustParse("1")}}},
		{Name: "ISTIO_META_CLUSTER_ID", Value: g.MultiCluster.ClusterName},
		fieldEnv("ISTIO_META_NODE_NAME", "spec.nodeName"),
		{Name: "ISTIO_META_INTERCEPTION_MODE", Value: p.mode},
	}
	if g.Network != "" {
		env = append(env, corev1.EnvVar{Name: "ISTIO_META_NETWORK", Value: g.Network})
	}
	if name := p.workloadName(); name != "" {
		env = append(env, corev1.EnvVar{Name: "ISTIO_META_WORKLOAD_NAME", Value: name})
	}
	if owner := p.wl.owner(p.ns); owner != "" {
		env = append(env, corev1.EnvVar{Name: "ISTIO_META_OWNER", Value: owner})
	}
	if _, ok := p.pod.Annotations[annotation.SidecarBootstrapOverride.Name]; ok {
		env = append(env, corev1.EnvVar{Name: "ISTIO_BOOTSTRAP_OVERRIDE", Value: bootstrapOverrideDir + "/custom_bootstrap.json"})
	}
	meshID := g.MeshID
	if meshID == "" {
		meshID = p.mesh.GetTrustDomain()
	}
	if meshID != "" {
		env = append(env, corev1.EnvVar{Name: "ISTIO_META_MESH_ID", Value: meshID})
	}
	td := p.mesh.GetTrustDomain()
	if td == "" {
		td = g.TrustDomain
	}
	if td != "" {
		env = append(env, corev1.EnvVar{Name: "TRUST_DOMAIN", Value: td})
	}
	for _, k := range sortedKeys(p.pc.GetProxyMetadata()) {
		env = append(env, corev1.EnvVar{Name: k, Value: p.pc.GetProxyMetadata()[k]})
	}
	return env, nil
}

// podPorts is ISTIO_META_POD_PORTS: every application container's ports, as JSON in the
// API's shape, the protocol filled as the API server defaults it (so the webhook and
// kube-inject write the same).
func podPorts(spec *corev1.PodSpec) (string, error) {
	ports := []corev1.ContainerPort{}
	for _, c := range spec.Containers {
		if c.Name == ProxyContainer {
			continue
		}
		for _, port := range c.Ports {
			if port.Protocol == "" {
				port.Protocol = corev1.ProtocolTCP
			}
			ports = append(ports, port)
		}
	}
	b, err := json.Marshal(ports)
	if err != nil {
		return "", fmt.Errorf("ISTIO_META_POD_PORTS: %w", err)
	}
	return string(b), nil
}

// addProbes gives the proxy Istio's readiness (and startup) probe: the proxy's readiness
// listener, which answers once the agent says the proxy is ready.
func (p *plan) addProbes(c *corev1.Container) {
	px := p.cfg.Values.Global.Proxy
	num := func(name string, def int32) int32 {
		if v, ok := p.pod.Annotations[name]; ok {
			n, _ := strconv.ParseInt(v, 10, 32) // checked
			return int32(n)
		}
		return def
	}
	ready := corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(ReadinessPort)}}
	if *px.StartupProbe.Enabled {
		c.StartupProbe = &corev1.Probe{ProbeHandler: ready, InitialDelaySeconds: 0, PeriodSeconds: 1, TimeoutSeconds: 3,
			FailureThreshold: *px.StartupProbe.FailureThreshold}
	}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: ready,
		InitialDelaySeconds: num(annotation.SidecarStatusReadinessInitialDelaySeconds.Name, *px.ReadinessInitialDelaySeconds),
		PeriodSeconds:       num(annotation.SidecarStatusReadinessPeriodSeconds.Name, *px.ReadinessPeriodSeconds),
		TimeoutSeconds:      3,
		FailureThreshold:    num(annotation.SidecarStatusReadinessFailureThreshold.Name, *px.ReadinessFailureThreshold),
	}
}

// resources are the sidecar's: the pod's sidecar.istio.io/proxyCPU, proxyMemory,
// proxyCPULimit and proxyMemoryLimit when it has any of them (only those), else the
// values' defaults.
func (p *plan) resources() corev1.ResourceRequirements {
	var r corev1.ResourceRequirements
	set := func(list *corev1.ResourceList, name string, res corev1.ResourceName) {
		if v, ok := p.pod.Annotations[name]; ok {
			if *list == nil {
				*list = corev1.ResourceList{}
			}
			(*list)[res] = resource.MustParse(v) // checked
		}
	}
	set(&r.Requests, annotation.SidecarProxyCPU.Name, corev1.ResourceCPU)
	set(&r.Requests, annotation.SidecarProxyMemory.Name, corev1.ResourceMemory)
	set(&r.Limits, annotation.SidecarProxyCPULimit.Name, corev1.ResourceCPU)
	set(&r.Limits, annotation.SidecarProxyMemoryLimit.Name, corev1.ResourceMemory)
	if r.Requests == nil && r.Limits == nil {
		return *p.cfg.Values.Global.Proxy.Resources.DeepCopy()
	}
	return r
}

// initContainer is istio-init: Istio's istio-iptables installing the REDIRECT rules (all
// inbound TCP to 15006, all outbound to 15001, the proxy's own traffic and the ports of
// its health and metrics exempt), in the init image (the sidecar image has no iptables).
func (p *plan) initContainer() corev1.Container {
	px := p.cfg.Values.Global.Proxy
	exclude := "15090,15021"
	if p.statusPort != 0 {
		exclude += "," + strconv.Itoa(int(p.statusPort))
	}
	if v := p.annotationOr(annotation.SidecarTrafficExcludeInboundPorts.Name, px.ExcludeInboundPorts); v != "" {
		exclude += "," + v
	}
	args := []string{"istio-iptables",
		"-p", "15001", "-z", "15006", "-u", strconv.Itoa(ProxyUID), "-m", p.mode,
		"-i", p.annotationOr(annotation.SidecarTrafficIncludeOutboundIPRanges.Name, px.IncludeIPRanges),
		"-x", p.annotationOr(annotation.SidecarTrafficExcludeOutboundIPRanges.Name, px.ExcludeIPRanges),
		"-b", p.annotationOr(annotation.SidecarTrafficIncludeInboundPorts.Name, px.IncludeInboundPorts),
		"-d", exclude,
	}
	if v := p.annotationOr(annotation.SidecarTrafficIncludeOutboundPorts.Name, px.IncludeOutboundPorts); v != "" {
		args = append(args, "-q", v)
	}
	if v := p.annotationOr(annotation.SidecarTrafficExcludeOutboundPorts.Name, px.ExcludeOutboundPorts); v != "" {
		args = append(args, "-o", v)
	}
	if v, ok := p.pod.Annotations[annotation.SidecarTrafficKubevirtInterfaces.Name]; ok {
		args = append(args, "-k", v)
	}
	if v, ok := p.pod.Annotations[annotation.SidecarTrafficExcludeInterfaces.Name]; ok {
		args = append(args, "-c", v)
	}
	args = append(args, "--log_output_level="+p.annotationOr(annotation.SidecarAgentLogLevel.Name, p.cfg.Values.Global.Logging.Level))
	return corev1.Container{
		Name:            InitContainer,
		Image:           p.image(p.cfg.Values.Global.ProxyInit.Image),
		Args:            args,
		ImagePullPolicy: p.cfg.Values.Global.ImagePullPolicy,
		Resources:       p.resources(),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptrTo(px.Privileged),
			Capabilities:             &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}, Drop: []corev1.Capability{"ALL"}},
			Privileged:               ptrTo(px.Privileged),
			ReadOnlyRootFilesystem:   ptrTo(false),
			RunAsGroup:               ptrTo(int64(0)),
			RunAsNonRoot:             ptrTo(false),
			RunAsUser:                ptrTo(int64(0)),
		},
	}
}

// volumes are the template's, in Istio's order: the sockets' and workload certificates'
// directories, bootstrapOverride's ConfigMap, the bootstrap's directory (in memory), the
// agent's data, the downward-API labels and annotations the agent reads, the CA token
// (a service-account token bound to the pod, for the CA's audience), the mesh root; then
// the pod's own (userVolume).
func (p *plan) volumes() ([]corev1.Volume, error) {
	empty := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	vols := []corev1.Volume{empty(volumeWorkloadSocket), empty(volumeCredentialSocket), empty(volumeWorkloadCerts)}
	if name, ok := p.pod.Annotations[annotation.SidecarBootstrapOverride.Name]; ok {
		vols = append(vols, corev1.Volume{Name: volumeBootstrap, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}}}})
	}
	vols = append(vols,
		corev1.Volume{Name: volumeEnvoy, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		empty(volumeData),
		corev1.Volume{Name: volumePodInfo, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
			{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}},
		}}}},
		corev1.Volume{Name: volumeToken, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: TokenFile, Audience: p.cfg.Values.Global.SDS.Token.Aud,
				ExpirationSeconds: ptrTo(int64(TokenExpirationSeconds))}},
		}}}})
	if p.cfg.Values.Global.PilotCertProvider == CertProviderIstiod {
		vols = append(vols, corev1.Volume{Name: volumeMeshRoot, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: MeshRootConfigMap}}}})
	}
	if v, ok := p.pod.Annotations[annotation.SidecarUserVolume.Name]; ok {
		user, err := userVolumes(v)
		if err != nil {
			return nil, annotationError(annotation.SidecarUserVolume.Name, v, err)
		}
		vols = append(vols, user...)
	}
	return vols, nil
}
