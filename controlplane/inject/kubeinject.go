package inject

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	meshconfig "istio.io/api/mesh/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// KubeOptions configure KubeInject.
type KubeOptions struct {
	Config *Config                // DefaultConfig when nil
	Mesh   *meshconfig.MeshConfig // defaults when nil
	// NativeSidecars: the proxy is a native sidecar unless the values or the pod say.
	NativeSidecars bool
	// Warn receives what the user should know about a workload (nil: dropped).
	Warn func(string)
}

// KubeInject is istioctl kube-inject: it reads Kubernetes objects in multi-document YAML
// (or JSON) and writes them with the sidecar injected into every pod they make: Pods,
// Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs, with the template
// the webhook uses (the namespace's policy is not known offline: a pod is injected unless
// it opts out). Other objects are written unchanged; an object that cannot be injected is
// an error naming it, and nothing is written past it.
func KubeInject(opts KubeOptions, in io.Reader, out io.Writer) error {
	if opts.Config == nil {
		opts.Config = DefaultConfig()
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(in))
	first := true
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		res, err := injectDocument(opts, doc)
		if err != nil {
			return fmt.Errorf("document %d: %w", n, err)
		}
		if !first {
			if _, err := io.WriteString(out, "---\n"); err != nil {
				return err
			}
		}
		first = false
		if _, err := out.Write(res); err != nil {
			return err
		}
	}
}

// stripComments drops the YAML comment lines of a document (a document of comments only
// is empty).
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

// podHolder is an object that makes pods: where its pod template is.
type podHolder struct {
	obj      any
	meta     *metav1.ObjectMeta
	template *corev1.PodTemplateSpec // nil for a Pod
	pod      *corev1.Pod             // a Pod itself
}

// holderFor decodes a document of a kind that makes pods (ok false for other kinds).
func holderFor(typ metav1.TypeMeta, doc []byte) (h podHolder, ok bool, err error) {
	switch typ.GroupVersionKind().GroupKind().String() {
	case "Pod":
		p := &corev1.Pod{}
		h = podHolder{obj: p, meta: &p.ObjectMeta, pod: p}
	case "Deployment.apps":
		d := &appsv1.Deployment{}
		h = podHolder{obj: d, meta: &d.ObjectMeta, template: &d.Spec.Template}
	case "StatefulSet.apps":
		s := &appsv1.StatefulSet{}
		h = podHolder{obj: s, meta: &s.ObjectMeta, template: &s.Spec.Template}
	case "DaemonSet.apps":
		s := &appsv1.DaemonSet{}
		h = podHolder{obj: s, meta: &s.ObjectMeta, template: &s.Spec.Template}
	case "ReplicaSet.apps":
		s := &appsv1.ReplicaSet{}
		h = podHolder{obj: s, meta: &s.ObjectMeta, template: &s.Spec.Template}
	case "Job.batch":
		j := &batchv1.Job{}
		h = podHolder{obj: j, meta: &j.ObjectMeta, template: &j.Spec.Template}
	case "CronJob.batch":
		c := &batchv1.CronJob{}
		h = podHolder{obj: c, meta: &c.ObjectMeta, template: &c.Spec.JobTemplate.Spec.Template}
	default:
		return h, false, nil
	}
	if err := yaml.UnmarshalStrict(doc, h.obj); err != nil {
		return h, true, fmt.Errorf("%s: %w", typ.Kind, err)
	}
	return h, true, nil
}

// injectDocument injects one document's pods; a document of another kind comes back as it
// was.
func injectDocument(opts KubeOptions, doc []byte) ([]byte, error) {
	var typ metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &typ); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	h, ok, err := holderFor(typ, doc)
	if err != nil || !ok {
		if err == nil && !bytes.HasSuffix(doc, []byte("\n")) {
			doc = append(doc, '\n')
		}
		return doc, err
	}
	name := typ.Kind + " " + h.meta.Namespace + "/" + h.meta.Name
	if h.meta.Namespace == "" {
		name = typ.Kind + " " + h.meta.Name
	}
	pod, wl := h.pod, Workload{Name: h.meta.Name, Namespace: h.meta.Namespace, APIVersion: typ.APIVersion, Kind: typ.Kind}
	if pod == nil {
		pod = &corev1.Pod{ObjectMeta: *h.template.ObjectMeta.DeepCopy(), Spec: *h.template.Spec.DeepCopy()}
		pod.Namespace = h.meta.Namespace
	} else {
		wl = WorkloadOfPod(pod)
	}
	res, err := Inject(opts.Config, opts.Mesh, Input{Pod: pod, Namespace: h.meta.Namespace, Workload: wl,
		NativeSidecars: opts.NativeSidecars, Offline: true})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, w := range res.Warnings {
		if opts.Warn != nil {
			opts.Warn(name + ": " + w)
		}
	}
	if res.Pod != nil {
		if h.pod != nil {
			*h.pod = *res.Pod
		} else {
			ns := h.template.Namespace
			h.template.ObjectMeta, h.template.Spec = res.Pod.ObjectMeta, res.Pod.Spec
			h.template.Namespace = ns
		}
	}
	return yaml.Marshal(h.obj)
}
