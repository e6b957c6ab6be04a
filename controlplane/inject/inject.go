// Package inject is wasmesh's sidecar injector, Istio's: the template that adds the proxy
// (the agent) to a pod, the mutating admission webhook discovery serves it through
// (/inject), and kube-inject, the same template applied offline to workloads in YAML.
package inject

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"istio.io/api/annotation"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// Input is one pod to inject: a pod, or a workload's pod template as a pod.
type Input struct {
	Pod *corev1.Pod
	// Namespace is where the pod is created (the pod's own when it names one).
	Namespace string
	// Workload is what the pod belongs to (WorkloadOfPod for a pod).
	Workload Workload
	// NativeSidecars is whether the proxy is a native sidecar unless the values
	// (global.nativeSidecars true or false) or the pod (sidecar.istio.io/nativeSidecar) say.
	NativeSidecars bool
	// Offline is kube-inject: the namespace's policy is not known (see required).
	Offline bool
}

// Result is what injection made of a pod.
type Result struct {
	// Pod is the injected pod; nil when the pod is left as it is (Skipped says why).
	Pod      *corev1.Pod
	Skipped  string
	Warnings []string
}

// Inject applies the template to a copy of in.Pod. A pod the template reads a bad value
// from (an annotation, the mesh config) is an error naming it: nothing broken is injected.
func Inject(cfg *Config, mesh *meshconfig.MeshConfig, in Input) (*Result, error) {
	pod := in.Pod
	ns := pod.Namespace
	if ns == "" {
		ns = in.Namespace
	}
	already, err := injected(&pod.ObjectMeta)
	if err != nil {
		return nil, err
	}
	if already {
		return &Result{Skipped: "already injected (" + annotation.SidecarStatus.Name + ")"}, nil
	}
	d := required(cfg, &pod.ObjectMeta, &pod.Spec, ns, in.Offline)
	if !d.inject {
		return &Result{Skipped: d.reason, Warnings: d.warnings}, nil
	}
	p, err := newPlan(cfg, mesh, in, ns)
	if err != nil {
		return nil, err
	}
	out, err := p.apply()
	if err != nil {
		return nil, err
	}
	return &Result{Pod: out, Warnings: append(d.warnings, p.warnings()...)}, nil
}

// newPlan checks the pod's annotations and decides everything the template varies on.
func newPlan(cfg *Config, mesh *meshconfig.MeshConfig, in Input, ns string) (*plan, error) {
	pod := in.Pod
	if err := checkAnnotations(pod.Annotations); err != nil {
		return nil, err
	}
	pc, err := effectiveProxyConfig(mesh, pod.Annotations)
	if err != nil {
		return nil, err
	}
	p := &plan{cfg: cfg, mesh: mesh, pc: pc, pod: pod, ns: ns, wl: in.Workload, native: in.NativeSidecars}
	switch cfg.Values.Global.NativeSidecars { // auto: the caller's detection
	case NativeTrue:
		p.native = true
	case NativeFalse:
		p.native = false
	}
	p.mode = p.annotationOr(annotation.SidecarInterceptionMode.Name, pc.GetInterceptionMode().String())
	if v, ok := pod.Annotations[annotation.SidecarNativeSidecar.Name]; ok {
		p.native, _ = strconv.ParseBool(v) // checked
	}
	p.statusPort = *cfg.Values.Global.Proxy.StatusPort
	if pc.GetStatusPort() != 0 {
		p.statusPort = pc.GetStatusPort()
	}
	if v, ok := pod.Annotations[annotation.SidecarStatusPort.Name]; ok {
		n, _ := parsePort(v) // checked
		p.statusPort = int32(n)
	}
	hold := cfg.Values.Global.Proxy.HoldApplicationUntilProxyStarts
	if h := pc.GetHoldApplicationUntilProxyStarts(); h != nil {
		hold = ptrTo(h.GetValue())
	}
	// A native sidecar needs no hold: the kubelet starts the application once the proxy's
	// startup probe passes.
	p.hold = hold != nil && *hold && !p.native
	for _, c := range pod.Spec.Containers {
		if c.Name != ProxyContainer {
			p.apps = append(p.apps, c.Name)
		}
	}
	if p.lifecycle, err = p.chooseLifecycle(); err != nil {
		return nil, err
	}
	return p, nil
}

// chooseLifecycle is the proxy's lifecycle: the pod's own (LifecycleAnnotation), else the
// values' global.proxy.lifecycle, else seed 004's with holdApplicationUntilProxyStarts: a
// postStart `agent wait` that holds the next container until the proxy is ready, and a
// preStop sleep that keeps the proxy serving while the application stops (Kubernetes
// signals every container at once). A native sidecar needs neither: the kubelet starts it
// first and stops it last.
func (p *plan) chooseLifecycle() (*corev1.Lifecycle, error) {
	if v, ok := p.pod.Annotations[LifecycleAnnotation]; ok {
		lc, err := parseLifecycle(v)
		if err != nil {
			return nil, annotationError(LifecycleAnnotation, v, err)
		}
		return lc, nil
	}
	px := p.cfg.Values.Global.Proxy
	if px.Lifecycle != nil {
		return px.Lifecycle.DeepCopy(), nil
	}
	if !p.hold {
		return nil, nil
	}
	lc := &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{px.AgentPath, "wait"}}}}
	if *px.PreStopSleepSeconds > 0 {
		lc.PreStop = &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: *px.PreStopSleepSeconds}}
	}
	return lc, nil
}

