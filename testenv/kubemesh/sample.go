package kubemesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

const (
	// SampleNamespace is where the sample application runs: its config's namespace.
	SampleNamespace = "default"
	// samplePort is the port of every sample Service (the bookinfo calls' URLs name it); the
	// pods listen on their PodSpec's Port (8080), a port of its own as the local mesh wants.
	samplePort = 9080
	// sampleServicesFile is the sample config's ServiceEntries, which Services replace here.
	sampleServicesFile = "services.yaml"
	defaultDrain       = 2 * time.Second
)

// Sample is the sample application as Kubernetes objects: localmesh.Bookinfo()'s pods as
// Deployments (one replica each, named <app>-<version>) with their sidecars, a Service per
// app, and the sample config (testenv/samples/bookinfo but its ServiceEntries) rendered.
type Sample struct {
	// Waves are the Deployments in the order they are applied: those whose application
	// calls another service before it serves (StartupCall) after the others are available,
	// as `make run` starts them (otherwise they crash until their callee is ready, and the
	// node's restart back-off holds them longer).
	Waves    [][]*appsv1.Deployment
	Services []*corev1.Service
	// ConfigDir holds the rendered Istio config, for kubectl apply -f.
	ConfigDir string
}

// Sample builds the sample's objects and renders its config into the mesh's directory.
func (m *Mesh) Sample() (*Sample, error) {
	s := &Sample{ConfigDir: filepath.Join(m.dir, "sample-config")}
	if err := m.renderSampleConfig(s.ConfigDir); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	s.Waves = make([][]*appsv1.Deployment, 2)
	for _, spec := range localmesh.Bookinfo() {
		d, err := m.deployment(spec)
		if err != nil {
			return nil, err
		}
		wave := 0
		if spec.StartupCall != "" {
			wave = 1
		}
		s.Waves[wave] = append(s.Waves[wave], d)
		app := spec.Labels["app"]
		if seen[app] {
			continue
		}
		seen[app] = true
		// Istio selects the protocol by the port's name: http, or tcp-mongo for the database.
		port := corev1.ServicePort{Name: "http", Port: samplePort, TargetPort: intstr.FromString("http")}
		if spec.TCP {
			port = corev1.ServicePort{Name: "tcp-" + app, Port: int32(spec.Port), TargetPort: intstr.FromString("tcp")}
		}
		s.Services = append(s.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: SampleNamespace, Labels: map[string]string{"app": app}},
			Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": app}, Ports: []corev1.ServicePort{port}},
		})
	}
	return s, nil
}

func (m *Mesh) renderSampleConfig(dir string) error {
	entries, err := os.ReadDir(m.opts.SampleDir)
	if err != nil {
		return fmt.Errorf("kubemesh: sample config: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || e.Name() == sampleServicesFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.opts.SampleDir, e.Name()))
		if err != nil {
			return err
		}
		if b, err = localmesh.RenderConfig(e.Name(), string(b), m.opts.WasmDir); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// deployment is a pod of the local mesh's sample as a Deployment of one replica running
// echo as the local mesh runs it, with its sidecar.
func (m *Mesh) deployment(spec localmesh.PodSpec) (*appsv1.Deployment, error) {
	lbl := map[string]string{"version": "v1"}
	for k, v := range spec.Labels {
		lbl[k] = v
	}
	port := spec.Port
	if port == 0 {
		port = 8080
	}
	drain := spec.TerminationDrainDuration
	if drain == 0 {
		drain = defaultDrain
	}
	args := []string{"--listen=$(WASMESH_LOCALHOST):" + strconv.Itoa(port), "--service=" + lbl["app"], "--version=" + lbl["version"],
		"--pod=$(POD_NAME)", "--outboundAddress=$(WASMESH_LOCALHOST)",
		// Serving a second past the proxy's drain, as the local mesh's applications do.
		"--shutdownDelay=" + (drain + time.Second).String()}
	for _, c := range spec.Calls {
		args = append(args, "--call="+c)
	}
	if spec.StartupCall != "" {
		args = append(args, "--startupCall="+spec.StartupCall)
	}
	portName, probe := "http", corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(port)}}
	if spec.TCP {
		args = append(args, "--tcp")
		portName, probe = "tcp", corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}
	}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: lbl},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "app", Image: "wasmesh/echo:latest", Args: args,
			Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			Ports:          []corev1.ContainerPort{{Name: portName, ContainerPort: int32(port)}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: probe},
		}}},
	}
	// The injector (the namespace is labelled istio-injection=enabled) adds the sidecar; the
	// pod says its drain and whether the application waits for the proxy, in its proxy config.
	pc, err := json.Marshal(map[string]any{"terminationDrainDuration": drain.String(),
		"holdApplicationUntilProxyStarts": spec.HoldApplicationUntilProxyStarts})
	if err != nil {
		return nil, err
	}
	tmpl.Annotations = map[string]string{"proxy.istio.io/config": string(pc)}
	for k, v := range spec.Annotations {
		tmpl.Annotations[k] = v
	}
	one := int32(1)
	selector := map[string]string{"app": lbl["app"], "version": lbl["version"]}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: lbl["app"] + "-" + lbl["version"], Namespace: SampleNamespace, Labels: selector},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: selector}, Template: tmpl,
			Strategy: appsv1.DeploymentStrategy{RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptrTo(intstr.FromInt(0)), MaxSurge: ptrTo(intstr.FromInt(1))}}},
	}, nil
}

