package kubemesh

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// sidecar is what the sidecar of a pod needs to know from the mesh.
type sidecar struct {
	// discoveryAddress is where the proxies reach discovery: the service proxy of istiod.
	discoveryAddress string
	// proxyBinary is meshproxy's path (the agent's --binaryPath).
	proxyBinary string
	// drain is the proxy's terminationDrainDuration.
	drain time.Duration
	// holdApplication starts the application once the proxy is ready
	// (holdApplicationUntilProxyStarts: the proxy first, with a postStart `pilot-agent wait`).
	holdApplication bool
}

const (
	proxyContainer = "istio-proxy"
	statusPort     = 15020
)

// injectSidecar writes into a pod template what Istio's injector writes, for a pod of the
// local mesh (no traffic capture: INTERCEPTION_MODE NONE, the pod's localhost and pod IP
// from the node): an istio-proxy container running `pilot-agent proxy sidecar` with the
// pod's identity from the downward API, its labels and annotations as files, readiness on
// 15021, and every application container's httpGet readiness probe rewritten to the agent
// (/app-health/<container>/readyz, ISTIO_KUBE_APP_PROBERS). It stands in for the mutating
// webhook until that lands; a namespace labelled istio-injection=enabled will then do it.
func injectSidecar(tmpl *corev1.PodTemplateSpec, s sidecar) error {
	spec := &tmpl.Spec
	var ports []corev1.ContainerPort
	var appPorts string
	// Istio's prober shape: the action and the timeout, nothing else.
	type prober struct {
		HTTPGet        *corev1.HTTPGetAction `json:"httpGet"`
		TimeoutSeconds int32                 `json:"timeoutSeconds,omitempty"`
	}
	probers := map[string]prober{}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		for _, p := range c.Ports {
			ports = append(ports, p)
			if appPorts != "" {
				appPorts += ","
			}
			appPorts += strconv.Itoa(int(p.ContainerPort))
		}
		if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
			path := "/app-health/" + c.Name + "/readyz"
			probers[path] = prober{c.ReadinessProbe.HTTPGet, c.ReadinessProbe.TimeoutSeconds}
			rewritten := *c.ReadinessProbe
			rewritten.HTTPGet = &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(statusPort)}
			c.ReadinessProbe = &rewritten
		}
	}
	podPorts, err := json.Marshal(ports)
	if err != nil {
		return err
	}
	appProbers, err := json.Marshal(probers)
	if err != nil {
		return err
	}
	field := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	proxy := corev1.Container{
		Name:  proxyContainer,
		Image: "wasmesh/proxyv2:latest",
		Args: []string{"proxy", "sidecar", "--binaryPath=" + s.proxyBinary, "--configPath=/etc/istio/proxy",
			"--podInfoDir=/etc/istio/pod", "--certDir=/etc/certs", "--discoveryAddress=" + s.discoveryAddress,
			"--statusPort=" + strconv.Itoa(statusPort), "--applicationPorts=" + appPorts, "--concurrency=2"},
		Env: []corev1.EnvVar{
			field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"),
			field("INSTANCE_IP", "status.podIP"), field("SERVICE_ACCOUNT", "spec.serviceAccountName"),
			field("HOST_IP", "status.hostIP"),
			{Name: "ISTIO_META_INTERCEPTION_MODE", Value: "NONE"},
			{Name: "ISTIO_META_POD_PORTS", Value: string(podPorts)},
			{Name: "ISTIO_KUBE_APP_PROBERS", Value: string(appProbers)},
			{Name: "PROXY_CONFIG", Value: fmt.Sprintf(`{"terminationDrainDuration": %q}`, s.drain.String())},
		},
		Ports: []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090}},
		ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 3, ProbeHandler: corev1.ProbeHandler{
			HTTPGet: &corev1.HTTPGetAction{Path: "/healthz/ready", Port: intstr.FromInt32(15021)}}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "istio-envoy", MountPath: "/etc/istio/proxy"},
			{Name: "istio-podinfo", MountPath: "/etc/istio/pod"},
			{Name: "istio-certs", MountPath: "/etc/certs"},
		},
	}
	if s.holdApplication {
		proxy.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{"pilot-agent", "wait"}}}}
		spec.Containers = append([]corev1.Container{proxy}, spec.Containers...)
	} else {
		spec.Containers = append(spec.Containers, proxy)
	}
	item := func(name, path string) corev1.DownwardAPIVolumeFile {
		return corev1.DownwardAPIVolumeFile{Path: name, FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: "istio-envoy", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "istio-certs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "istio-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{item("labels", "metadata.labels"), item("annotations", "metadata.annotations")}}}})
	return nil
}
