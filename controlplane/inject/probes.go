package inject

import (
	"encoding/json"
	"fmt"
	"strconv"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProbersEnv holds the application's probes as the agent runs them (agent/probe).
const ProbersEnv = "ISTIO_KUBE_APP_PROBERS"

// prober is one probe in ISTIO_KUBE_APP_PROBERS, in the shape agent/probe decodes strictly.
type prober struct {
	HTTPGet        *corev1.HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *corev1.GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32                   `json:"timeoutSeconds,omitempty"`
}

// rewriteProbes sends the application's HTTP, TCP and gRPC probes through the agent, as
// Istio does: each becomes an httpGet of /app-health/<container>/<readyz|livez|startupz> on
// the status port, and the original goes to the agent in ISTIO_KUBE_APP_PROBERS, a named
// port resolved to its number. The kubelet's plain requests would otherwise meet the proxy
// (REDIRECT), or mutual TLS. Exec probes stay; so do probes already on the status port, and
// probes naming a port the container does not have (Istio leaves those too). Lifecycle
// hooks are not rewritten: the agent serves probes only.
func rewriteProbes(pod *corev1.Pod, statusPort int32) (string, error) {
	probers := map[string]prober{}
	rewrite := func(c *corev1.Container) {
		ports := map[string]int32{}
		for _, p := range c.Ports {
			if p.Name != "" {
				ports[p.Name] = p.ContainerPort
			}
		}
		for kind, pr := range map[string]**corev1.Probe{"readyz": &c.ReadinessProbe, "livez": &c.LivenessProbe, "startupz": &c.StartupProbe} {
			path := "/app-health/" + c.Name + "/" + kind
			orig, ok := agentProber(*pr, ports, statusPort)
			if !ok {
				continue
			}
			probers[path] = orig
			np := (*pr).DeepCopy()
			np.ProbeHandler = corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(statusPort), Scheme: corev1.URISchemeHTTP}}
			*pr = np
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name != ProxyContainer {
			rewrite(&pod.Spec.InitContainers[i])
		}
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name != ProxyContainer {
			rewrite(&pod.Spec.Containers[i])
		}
	}
	if len(probers) == 0 {
		return "", nil
	}
	b, err := json.Marshal(probers) // keys sorted
	if err != nil {
		return "", fmt.Errorf("%s: %w", ProbersEnv, err)
	}
	return string(b), nil
}

// agentProber is the probe as the agent runs it, with what the API server defaults filled
// in (so a pod through the webhook and through kube-inject get the same), or false when the
// probe stays as it is.
func agentProber(p *corev1.Probe, ports map[string]int32, statusPort int32) (prober, bool) {
	if p == nil {
		return prober{}, false
	}
	resolve := func(port intstr.IntOrString) (intstr.IntOrString, bool) {
		if port.Type == intstr.String {
			if n, err := strconv.Atoi(port.StrVal); err == nil {
				return intstr.FromInt32(int32(n)), n != int(statusPort)
			}
			n, ok := ports[port.StrVal]
			return intstr.FromInt32(n), ok
		}
		return port, port.IntVal != statusPort
	}
	out := prober{TimeoutSeconds: p.TimeoutSeconds}
	if out.TimeoutSeconds == 0 {
		out.TimeoutSeconds = 1
	}
	ok := false
	switch {
	case p.HTTPGet != nil:
		h := p.HTTPGet.DeepCopy()
		h.Port, ok = resolve(h.Port)
		if h.Scheme == "" {
			h.Scheme = corev1.URISchemeHTTP
		}
		out.HTTPGet = h
	case p.TCPSocket != nil:
		t := p.TCPSocket.DeepCopy()
		t.Port, ok = resolve(t.Port)
		out.TCPSocket = t
	case p.GRPC != nil:
		g := p.GRPC.DeepCopy()
		ok = g.Port != statusPort
		if g.Service != nil && *g.Service == "" {
			g.Service = nil
		}
		out.GRPC = g
	}
	return out, ok
}

// shouldRewriteProbes: the pod's sidecar.istio.io/rewriteAppHTTPProbers, else the values'.
func (p *plan) shouldRewriteProbes() bool {
	if v, ok := p.pod.Annotations[annotation.SidecarRewriteAppHTTPProbers.Name]; ok {
		b, _ := strconv.ParseBool(v) // checked
		return b
	}
	return *p.cfg.Values.SidecarInjectorWebhook.RewriteAppHTTPProbe
}