func ptrTo[T any](v T) *T { return &v }

// ApplySample applies the sample: injection on in its namespace (the label
// istio-injection=enabled), its Istio config (kubectl apply), its Services, then its
// Deployments wave by wave, each wave once the one before is available. It returns once
// the last wave is created; WaitFirstRequest waits for the traffic.
func (m *Mesh) ApplySample(ctx context.Context, s *Sample) error {
	if _, err := m.Kubectl(ctx, "label", "namespace", SampleNamespace, "istio-injection=enabled", "--overwrite"); err != nil {
		return err
	}
	if _, err := m.Kubectl(ctx, "apply", "-f", s.ConfigDir); err != nil {
		return err
	}
	for _, svc := range s.Services {
		if _, err := m.Cluster.Client.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("kubemesh: creating Service %s: %w", svc.Name, err)
		}
	}
	for i, wave := range s.Waves {
		if i > 0 {
			if err := m.WaitAvailable(ctx, s.Waves[i-1]...); err != nil {
				return err
			}
		}
		for _, d := range wave {
			if _, err := m.Cluster.Client.AppsV1().Deployments(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("kubemesh: creating Deployment %s: %w", d.Name, err)
			}
		}
	}
	return nil
}

// WaitAvailable waits until each Deployment has its replicas, all updated and ready, and
// no old pod left.
func (m *Mesh) WaitAvailable(ctx context.Context, ds ...*appsv1.Deployment) error {
	for _, d := range ds {
		if err := m.waitFor(ctx, 3*time.Minute, "Deployment "+d.Namespace+"/"+d.Name+" to be available", func() error {
			return m.rolledOut(ctx, d.Namespace, d.Name)
		}, d.Namespace); err != nil {
			return err
		}
	}
	return nil
}

// WaitRolledOut waits until the Deployment's rollout is complete and no pod of an older
// revision or a scaled-down replica is left, even terminating.
func (m *Mesh) WaitRolledOut(ctx context.Context, ns, name string) error {
	return m.waitFor(ctx, 3*time.Minute, "Deployment "+ns+"/"+name+" to be rolled out", func() error {
		if err := m.rolledOut(ctx, ns, name); err != nil {
			return err
		}
		d, err := m.Cluster.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pods, err := m.pods(ctx, ns, labels.Set(d.Spec.Selector.MatchLabels))
		if err != nil {
			return err
		}
		if len(pods) != int(*d.Spec.Replicas) {
			return fmt.Errorf("%d pods for %d replicas", len(pods), *d.Spec.Replicas)
		}
		return nil
	}, ns)
}

// rolledOut is nil once the Deployment's rollout is complete, as `kubectl rollout status`
// judges it, with every replica ready.
func (m *Mesh) rolledOut(ctx context.Context, ns, name string) error {
	d, err := m.Cluster.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	st := d.Status
	if st.ObservedGeneration < d.Generation || st.UpdatedReplicas != want || st.Replicas != want || st.ReadyReplicas != want || st.AvailableReplicas != want {
		return fmt.Errorf("generation %d observed %d; %d replicas wanted: %d updated, %d in all, %d ready, %d available",
			d.Generation, st.ObservedGeneration, want, st.UpdatedReplicas, st.Replicas, st.ReadyReplicas, st.AvailableReplicas)
	}
	return nil
}

// FrontURL is the URL of path on a ready productpage pod's inbound listener (its sidecar),
// where the sample's traffic enters the mesh; "" while there is none.
func (m *Mesh) FrontURL(ctx context.Context, path string) string {
	pods, err := m.pods(ctx, SampleNamespace, labels.Set{"app": "productpage"})
	if err != nil {
		return ""
	}
	for _, p := range pods {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" && podReady(&p) {
			return "http://" + net.JoinHostPort(p.Status.PodIP, "8080") + path
		}
	}
	return ""
}

// ProxyAdminURL is a URL on the admin API (port 15000) of the pod's sidecar, on the pod's
// private localhost; "" when the pod has no IP on the mesh's node.
func (m *Mesh) ProxyAdminURL(pod *corev1.Pod, path string) string {
	host := m.Node.Localhost(pod.Status.PodIP)
	if host == "" {
		return ""
	}
	return "http://" + net.JoinHostPort(host, "15000") + path
}

// WaitFirstRequest waits until a request to the front end succeeds through the mesh (the
// front end's sidecar, the application, its call to reviews through the sidecars, and
// reviews' to ratings) and returns when it did.
func (m *Mesh) WaitFirstRequest(ctx context.Context, timeout time.Duration) (time.Time, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	var at time.Time
	err := m.waitFor(ctx, timeout, "the first successful request through the mesh", func() error {
		url := m.FrontURL(ctx, "/")
		if url == "" {
			return errors.New("no ready productpage pod")
		}
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		at = time.Now()
		return nil
	}, SampleNamespace)
	return at, err
}