// apply builds the injected pod.
func (p *plan) apply() (*corev1.Pod, error) {
	out := p.pod.DeepCopy()
	proxy, err := p.proxyContainer()
	if err != nil {
		return nil, err
	}
	if proxy, err = p.userOverride(out, proxy); err != nil {
		return nil, err
	}
	var inits []corev1.Container
	if p.mode != "NONE" {
		inits = append(inits, p.initContainer())
	}
	status := Status{Revision: "default"}
	spec := &out.Spec
	switch {
	case p.native: // istio-init, the proxy, then the pod's init containers: they are in the mesh
		inits = append(inits, proxy)
		spec.InitContainers = append(inits, spec.InitContainers...)
	case p.hold: // the proxy first, so that its postStart holds the application
		spec.InitContainers = append(spec.InitContainers, inits...)
		spec.Containers = append([]corev1.Container{proxy}, spec.Containers...)
	default: // iptables last among init containers, so that they are not captured
		spec.InitContainers = append(spec.InitContainers, inits...)
		spec.Containers = append(spec.Containers, proxy)
	}
	for _, c := range inits {
		status.InitContainers = append(status.InitContainers, c.Name)
	}
	if !p.native {
		status.Containers = []string{ProxyContainer}
	}
	vols, err := p.volumes()
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if slices.ContainsFunc(spec.Volumes, func(have corev1.Volume) bool { return have.Name == v.Name }) {
			return nil, fmt.Errorf("the pod has a volume named %s, which the sidecar adds", v.Name)
		}
		status.Volumes = append(status.Volumes, v.Name)
	}
	spec.Volumes = append(spec.Volumes, vols...)
	if err := p.postProcess(out, status); err != nil {
		return nil, err
	}
	return out, nil
}

// userOverride applies a container named istio-proxy that the pod brings itself over the
// template's, as Istio's custom injection does (a strategic merge: the fields it sets win,
// its env and ports merge by name), and takes it out of the pod.
func (p *plan) userOverride(pod *corev1.Pod, proxy corev1.Container) (corev1.Container, error) {
	var user *corev1.Container
	take := func(list []corev1.Container) []corev1.Container {
		return slices.DeleteFunc(list, func(c corev1.Container) bool {
			if c.Name == ProxyContainer {
				user = c.DeepCopy()
				return true
			}
			return false
		})
	}
	pod.Spec.Containers = take(pod.Spec.Containers)
	pod.Spec.InitContainers = take(pod.Spec.InitContainers)
	if user == nil {
		return proxy, nil
	}
	base, err := json.Marshal(proxy)
	if err != nil {
		return proxy, err
	}
	patch, err := json.Marshal(user)
	if err != nil {
		return proxy, err
	}
	merged, err := strategicpatch.StrategicMergePatch(base, patch, corev1.Container{})
	if err != nil {
		return proxy, fmt.Errorf("the pod's own %s container: %w", ProxyContainer, err)
	}
	var out corev1.Container
	if err := json.Unmarshal(merged, &out); err != nil {
		return proxy, fmt.Errorf("the pod's own %s container: %w", ProxyContainer, err)
	}
	return out, nil
}

// postProcess is what depends on the whole pod: labels and annotations, metrics merging,
// probe rewriting, and the status annotation that marks the pod injected.
func (p *plan) postProcess(pod *corev1.Pod, status Status) error {
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range p.canonicalLabels() {
		pod.Labels[k] = v
	}
	a := pod.Annotations
	a[annotation.IoIstioRev.Name] = "default"
	if len(p.apps) > 0 {
		for _, k := range []string{"kubectl.kubernetes.io/default-logs-container", "kubectl.kubernetes.io/default-container"} {
			if _, ok := a[k]; !ok {
				a[k] = p.apps[0]
			}
		}
	}
	proxy := findContainer(pod, ProxyContainer)
	promEnv, err := p.mergeMetrics(a)
	if err != nil {
		return err
	}
	if promEnv != "" {
		proxy.Env = append(proxy.Env, corev1.EnvVar{Name: PrometheusEnv, Value: promEnv})
	}
	if p.statusPort != 0 && p.shouldRewriteProbes() {
		probers, err := rewriteProbes(pod, p.statusPort)
		if err != nil {
			return err
		}
		proxy = findContainer(pod, ProxyContainer) // rewriteProbes may not move it, but be sure
		if probers != "" {
			proxy.Env = append(proxy.Env, corev1.EnvVar{Name: ProbersEnv, Value: probers})
		}
	}
	for _, k := range sortedKeys(p.cfg.InjectedAnnotations) {
		a[k] = p.cfg.InjectedAnnotations[k]
	}
	st, err := json.Marshal(status)
	if err != nil {
		return err
	}
	a[annotation.SidecarStatus.Name] = string(st)
	return nil
}

// findContainer is the named container of the pod, an init container or not.
func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// warnings are what the user should know about the injected pod: a grace period shorter
// than the proxy's shutdown (preStop sleep, then the drain) kills it mid-drain.
func (p *plan) warnings() []string {
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if g := p.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	need := 5 * time.Second
	if d := p.pc.GetTerminationDrainDuration(); d != nil {
		need = d.AsDuration()
	}
	if b, _ := strconv.ParseBool(p.pc.GetProxyMetadata()["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"]); b {
		need = 5 * time.Second
		if d, err := time.ParseDuration(p.pc.GetProxyMetadata()["MINIMUM_DRAIN_DURATION"]); err == nil {
			need = d
		}
	}
	if p.lifecycle != nil && p.lifecycle.PreStop != nil && p.lifecycle.PreStop.Sleep != nil {
		need += time.Duration(p.lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if need > time.Duration(grace)*time.Second {
		return []string{fmt.Sprintf("terminationGracePeriodSeconds %d is shorter than the sidecar's shutdown (%s: preStop, then the drain): "+
			"the proxy is killed before it has drained", grace, need)}
	}
	return nil
}
